//! Property tests of the copy engines and dispatchers against a reference copy, with poisoned
//! guard bytes around the destination. Ordinary memory stands in for the BAR: what is checked is
//! the data and the access plan, not PCIe behaviour.

use super::kernel::{ExportFn, FencedFn};
use super::plan::{Op, plan_wc};
use super::*;

/// xorshift64* — small, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

const GUARD: usize = 64;
/// Largest copy the buffers hold (64 KiB + one odd page + slack).
const MAX_LEN: usize = 64 * 1024 + 4096 + 257;

/// A 4096-aligned window of a `Vec`, so offsets are relative to a known alignment.
struct Buf {
    v: Vec<u8>,
    base: usize,
}

impl Buf {
    fn new() -> Self {
        let v = vec![0u8; MAX_LEN + 2 * GUARD + 64 + 8192];
        let base = v.as_ptr().align_offset(4096);
        assert!(base < 4096);
        Buf { v, base }
    }
    /// The bytes `[GUARD + off - GUARD, GUARD + off + len + GUARD)` relative to the aligned base.
    fn window(&mut self, off: usize, len: usize) -> &mut [u8] {
        let start = self.base + 4096 - GUARD + off;
        &mut self.v[start..start + len + 2 * GUARD]
    }
    fn ptr(&mut self, off: usize) -> *mut u8 {
        let i = self.base + 4096 + off;
        self.v[i..].as_mut_ptr()
    }
}

struct Harness {
    rng: Rng,
    dev: Buf,
    host: Buf,
    expect_dst: Vec<u8>,
    expect_src: Vec<u8>,
}

impl Harness {
    fn new(seed: u64) -> Self {
        Harness {
            rng: Rng::new(seed),
            dev: Buf::new(),
            host: Buf::new(),
            expect_dst: Vec::new(),
            expect_src: Vec::new(),
        }
    }

    /// Fills source and destination windows with random bytes (the destination's are the
    /// poison), runs `copy(dst, src, len)`, and checks the destination window equals the poison
    /// with `[GUARD, GUARD + len)` replaced by the source bytes, and the source is untouched.
    fn case(
        &mut self,
        dir: Direction,
        dev_off: usize,
        host_off: usize,
        len: usize,
        what: &str,
        copy: &mut dyn FnMut(*mut u8, *const u8, usize),
    ) {
        let (dst_buf, dst_off, src_buf, src_off) = match dir {
            Direction::ToDevice => (&mut self.dev, dev_off, &mut self.host, host_off),
            Direction::FromDevice => (&mut self.host, host_off, &mut self.dev, dev_off),
        };
        let sw = src_buf.window(src_off, len);
        self.rng.fill(sw);
        self.expect_src.clear();
        self.expect_src.extend_from_slice(sw);
        let dw = dst_buf.window(dst_off, len);
        self.rng.fill(dw);
        self.expect_dst.clear();
        self.expect_dst.extend_from_slice(dw);
        self.expect_dst[GUARD..GUARD + len].copy_from_slice(&self.expect_src[GUARD..GUARD + len]);

        let d = dst_buf.ptr(dst_off);
        let s = src_buf.ptr(src_off);
        copy(d, s, len);

        let got = dst_buf.window(dst_off, len);
        if got != &self.expect_dst[..] {
            let first = got.iter().zip(&self.expect_dst).position(|(a, b)| a != b).unwrap();
            let place = if first < GUARD {
                "guard before"
            } else if first >= GUARD + len {
                "guard after"
            } else {
                "data"
            };
            panic!(
                "{what} {dir:?}: len {len} dev_off {dev_off} host_off {host_off}: first wrong byte \
                 at window index {first} ({place}): got {:#04x} want {:#04x}",
                got[first], self.expect_dst[first]
            );
        }
        assert!(
            src_buf.window(src_off, len) == &self.expect_src[..],
            "{what} {dir:?}: source modified (len {len} dev_off {dev_off} host_off {host_off})"
        );
    }
}

