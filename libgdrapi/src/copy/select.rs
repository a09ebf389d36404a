//! Run-time engine selection, done once per process (safe code only).
//!
//! A write-combined copy uses three kernel slots per direction (see `plan_wc` in `mod.rs`):
//! `w16` for one 16-byte step, `w32` for one 32-byte step, and `line` for the bulk of whole,
//! 64-byte aligned lines. Any kernel whose width divides the slot's size can fill a slot.
//!
//! Choices on x86-64 follow the write-combining rules first (SIMD device stores non-temporal or
//! direct, whole 64-byte lines stored back to back, no read for ownership, streaming loads for
//! reads, one fence per call) and, among the kernels that follow them, take the cheapest measured
//! one (`docs/copy-engines.md` has the table; the machine there maps write-combined host memory as
//! cached, so its numbers are instruction costs, never a reason to leave the rules):
//! - store `line` (the bulk): AVX VMOVNTDQ, two per line, else SSE2 MOVNTDQ, four per line. A
//!   line filled back to back by NT stores leaves the core as one 64-byte WC-buffer flush.
//!   MOVDIR64B and zmm VMOVNTDQ are implemented and benchmarked but not selected:
//!   - MOVDIR64B adds a guarantee `gdr_copy_to_mapping` does not promise (each 64-byte write
//!     is never torn, even if an interrupt lands mid-line), and measured less throughput than
//!     VMOVNTDQ for large copies, at rates a device write could reach
//!     (docs/decisions/0005-no-avx512-stores.md). Upstream 2.6 picks it when present.
//!   - zmm VMOVNTDQ measures the same as VMOVNTDQ ymm, so 512-bit registers buy nothing, while
//!     on Skylake-SP/Cascade Lake Xeons they can drop the core to a lower frequency licence for
//!     a while after use: a cost that a library called for small copies by latency-sensitive
//!     consumers (NCCL, UCX, MPI) must not put on the whole application. On AMD Zen 4, zmm
//!     operations run as two 256-bit halves, so there is nothing to gain there either.
//! - store `w32`/`w16`: AVX VMOVNTDQ / SSE2 MOVNTDQ (NT stores for the partial lines at the ends).
//! - load `line`/`w32`: AVX2 VMOVNTDQA, else the 16-byte slot; load `w16`: SSE4.1 MOVNTDQA, else
//!   SSE2 MOVDQA (the only option on CPUs without streaming loads). zmm VMOVNTDQA is cheaper on
//!   cache-resident data, but reads from a BAR are latency-bound at well under 1 GB/s (upstream's
//!   published V100 figure is 0.53 GB/s), a hundred times below any of these kernels, so the
//!   difference cannot show, and the frequency-licence risk above remains. Upstream 2.6 does not
//!   select AVX-512 either.
//! - the one use of zmm: where the CPU has AVX-512 VBMI (which no CPU with the licence drop has),
//!   the load `line` slot is AVX2 VMOVNTDQA with a realigning path for host sides that are not
//!   32-aligned (`x86::load_lines_realigned`: split host stores made such loads several times
//!   slower; docs/decisions/0006-vbmi-loads.md), a
//!   whole load below [`SPAN_MAX`] bytes is one function ([`WholeLoads::span`]: one read per
//!   device line, one two-line shuffle per 64 host bytes), and a larger one is one function
//!   ([`WholeLoads::large`]) whose partial end lines are one zmm streaming load each.
//!   [`NO_AVX512_ENV`] turns all three off.
//!
//! The benchmark (`benches/copy_engines.rs`) times every kernel, so these choices can be
//! revisited with measurements on a real BAR.

#![forbid(unsafe_code)]

use super::kernel::{Direction, Engine, ExportFn, FencedFn, KernelFn, SPAN_MAX};
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
    /// x86-64: whether the 16-byte end chunks of a load use MOVNTDQA (SSE4.1), as the 16-byte slot
    /// does, rather than MOVDQA.
    pub(crate) stream_chunks: bool,
    /// x86-64: whether a load below 16 bytes inside one 16-byte chunk may shuffle the chunk's
    /// bytes down with PSHUFB (`x86::load_in_chunk_sse41`): the CPU has SSE4.1 and SSSE3.
    pub(crate) shuffle_chunks: bool,
    /// x86-64: the load `line` kernel's fenced twin (the kernel, the store fence, return 0), which
    /// the public fast path jumps to at the end of a load; `None` elsewhere.
    pub(crate) load_line_fenced: Option<FencedFn>,
    /// x86-64 with AVX-512 VBMI: the two whole-load functions (both exist or neither, so one
    /// `Option`: a caller choosing between them tests once); `None` elsewhere.
    pub(crate) whole_loads: Option<WholeLoads>,
}

