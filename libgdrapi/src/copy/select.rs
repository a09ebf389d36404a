//! Run-time engine selection, done once per process (safe code only).
//!
//! A write-combined copy uses three kernel slots per direction (see `plan_wc` in `mod.rs`):
//! `w16` for one 16-byte step, `w32` for one 32-byte step, and `line` for the bulk of whole,
//! 64-byte aligned lines. Any kernel whose width divides the slot's size can fill a slot.
//!
//! Choices on x86-64, from write-combining rules rather than from cached-memory timings:
//! - store `line`: MOVDIR64B when CPUID says so. It writes a line as one 64-byte non-torn write
//!   whatever the memory type, so a line never leaves the core as partial writes even if a WC
//!   buffer would have been evicted early. Otherwise AVX VMOVNTDQ (two per line), else SSE2
//!   MOVNTDQ (four per line): both are non-temporal, never read the line for ownership, and a
//!   line filled back to back leaves as one WC-buffer flush.
//! - store `w32`/`w16`: AVX VMOVNTDQ / SSE2 MOVNTDQ (NT stores for the partial lines at the ends).
//! - load `line`/`w32`: AVX2 VMOVNTDQA, else the 16-byte slot; load `w16`: SSE4.1 MOVNTDQA, else
//!   SSE2 MOVDQA (the only option on CPUs without streaming loads).
//!
//! AVX-512 (zmm VMOVNTDQ / VMOVNTDQA) is implemented, listed by `engines()` and benchmarked, but
//! deliberately not selected, as upstream 2.6 does not select it either:
//! - it buys nothing on the bus: a line filled by four 16-byte or two 32-byte NT stores in a row
//!   leaves the core as one 64-byte WC flush just like one zmm store, and where a single-instruction
//!   64-byte write matters, MOVDIR64B (selected when present) is the instruction that guarantees
//!   it; for reads, the first streaming load of a line brings the whole line into a streaming-load
//!   buffer that serves the other loads of that line, so ymm loads already read each line once;
//! - it can cost the whole application: on Skylake-SP/Cascade Lake class Xeons, 512-bit
//!   instructions move the core to a lower frequency licence for some time after use, which a
//!   library called for small copies by latency-sensitive consumers (NCCL, UCX, MPI) must not
//!   impose; on AMD Zen 4 zmm operations are executed as two 256-bit halves, so there is no
//!   throughput to gain either.
//!
//! The benchmark (`benches/copy_engines.rs`) times these kernels so the choice can be revisited
//! with measurements on a real BAR.

use super::{Direction, Engine, KernelFn};
use std::sync::OnceLock;

/// Kernels for the three slots of one direction.
#[derive(Clone, Copy)]
pub(crate) struct Slots {
    pub(crate) w16: KernelFn,
    pub(crate) w32: KernelFn,
    pub(crate) line: KernelFn,
}

/// Everything decided at detection time.
pub(crate) struct Selection {
    pub(crate) store: Slots,
    pub(crate) load: Slots,
    pub(crate) engines: Vec<Engine>,
    pub(crate) summary: String,
}

static SELECTION: OnceLock<Selection> = OnceLock::new();

/// The process-wide selection, computed on first use.
pub(crate) fn get() -> &'static Selection {
    SELECTION.get_or_init(build)
}