fn dispatch(kind: MappingKind, dir: Direction) -> impl FnMut(*mut u8, *const u8, usize) {
    move |d, s, n| match dir {
        // SAFETY: the harness passes pointers into its own buffers, valid for n bytes, disjoint.
        Direction::ToDevice => unsafe { copy_to_mapping(kind, d, s, n) },
        // SAFETY: as above.
        Direction::FromDevice => unsafe { copy_from_mapping(kind, d, s, n) },
    }
}

const KINDS: [MappingKind; 3] = [MappingKind::WriteCombined, MappingKind::Cached, MappingKind::Device];
const DIRS: [Direction; 2] = [Direction::ToDevice, Direction::FromDevice];

#[test]
fn copy_dispatch_exhaustive_small_sizes() {
    let mut h = Harness::new(1);
    // (device offset, host offset) pairs covering every 16/32/64 alignment class of the device
    // side, with aligned and unaligned host sides.
    let offs = [(0, 0), (1, 0), (8, 3), (15, 1), (16, 16), (33, 7), (48, 63), (63, 32)];
    // With the engine selection made, as after `gdr_open` (large loads then take their
    // lines-last path, which needs it).
    let _ = select::get();
    for kind in KINDS {
        for dir in DIRS {
            let mut f = dispatch(kind, dir);
            for &(dev_off, host_off) in &offs {
                for len in 0..=4096 {
                    h.case(dir, dev_off, host_off, len, &format!("{kind:?}"), &mut f);
                }
            }
        }
    }
}

#[test]
fn copy_dispatch_random_sizes_and_offsets() {
    let mut h = Harness::new(2);
    for i in 0..3000 {
        let kind = KINDS[i % 3];
        let dir = DIRS[(i / 3) % 2];
        let len = match h.rng.below(4) {
            0 => h.rng.below(300),
            1 => h.rng.below(8192),
            _ => h.rng.below(MAX_LEN + 1),
        };
        let dev_off = h.rng.below(64);
        let host_off = h.rng.below(64);
        let mut f = dispatch(kind, dir);
        h.case(dir, dev_off, host_off, len, &format!("{kind:?}"), &mut f);
    }
}

#[test]
fn copy_every_engine_exhaustive_and_random() {
    let all = engines();
    assert!(all.iter().any(|e| e.dir == Direction::ToDevice));
    assert!(all.iter().any(|e| e.dir == Direction::FromDevice));
    let mut h = Harness::new(3);
    for e in &all {
        let mut f = |d: *mut u8, s: *const u8, n: usize| {
            // SAFETY: the callers below give a device offset that is a multiple of e.width
            // (relative to a 4096-aligned base) and a length that is a multiple of e.width, in
            // the harness's own disjoint buffers; the engine is listed, so the CPU supports it.
            unsafe { (e.f)(d, s, n) }
        };
        let what = format!("engine {} ({}B)", e.name, e.width);
        // Exhaustive: every legal length up to 4096, device offsets at each width multiple in a
        // 64-byte line, host offsets aligned and not.
        for dev_off in (0..64).step_by(e.width.max(8)) {
            for host_off in [0, 1, 13, 32] {
                for len in (0..=4096).step_by(e.width) {
                    h.case(e.dir, dev_off, host_off, len, &what, &mut f);
                }
            }
        }
        // Random larger lengths and offsets.
        for _ in 0..200 {
            let len = h.rng.below(MAX_LEN / e.width + 1) * e.width;
            let dev_off = h.rng.below(64 / e.width.min(64)) * e.width % 64;
            let host_off = h.rng.below(64);
            h.case(e.dir, dev_off, host_off, len, &what, &mut f);
        }
    }
}