/// The whole-load functions of a CPU with AVX-512 VBMI.
#[derive(Clone, Copy)]
pub(crate) struct WholeLoads {
    /// A load of any length from any address in one function (`x86::load_span_vbmi`), for every
    /// load below [`SPAN_MAX`] bytes that is not one aligned access or one 8-byte word.
    pub(crate) span: WholeLoad,
    /// The fenced span load with the public copy call's arguments, `(handle, host, dev, n)`
    /// (`x86::load_span_vbmi_from_export`), for the fast path's small loads to jump to.
    pub(crate) span_from_export: ExportFn,
    /// A whole load of at least `wc::SHORT_MAX` bytes (used from [`SPAN_MAX`] up), its partial
    /// lines at the ends included, in one function (`x86::load_large_vbmi`).
    pub(crate) large: WholeLoad,
    /// The fenced whole load with the public copy call's arguments
    /// (`x86::load_large_vbmi_from_export`), for the fast path's partial-line loads from
    /// [`SPAN_MAX`] bytes.
    pub(crate) large_from_export: ExportFn,
}

impl Selection {
    /// The span load ([`WholeLoads::span`]), where the CPU has it.
    #[inline(always)]
    pub(crate) fn span_load(&self) -> Option<WholeLoad> {
        self.whole_loads.map(|w| w.span)
    }

    /// The one function for a whole load of `n >= wc::SHORT_MAX` bytes where the CPU has them:
    /// the span load below [`SPAN_MAX`] unless the load is whole lines at a 64-aligned device
    /// address (`whole_lines`: the line kernels' aligned stores win there), else the whole-load
    /// function. The dispatcher (`wc::load_lines_last`) and the public fast path
    /// (`fastcopy::large`) both choose through here.
    #[inline(always)]
    pub(crate) fn whole_load(&self, n: usize, whole_lines: bool) -> Option<WholeLoad> {
        self.whole_loads.map(|w| if n < SPAN_MAX && !whole_lines { w.span } else { w.large })
    }
}

/// One function for a whole load, `f(host, dev, n)`, in two forms: without the store fence (the
/// dispatcher's) and with it (the public fast path's, which jumps there). Both return 0.
#[derive(Clone, Copy)]
pub(crate) struct WholeLoad {
    pub(crate) unfenced: FencedFn,
    pub(crate) fenced: FencedFn,
}

static SELECTION: OnceLock<Selection> = OnceLock::new();

/// The process-wide selection, computed on first use.
pub(crate) fn get() -> &'static Selection {
    SELECTION.get_or_init(build)
}

/// The selection if it has been computed (`gdr_open` computes it, so every copy through a
/// mapping finds it): one load and compare, and no initialising call that a caller would have to
/// save its registers around.
#[inline(always)]
pub(crate) fn ready() -> Option<&'static Selection> {
    SELECTION.get()
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

/// Name of the load line kernel that realigns host stores (x86-64 with AVX-512 VBMI).
#[cfg(target_arch = "x86_64")]
pub(super) const REALIGN_NAME: &str = "AVX2 VMOVNTDQA + VBMI realign";

fn describe(store: [&str; 3], load: [&str; 3], extra: &str) -> String {
    format!(
        "store: 64B-lines {}, 32B {}, 16B {}, <16B {HELPER_NAME}; \
         load: 64B-lines {}, 32B {}, 16B {}, <16B {HELPER_NAME}; {extra}",
        store[0], store[1], store[2], load[0], load[1], load[2]
    )
}

/// Set to 1, this environment variable (ours; upstream has none like it) keeps the zmm loads off:
/// every load then takes the paths of CPUs without AVX-512 VBMI. For users who would rather run no
/// 512-bit code, and for the tests of those paths on CPUs that have VBMI.
#[cfg(target_arch = "x86_64")]
pub(crate) const NO_AVX512_ENV: &str = "GDRCOPY_COPY_NO_AVX512";

/// Whether [`NO_AVX512_ENV`] is set to 1.
#[cfg(target_arch = "x86_64")]
pub(crate) fn zmm_refused() -> bool {
    std::env::var_os(NO_AVX512_ENV).is_some_and(|v| v == "1")
}

