//! Copy engines behind `gdr_copy_to_mapping` / `gdr_copy_from_mapping`.
//!
//! The device side of these copies is a GPU BAR mapped over PCIe, normally write-combined (WC):
//! uncached, with stores gathered in write-combining buffers and reads going to the device every
//! time. The rules this module follows for WC mappings, from the architecture manuals rather than
//! from cached-memory timings:
//! - every device load is naturally aligned; outside the SIMD kernels it is one volatile access
//!   of at most 8 bytes (`aligned.rs`) or an aligned vector holding the range. So is every store
//!   except on x86-64, where a store under 16 bytes (a short copy, or the head or tail of a
//!   longer one) is at most two plain stores of one width at any alignment, overlapping
//!   (`edges.rs` says why that is sound on write-combined memory);
//! - stores are non-temporal (MOVNTDQ, VMOVNTDQ; MOVDIR64B and zmm VMOVNTDQ are implemented and
//!   benchmarked, see `select.rs` for why they are not selected), and fill whole 64-byte lines
//!   back to back wherever the range allows, so a line leaves the core as one write and no line
//!   of the BAR is ever read for ownership;
//! - loads are streaming loads (MOVNTDQA, VMOVNTDQA), the loads of one line issued together;
//! - no kernel fences: the caller issues one [`store_fence`] or [`full_fence`] per call, chosen
//!   from the process's mapping-type counters (spec §4.5);
//! - the host side may have any alignment.
//!
//! `Cached` mappings are ordinary cacheable memory and use `memcpy`. `Device` mappings (arm64
//! Device-nGnRE, BlueField-3 hosts) get only naturally aligned volatile accesses of up to 8 bytes.
//! Upstream switches to `memcpy` for the 8-byte aligned bulk of a `Device` copy; `memcpy` may
//! use wider, pair or unaligned accesses, so we keep to single 8-byte accesses there.
//!
//! Engine choice is made once per process (`select.rs`, which also explains why AVX-512 is
//! selected only for loads on CPUs with VBMI: the realigning line load, the span load and the
//! whole-load function); the per-call split into head, line bulk and tail is the pure function
//! [`plan::plan_wc`].
//!
//! Layers, bottom to top (nothing imports upwards): `kernel` (the shared types, fences, size
//! limits and byte helpers); the kernels `aligned`, `edges`, `x86`, `arm`, which import only
//! `kernel` (and `edges` the aligned helper); `select` (the engine choice over the kernels);
//! `plan` (the size classifier [`route`] and the per-call split); `wc` (the write-combined
//! dispatcher); this module, which re-exports and holds the public entry points.

// The engine table (`engines`, `Engine::width`, the raw kind values) serves the benchmark (feature
// `bench-internals`) and the unit tests; the library itself only dispatches.
#![cfg_attr(not(feature = "bench-internals"), allow(dead_code))]

pub(crate) mod aligned;
#[cfg(target_arch = "aarch64")]
mod arm;
pub(crate) mod edges;
pub(crate) mod kernel;
pub(crate) mod plan;
pub(crate) mod select;
#[cfg(test)]
mod tests;
pub(crate) mod wc;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

pub use kernel::{Direction, Engine, MappingKind, full_fence, store_fence};
pub(crate) use kernel::{SHORT_MAX, WcRange, opaque_zero};
pub(crate) use plan::{Route, route};

/// Detect CPU features once per process (cheap on later calls) and return a one-line
/// description of the selected engines for the debug log.
pub fn detect() -> &'static str {
    &select::get().summary
}

/// Enumerate the engines usable on this CPU, each callable directly (benchmarks and tests).
pub fn engines() -> Vec<Engine> {
    select::get().engines.clone()
}

/// Copy host -> mapped device memory, with the engines for `kind`. Does not fence.
///
/// # Safety
/// `dev_dst` is valid for `len` bytes of writes, `host_src` for `len` bytes of reads, and the
/// two ranges do not overlap. Any alignment is accepted.
#[inline(always)]
pub unsafe fn copy_to_mapping(kind: MappingKind, dev_dst: *mut u8, host_src: *const u8, len: usize) {
    match kind {
        // SAFETY: the caller's contract is exactly memcpy's.
        MappingKind::Cached => unsafe { core::ptr::copy_nonoverlapping(host_src, dev_dst, len) },
        // SAFETY: the caller's contract is the helper's (any alignment, valid, no overlap).
        MappingKind::Device => unsafe { aligned::to_device(dev_dst, host_src, len) },
        // SAFETY: the caller's contract is the range's; every mapping is made of whole pages.
        MappingKind::WriteCombined => wc::store(unsafe { WcRange::new(dev_dst, host_src, len) }),
    }
}

/// Copy mapped device memory -> host, with the engines for `kind`. Does not fence.
///
/// # Safety
/// `host_dst` is valid for `len` bytes of writes, `dev_src` for `len` bytes of reads, and the
/// two ranges do not overlap. Any alignment is accepted.
#[inline(always)]
pub unsafe fn copy_from_mapping(kind: MappingKind, host_dst: *mut u8, dev_src: *const u8, len: usize) {
    match kind {
        // SAFETY: the caller's contract is exactly memcpy's.
        MappingKind::Cached => unsafe { core::ptr::copy_nonoverlapping(dev_src, host_dst, len) },
        // SAFETY: the caller's contract is the helper's (any alignment, valid, no overlap).
        MappingKind::Device => unsafe { aligned::from_device(host_dst, dev_src, len) },
        // SAFETY: as in `copy_to_mapping`.
        MappingKind::WriteCombined => wc::load(unsafe { WcRange::new(host_dst, dev_src, len) }),
    }
}