/// The fenced twins of the load kernels (the selected one is what the public fast path jumps to
/// at the end of a load) copy what their kernels copy, on the line slot's contract, and return 0.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_fenced_line_loads_copy_as_their_kernels_and_return_zero() {
    use super::x86;
    assert!(super::select::get().load_line_fenced.is_some(), "x86-64 selects a fenced line load");
    let mut twins: Vec<(&str, FencedFn)> = vec![("SSE2", x86::load_sse2_fenced)];
    if std::arch::is_x86_feature_detected!("sse4.1") {
        twins.push(("SSE4.1", x86::load_sse41_fenced));
    }
    if std::arch::is_x86_feature_detected!("avx2") {
        twins.push(("AVX2", x86::load_avx2_fenced));
    }
    if super::select::get().engines.iter().any(|e| e.name == super::select::REALIGN_NAME) {
        twins.push(("AVX2 + VBMI realign", x86::load_avx2_realign_fenced));
    }
    let mut h = Harness::new(5);
    for (name, fenced) in twins {
        let what = format!("fenced {name} line load");
        let mut returned = Vec::new();
        let mut f = |d: *mut u8, s: *const u8, n: usize| {
            // SAFETY: whole 64-byte lines at a 64-aligned device offset (below), in the harness's
            // own disjoint buffers: the line slot's contract; the CPU has the twin's features.
            returned.push(unsafe { fenced(d, s, n) });
        };
        for host_off in [0, 1, 13, 32] {
            for len in (0..=4096).step_by(64) {
                h.case(Direction::FromDevice, 0, host_off, len, &what, &mut f);
            }
        }
        for _ in 0..100 {
            let len = h.rng.below(MAX_LEN / 64 + 1) * 64;
            let host_off = h.rng.below(64);
            h.case(Direction::FromDevice, 0, host_off, len, &what, &mut f);
        }
        assert!(!returned.is_empty() && returned.iter().all(|&r| r == 0), "{what}: every call returns 0");
    }
}

/// The realigning line load (selected where the CPU has AVX-512 VBMI) at every host offset in a
/// line: the aligned ones take the plain loop, the others the realigning one, whose first and last
/// stores overlap its aligned ones.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_realigning_line_load_copies_at_every_host_offset() {
    let Some(e) = engines().into_iter().find(|e| e.name == super::select::REALIGN_NAME) else {
        println!("SKIP the_realigning_line_load_copies_at_every_host_offset: no realigning line load {NO_VBMI}");
        return;
    };
    let mut h = Harness::new(6);
    let mut f = |d: *mut u8, s: *const u8, n: usize| {
        // SAFETY: whole lines at a 64-aligned device offset in the harness's own disjoint
        // buffers; the engine is listed, so the CPU has its features.
        unsafe { (e.f)(d, s, n) }
    };
    for host_off in 0..64 {
        for len in (0..=1024).step_by(64).chain([4096, 4160, 8192]) {
            h.case(Direction::FromDevice, 0, host_off, len, e.name, &mut f);
        }
    }
}

/// Why a VBMI test skipped, for its SKIP line.
#[cfg(target_arch = "x86_64")]
const NO_VBMI: &str = "(the CPU has no AVX-512 VBMI, or GDRCOPY_COPY_NO_AVX512=1)";

/// The whole-load functions of this CPU's selection, or `None` after printing the SKIP line of
/// `test` (the CPU has no AVX-512 VBMI, or it is turned off).
#[cfg(target_arch = "x86_64")]
fn whole_loads_or_skip(test: &str) -> Option<super::select::WholeLoads> {
    let whole = super::select::get().whole_loads;
    if whole.is_none() {
        println!("SKIP {test}: no span or whole load {NO_VBMI}");
    }
    whole
}

/// A copy function for the harness that calls one whole-load function's three entries in turn,
/// by length (the dispatcher's, the fenced one, the one with the public copy call's arguments),
/// each of which must return 0.
#[cfg(target_arch = "x86_64")]
fn taking_turns(entries: super::select::WholeLoad, from_export: ExportFn) -> impl FnMut(*mut u8, *const u8, usize) {
    move |d, s, n| {
        // SAFETY: the harness's own disjoint buffers, n at least what the function takes (each
        // test's lengths); selected, so the CPU has what it needs.
        let r = unsafe {
            match n % 3 {
                0 => (entries.unfenced)(d, s, n),
                1 => (entries.fenced)(d, s, n),
                _ => from_export(0x5eed, d as usize, s as usize, n),
            }
        };
        assert_eq!(r, 0);
    }
}