/// Marks the engine named `name` in `dir` as selected and returns it. Panics only on a
/// programming error (a name not registered), which the unit tests exercise.
fn pick(all: &mut [Engine], dir: Direction, names: &[&'static str]) -> Engine {
    for name in names {
        if let Some(e) = all.iter_mut().find(|e| e.dir == dir && e.name == *name) {
            e.selected = true;
            return *e;
        }
    }
    panic!("copy engine selection: none of {names:?} registered");
}

const fn engine(name: &'static str, dir: Direction, width: usize, f: KernelFn) -> Engine {
    Engine { name, dir, width, f, selected: false }
}

fn helpers() -> [Engine; 2] {
    [
        engine(HELPER_NAME, Direction::ToDevice, 1, super::aligned::to_device),
        engine(HELPER_NAME, Direction::FromDevice, 1, super::aligned::from_device),
    ]
}

/// Name of the aligned-access helper (heads, tails and copies under 16 bytes).
pub(crate) const HELPER_NAME: &str = "aligned 1-8B";

fn describe(store: [&str; 3], load: [&str; 3], extra: &str) -> String {
    format!(
        "store: 64B-lines {}, 32B {}, 16B {}, <16B {HELPER_NAME}; \
         load: 64B-lines {}, 32B {}, 16B {}, <16B {HELPER_NAME}; {extra}",
        store[0], store[1], store[2], load[0], load[1], load[2]
    )
}

#[cfg(target_arch = "x86_64")]
fn build() -> Selection {
    use super::x86;
    use Direction::{FromDevice, ToDevice};

    let sse41 = std::arch::is_x86_feature_detected!("sse4.1");
    let avx = std::arch::is_x86_feature_detected!("avx");
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let avx512f = std::arch::is_x86_feature_detected!("avx512f");
    let movdir64b = x86::has_movdir64b();

    let mut all: Vec<Engine> = Vec::new();
    all.push(engine("SSE2 MOVNTDQ", ToDevice, 16, x86::store_sse2));
    if avx {
        all.push(engine("AVX VMOVNTDQ", ToDevice, 32, x86::store_avx));
    }
    if avx512f {
        all.push(engine("AVX-512 VMOVNTDQ", ToDevice, 64, x86::store_avx512));
    }
    if movdir64b {
        all.push(engine("MOVDIR64B", ToDevice, 64, x86::store_movdir64b));
    }
    all.push(engine("SSE2 MOVDQA", FromDevice, 16, x86::load_sse2));
    if sse41 {
        all.push(engine("SSE4.1 MOVNTDQA", FromDevice, 16, x86::load_sse41));
    }
    if avx2 {
        all.push(engine("AVX2 VMOVNTDQA", FromDevice, 32, x86::load_avx2));
    }
    if avx512f {
        all.push(engine("AVX-512 VMOVNTDQA", FromDevice, 64, x86::load_avx512));
    }
    all.extend(helpers());

    let s16 = pick(&mut all, ToDevice, &["SSE2 MOVNTDQ"]);
    let s32 = pick(&mut all, ToDevice, &["AVX VMOVNTDQ", "SSE2 MOVNTDQ"]);
    let sline = pick(&mut all, ToDevice, &["MOVDIR64B", "AVX VMOVNTDQ", "SSE2 MOVNTDQ"]);
    let l16 = pick(&mut all, FromDevice, &["SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    let l32 = pick(&mut all, FromDevice, &["AVX2 VMOVNTDQA", "SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    let lline = pick(&mut all, FromDevice, &["AVX2 VMOVNTDQA", "SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    // Mark the helpers as selected too: they serve every head and tail.
    pick(&mut all, ToDevice, &[HELPER_NAME]);
    pick(&mut all, FromDevice, &[HELPER_NAME]);

    let flag = |b: bool, n: &str| if b { format!(" {n}") } else { String::new() };
    let extra = format!(
        "cpu:{}{}{}{}{}{}",
        " sse2",
        flag(sse41, "sse4.1"),
        flag(avx, "avx"),
        flag(avx2, "avx2"),
        flag(avx512f, "avx512f (not selected)"),
        flag(movdir64b, "movdir64b"),
    );
    Selection {
        store: Slots { w16: s16.f, w32: s32.f, line: sline.f },
        load: Slots { w16: l16.f, w32: l32.f, line: lline.f },
        summary: describe(
            [sline.name, s32.name, s16.name],
            [lline.name, l32.name, l16.name],
            &extra,
        ),
        engines: all,
    }
}

#[cfg(target_arch = "aarch64")]
fn build() -> Selection {
    use super::arm;
    use Direction::{FromDevice, ToDevice};

    let mut all = vec![
        engine("NEON 16B", ToDevice, 16, arm::store_neon),
        engine("NEON 16B", FromDevice, 16, arm::load_neon),
    ];
    all.extend(helpers());
    let s = pick(&mut all, ToDevice, &["NEON 16B"]);
    let l = pick(&mut all, FromDevice, &["NEON 16B"]);
    pick(&mut all, ToDevice, &[HELPER_NAME]);
    pick(&mut all, FromDevice, &[HELPER_NAME]);
    Selection {
        store: Slots { w16: s.f, w32: s.f, line: s.f },
        load: Slots { w16: l.f, w32: l.f, line: l.f },
        summary: describe([s.name; 3], [l.name; 3], "cpu: aarch64 asimd (LS64 not used)"),
        engines: all,
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn build() -> Selection {
    use Direction::{FromDevice, ToDevice};

    // No SIMD kernels: every slot is the aligned helper, which issues 8-byte accesses on the
    // 16-aligned ranges the slots are given.
    let mut all = helpers().to_vec();
    let s = pick(&mut all, ToDevice, &[HELPER_NAME]);
    let l = pick(&mut all, FromDevice, &[HELPER_NAME]);
    Selection {
        store: Slots { w16: s.f, w32: s.f, line: s.f },
        load: Slots { w16: l.f, w32: l.f, line: l.f },
        summary: describe([s.name; 3], [l.name; 3], "cpu: generic"),
        engines: all,
    }
}