#[cfg(target_arch = "x86_64")]
fn build() -> Selection {
    use super::x86;
    use Direction::{FromDevice, ToDevice};

    let sse41 = std::arch::is_x86_feature_detected!("sse4.1");
    let avx = std::arch::is_x86_feature_detected!("avx");
    let avx2 = std::arch::is_x86_feature_detected!("avx2");
    let avx512f = std::arch::is_x86_feature_detected!("avx512f");
    // The realigning and span loads need AVX-512F/BW/VL (zmm, ymm and xmm loads, masked stores and
    // blends), VBMI (VPERMB, VPERMT2B) and BMI2 (BZHI).
    let vbmi_cpu = avx2
        && avx512f
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx512vbmi")
        && std::arch::is_x86_feature_detected!("bmi2");
    let vbmi = vbmi_cpu && !zmm_refused();
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
    if vbmi {
        all.push(engine(REALIGN_NAME, FromDevice, 64, x86::load_avx2_realign));
    }
    if avx512f {
        all.push(engine("AVX-512 VMOVNTDQA", FromDevice, 64, x86::load_avx512));
    }
    all.extend(helpers());

    let s16 = pick(&mut all, ToDevice, &["SSE2 MOVNTDQ"]);
    let s32 = pick(&mut all, ToDevice, &["AVX VMOVNTDQ", "SSE2 MOVNTDQ"]);
    let sline = pick(&mut all, ToDevice, &["AVX VMOVNTDQ", "SSE2 MOVNTDQ"]);
    let l16 = pick(&mut all, FromDevice, &["SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    let l32 = pick(&mut all, FromDevice, &["AVX2 VMOVNTDQA", "SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    let lline = pick(&mut all, FromDevice, &[REALIGN_NAME, "AVX2 VMOVNTDQA", "SSE4.1 MOVNTDQA", "SSE2 MOVDQA"]);
    // Mark the helpers as selected too: they serve every head and tail.
    pick(&mut all, ToDevice, &[HELPER_NAME]);
    pick(&mut all, FromDevice, &[HELPER_NAME]);

    let flag = |b: bool, n: &str| if b { format!(" {n}") } else { String::new() };
    let extra = format!(
        "cpu:{}{}{}{}{}{}{}{}",
        " sse2",
        flag(sse41, "sse4.1"),
        flag(avx, "avx"),
        flag(avx2, "avx2"),
        flag(avx512f, "avx512f"),
        flag(vbmi, "avx512vbmi"),
        flag(vbmi_cpu && !vbmi, &format!("avx512vbmi (not used: {NO_AVX512_ENV})")),
        flag(movdir64b, "movdir64b (not selected)"),
    );
    // The fenced twin of whichever load kernel fills the line slot (the same kernel, so it is
    // usable whenever that one is).
    let load_line_fenced: FencedFn = match lline.name {
        REALIGN_NAME => x86::load_avx2_realign_fenced,
        "AVX2 VMOVNTDQA" => x86::load_avx2_fenced,
        "SSE4.1 MOVNTDQA" => x86::load_sse41_fenced,
        "SSE2 MOVDQA" => x86::load_sse2_fenced,
        other => unreachable!("the load line slot picked {other}, which has no fenced twin"),
    };
    Selection {
        store: Slots { w16: s16.f, w32: s32.f, line: sline.f },
        load: Slots { w16: l16.f, w32: l32.f, line: lline.f },
        summary: describe([sline.name, s32.name, s16.name], [lline.name, l32.name, l16.name], &extra),
        stream_chunks: sse41,
        shuffle_chunks: sse41 && std::arch::is_x86_feature_detected!("ssse3"),
        load_line_fenced: Some(load_line_fenced),
        whole_loads: vbmi.then_some(WholeLoads {
            span: WholeLoad { unfenced: x86::load_span_vbmi::<false>, fenced: x86::load_span_vbmi::<true> },
            span_from_export: x86::load_span_vbmi_from_export,
            large: WholeLoad { unfenced: x86::load_large_vbmi::<false>, fenced: x86::load_large_vbmi::<true> },
            large_from_export: x86::load_large_vbmi_from_export,
        }),
        engines: all,
    }
}

#[cfg(target_arch = "aarch64")]
fn build() -> Selection {
    use super::arm;
    use Direction::{FromDevice, ToDevice};

    let mut all =
        vec![engine("NEON 16B", ToDevice, 16, arm::store_neon), engine("NEON 16B", FromDevice, 16, arm::load_neon)];
    all.extend(helpers());
    let s = pick(&mut all, ToDevice, &["NEON 16B"]);
    let l = pick(&mut all, FromDevice, &["NEON 16B"]);
    pick(&mut all, ToDevice, &[HELPER_NAME]);
    pick(&mut all, FromDevice, &[HELPER_NAME]);
    Selection {
        store: Slots { w16: s.f, w32: s.f, line: s.f },
        load: Slots { w16: l.f, w32: l.f, line: l.f },
        summary: describe([s.name; 3], [l.name; 3], "cpu: aarch64 asimd (LS64 not used)"),
        stream_chunks: false,
        shuffle_chunks: false,
        load_line_fenced: None,
        whole_loads: None,
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
        stream_chunks: false,
        shuffle_chunks: false,
        load_line_fenced: None,
        whole_loads: None,
        engines: all,
    }
}