/// The span load (any length, any offsets; selected where the CPU has AVX-512 VBMI) at every pair
/// of device and host offsets in a line, every length to three lines and some longer ones, plus
/// host ranges whose last store would cross a page boundary (its two-store path), with the
/// bytes around each host range left alone. Its three entries take turns by length: the
/// dispatcher's, the fenced one and the one with the public copy call's arguments (which the
/// fast path jumps to); that last one then alone at every length below 16.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_span_load_copies_at_every_offset_pair() {
    let Some(whole) = whole_loads_or_skip("the_span_load_copies_at_every_offset_pair") else {
        return;
    };
    let mut h = Harness::new(7);
    let mut f = taking_turns(whole.span, whole.span_from_export);
    for dev_off in 0..64 {
        for host_off in 0..64 {
            for len in (1..=192).chain([255, 256, 257, 1000, 4097]) {
                h.case(Direction::FromDevice, dev_off, host_off, len, "span load", &mut f);
            }
        }
    }
    for host_off in [4096 - 64, 4096 - 40, 4096 - 3, 4096 + 5] {
        for len in [1, 3, 8, 40, 64, 100, 300] {
            h.case(Direction::FromDevice, 7, host_off - len.min(host_off) / 2, len, "span load", &mut f);
        }
    }
    // The entry with the public copy call's arguments, which the fast path's loads below 16
    // bytes jump to, at every such length (the turns above give it every third), including host
    // ranges that end near a page boundary.
    let mut export = |d: *mut u8, s: *const u8, n: usize| {
        // SAFETY: the harness's own disjoint buffers, valid for n bytes; selected, so the CPU
        // has what the entry needs.
        assert_eq!(unsafe { (whole.span_from_export)(0x5eed, d as usize, s as usize, n) }, 0);
    };
    for dev_off in 0..64 {
        for host_off in (0..64).chain((4096 - 31)..(4096 + 1)) {
            for len in 1..16 {
                h.case(Direction::FromDevice, dev_off, host_off, len, "span entry", &mut export);
            }
        }
    }
}

/// The SSE4.1 load inside one aligned 16-byte chunk (the fast path's loads below 16 bytes where
/// the CPU has no span load): every device offset in a line, every length that keeps the range in
/// its chunk, host offsets aligned and not, the bytes around the host range left alone.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_sse41_chunk_load_copies_every_range_inside_a_chunk() {
    if !(std::arch::is_x86_feature_detected!("sse4.1") && std::arch::is_x86_feature_detected!("ssse3")) {
        println!("SKIP the_sse41_chunk_load_copies_every_range_inside_a_chunk: the CPU has no SSE4.1 or SSSE3");
        return;
    }
    let mut h = Harness::new(10);
    // SAFETY: the harness's own disjoint buffers, valid for n bytes; the range stays inside its
    // chunk (the loops' bounds); the CPU has the features (tested above).
    let mut f = |d: *mut u8, s: *const u8, n: usize| unsafe { x86::load_in_chunk_sse41(d, s, n) };
    for dev_off in 0..64 {
        for host_off in [0, 1, 3, 7, 8, 13, 4096 - 9] {
            for len in 1..=(16 - dev_off % 16).min(15) {
                h.case(Direction::FromDevice, dev_off, host_off, len, "SSE4.1 chunk load", &mut f);
            }
        }
    }
}

/// The whole-load function (VBMI; used from `select::SPAN_MAX` bytes) through each of its three
/// entries in turn (the dispatcher's, the fenced one, the one with the public copy call's
/// arguments), at every device offset in a line, host offsets of every relation to it, host
/// ranges whose first or last 64 bytes cross a page, and lengths from 128 bytes.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_whole_load_entries_copy_at_every_device_offset() {
    let Some(whole) = whole_loads_or_skip("the_whole_load_entries_copy_at_every_device_offset") else {
        return;
    };
    let mut h = Harness::new(8);
    let mut f = taking_turns(whole.large, whole.large_from_export);
    for dev_off in 0..64 {
        for len in (128..=200).chain([255, 256, 511, 512, 513, 1000, 1024, 2048, 4095, 4096, 4097]) {
            // Same alignment as the device side within 32 bytes or not, both sides of 32; a head
            // store across a page; a tail store across one (the range ends 3 bytes into a page).
            for host_off in [0, 1, 3, 17, 31, 32, 33, 39, 57, 63, 4096 - 30, (4096 + 3 - len) % 4096] {
                h.case(Direction::FromDevice, dev_off, host_off, len, "whole load", &mut f);
            }
        }
    }
}

#[derive(Debug, PartialEq, Eq)]
struct Seg {
    op: Op,
    off: usize,
    len: usize,
}

#[test]
fn copy_plan_follows_the_alignment_rules() {
    for dev_addr in 0..256usize {
        for len in 0..700usize {
            let mut plan: Vec<Seg> = Vec::new();
            plan_wc(dev_addr, len, |op, off, len| plan.push(Seg { op, off, len }));
            assert!(plan.len() <= 7, "{plan:?}");
            let mut next = 0;
            let mut lines = 0;
            for s in &plan {
                assert_eq!(s.off, next, "segments contiguous: {dev_addr} {len} {plan:?}");
                assert!(s.len > 0, "no empty segments: {plan:?}");
                let a = dev_addr + s.off;
                match s.op {
                    Op::Aligned => assert!(s.len < 16, "{plan:?}"),
                    Op::W16 => assert!(a % 16 == 0 && s.len == 16, "{plan:?}"),
                    Op::W32 => assert!(a % 32 == 0 && s.len == 32, "{plan:?}"),
                    Op::Lines => {
                        assert!(a % 64 == 0 && s.len % 64 == 0, "{plan:?}");
                        lines += s.len;
                    }
                }
                next += s.len;
            }
            assert_eq!(next, len, "plan covers the copy: {dev_addr} {len} {plan:?}");
            if len < 16 {
                assert!(plan.iter().all(|s| s.op == Op::Aligned));
            }
            // Every whole 64-byte line inside the range goes through the line slot.
            let first_line = dev_addr.next_multiple_of(64);
            let whole = (dev_addr + len).saturating_sub(first_line) & !63;
            if len >= 16 {
                assert_eq!(lines, whole, "all whole lines in the bulk: {dev_addr} {len} {plan:?}");
            }
        }
    }
}

#[test]
fn copy_helper_accesses_are_naturally_aligned() {
    for addr in 0..64usize {
        for remaining in 1..40usize {
            let w = aligned::step(addr, remaining);
            assert!(w.is_power_of_two() && w <= 8 && w <= remaining, "{addr} {remaining} {w}");
            assert_eq!(addr % w, 0, "{addr} {remaining} {w}");
            // Widest legal choice: doubling would break alignment, the 8-byte cap, or the length.
            assert!(w == 8 || addr % (2 * w) != 0 || 2 * w > remaining, "{addr} {remaining} {w}");
        }
    }
    // A whole aligned range is done with 8-byte accesses only.
    let mut addr = 4096;
    let mut rem = 4096;
    while rem > 0 {
        let w = aligned::step(addr, rem);
        assert_eq!(w, 8);
        addr += w;
        rem -= w;
    }
}

#[test]
fn copy_detect_is_stable_and_selection_consistent() {
    let a = detect();
    let b = detect();
    assert!(core::ptr::eq(a, b), "detect() computes once");
    assert!(a.starts_with("store: ") && a.contains("; load: "), "{a}");
    let all = engines();
    for dir in DIRS {
        let selected: Vec<_> = all.iter().filter(|e| e.dir == dir && e.selected).collect();
        assert!(selected.len() >= 2, "a SIMD engine and the helper are selected for {dir:?}");
        for e in &selected {
            assert!(a.contains(e.name), "summary names selected engine {}: {a}", e.name);
        }
        for e in all.iter().filter(|e| e.dir == dir) {
            assert!(e.width.is_power_of_two() && e.width <= 64, "{e:?}");
        }
    }
    #[cfg(target_arch = "x86_64")]
    {
        // The AVX-512 kernels and MOVDIR64B are listed where present but not selected (see
        // select.rs);
        // the bulk of a store uses non-temporal VMOVNTDQ when the CPU has AVX.
        assert!(all.iter().all(|e| !(e.name.starts_with("AVX-512") && e.selected)));
        let movdir = all.iter().find(|e| e.name == "MOVDIR64B");
        assert_eq!(movdir.is_some(), x86::has_movdir64b());
        assert!(movdir.is_none_or(|m| !m.selected));
        if std::arch::is_x86_feature_detected!("avx") {
            assert!(a.contains("store: 64B-lines AVX VMOVNTDQ"), "{a}");
        }
        if std::arch::is_x86_feature_detected!("sse4.1") {
            assert!(a.contains("16B SSE4.1 MOVNTDQA"), "{a}");
        }
        // With VBMI (and what comes with it) the load line slot realigns misaligned host sides,
        // and whole loads have the large and the span functions (the zmm users); without, none.
        let vbmi = std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
            && std::arch::is_x86_feature_detected!("avx512vbmi")
            && std::arch::is_x86_feature_detected!("bmi2")
            && !super::select::zmm_refused();
        let sel = super::select::get();
        assert_eq!(a.contains(&format!("load: 64B-lines {}", super::select::REALIGN_NAME)), vbmi, "{a}");
        assert_eq!(sel.whole_loads.is_some(), vbmi);
    }
}

#[test]
fn copy_mapping_kind_raw_values() {
    for k in KINDS {
        assert_eq!(MappingKind::from_raw(k.as_raw()), Some(k));
    }
    assert_eq!(MappingKind::WriteCombined.as_raw(), 1);
    assert_eq!(MappingKind::Cached.as_raw(), 2);
    assert_eq!(MappingKind::Device.as_raw(), 3);
    assert_eq!(MappingKind::from_raw(0), None);
    assert_eq!(MappingKind::from_raw(4), None);
}

#[test]
fn copy_fences_run() {
    // Nothing observable on one thread; this checks that the instructions exist on this CPU.
    store_fence();
    full_fence();
}

#[test]
fn copy_helper_pieces_follow_the_step_rule() {
    for addr in 0..64usize {
        for n in 0..80usize {
            let mut want = Vec::new();
            let (mut a, mut rem) = (addr, n);
            while rem > 0 {
                let w = aligned::step(a, rem);
                want.push((a - addr, w));
                a += w;
                rem -= w;
            }
            let mut got = Vec::new();
            aligned::pieces(addr, n, |i, w| got.push((i, w)));
            assert_eq!(got, want, "addr {addr} n {n}");
        }
    }
}

#[test]
fn copy_single_access_is_exactly_the_naturally_aligned_1_2_4_8() {
    for addr in 0..64usize {
        for n in 0..40usize {
            let want = matches!(n, 1 | 2 | 4 | 8) && addr % n == 0;
            assert_eq!(aligned::is_single_access(addr, n), want, "addr {addr} n {n}");
        }
    }
    assert!(!aligned::is_single_access(0, usize::MAX));
    assert!(aligned::is_single_access(usize::MAX - 7, 8));
}

/// Two pages whose neighbours are inaccessible: a load that strays from the pages of its range
/// faults.
struct FencedPages {
    base: *mut u8,
}

impl FencedPages {
    const PAGE: usize = 4096;

    fn new() -> Self {
        // SAFETY: a fresh private anonymous mapping of four pages, then protection changes inside it.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                4 * Self::PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            assert_ne!(p, libc::MAP_FAILED);
            let base = p.cast::<u8>().add(Self::PAGE);
            assert_eq!(libc::mprotect(base.cast(), 2 * Self::PAGE, libc::PROT_READ | libc::PROT_WRITE), 0);
            FencedPages { base }
        }
    }
}

impl Drop for FencedPages {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly what `new` mapped.
        unsafe { libc::munmap(self.base.sub(Self::PAGE).cast(), 4 * Self::PAGE) };
    }
}

#[test]
fn copy_wc_loads_read_only_the_pages_of_their_range() {
    // Loads widen heads and tails to aligned 16-byte chunks; those must never leave the pages the
    // range lies in (a mapping is whole pages, its neighbours may be anything). Ranges that start
    // at the first byte or end at the last byte of the accessible pages, at every misalignment.
    let pages = FencedPages::new();
    let len_all = 2 * FencedPages::PAGE;
    // SAFETY: writes inside the two accessible pages.
    let dev = unsafe { std::slice::from_raw_parts_mut(pages.base, len_all) };
    for (i, b) in dev.iter_mut().enumerate() {
        *b = (i * 7 + 3) as u8;
    }
    let mut host = vec![0u8; 300];
    let _ = select::get();
    for n in 1..=200usize {
        for start in [0, 1, 3, 7, 8, 15] {
            for at_end in [false, true] {
                let off = if at_end { len_all - start - n } else { start };
                host.fill(0xee);
                // SAFETY: [off, off + n) lies in the accessible pages; `host` holds n + 1 bytes.
                unsafe { copy_from_mapping(MappingKind::WriteCombined, host.as_mut_ptr(), pages.base.add(off), n) };
                assert_eq!(&host[..n], &dev[off..off + n], "n {n} off {off}");
                assert_eq!(host[n], 0xee, "nothing written past the range: n {n} off {off}");
            }
        }
    }
}

/// The whole load reads only device lines holding a byte of its range and writes only its host
/// range, with either side flush against an inaccessible page and with host ranges whose end
/// stores cross the page boundary between the accessible pages: the line kernel's masked stores
/// at 64-aligned host lines start before the range and end after it, so a store that wrote a
/// masked byte, or a line read past the range's last line, faults here or shows in the bytes
/// around the range.
#[cfg(target_arch = "x86_64")]
#[test]
fn the_whole_load_stays_inside_the_pages_of_both_ranges() {
    let Some(whole) = whole_loads_or_skip("the_whole_load_stays_inside_the_pages_of_both_ranges") else {
        return;
    };
    let (dev_pages, host_pages) = (FencedPages::new(), FencedPages::new());
    let span = 2 * FencedPages::PAGE;
    // SAFETY: both windows are the two accessible pages of their mappings, which live until the end.
    let (dev, host) = unsafe {
        (std::slice::from_raw_parts_mut(dev_pages.base, span), std::slice::from_raw_parts_mut(host_pages.base, span))
    };
    for (i, b) in dev.iter_mut().enumerate() {
        *b = (i * 13 + 5) as u8;
    }
    let mut f = taking_turns(whole.large, whole.large_from_export);
    for n in [128, 129, 191, 192, 200, 511, 512, 513, 1000, 2048, 4097] {
        for (dev_gap, host_gap) in [(0, 0), (1, 3), (7, 3), (3, 7), (63, 1), (1, 63), (32, 5), (5, 32)] {
            // Host ranges flush against either inaccessible page, and ones whose first or last 64
            // bytes cross the page boundary between the two accessible pages.
            let hosts = [host_gap, span - host_gap - n, 4096 - 5 - host_gap, 4096 + 3 + host_gap - n];
            for (d, h) in [dev_gap, span - dev_gap - n].into_iter().flat_map(|d| hosts.map(|h| (d, h))) {
                host.fill(0xee);
                f(host[h..].as_mut_ptr(), dev[d..].as_ptr(), n);
                let what = format!("n {n} dev {d} host {h}");
                assert_eq!(&host[h..h + n], &dev[d..d + n], "{what}");
                assert!(host[..h].iter().chain(&host[h + n..]).all(|&b| b == 0xee), "nothing written outside: {what}");
            }
        }
    }
}
