//! The one cache line a value post reads besides its descriptors, the translation memo and the
//! registration cache's generation: the driver's batch entry point, the capabilities every GPU
//! shares, the batch flags and the dump setting, copied once from the places that own them (the
//! driver table, the peer table, the settings) into a 64-byte aligned block.
//!
//! Why: `gds_stream_post_descriptors` runs right after the application's previous driver call,
//! which has usually pushed our data out of the first-level cache. Read from their owners, these
//! few values sat on six lines of the library's data (each owner behind its own `OnceLock`), and
//! on a slow lease of the H100 machine the misses, not the instructions, were most of a post's
//! cost over the bare `cuStreamBatchMemOp` (docs/performance.md). Everything here is fixed once
//! known: the settings are read once, the capabilities are detected once per device, and the
//! driver's entry point does not move.

#![forbid(unsafe_code)]

use std::sync::OnceLock;

use gpudirect_common::Result;

use crate::abi::CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING;
use crate::cuda::{BatchEntry, Cuda, cuda};
use crate::engine::memmgr::{MemMgr, memmgr};
use crate::engine::peer::{Caps, Peers, peers};
use crate::env::{Settings, settings};

/// What a value post needs, for a process whose GPUs all have the same capabilities.
#[derive(Clone, Copy)]
pub struct PostLine<'a> {
    /// The driver, for the error paths (error strings, the stream lookup after a refusal).
    pub cuda: &'a dyn Cuda,
    /// The batch call itself where the driver has one (`None` under the unit tests' fakes, which
    /// are called through `cuda`).
    pub batch: Option<BatchEntry>,
    /// The registration cache the addresses are translated through.
    pub mm: &'a MemMgr,
    /// The capabilities every GPU shares.
    pub caps: Caps,
    /// `cuStreamBatchMemOp`'s flags: relaxed ordering where it was asked for and is supported.
    pub batch_flags: u32,
    /// `GDS_ENABLE_DUMP_MEMOPS`.
    pub dump_memops: bool,
}

impl<'a> PostLine<'a> {
    /// The line for this driver, settings, peer table and cache; `None` when the GPUs differ (a
    /// post then has to look its stream's device up, which the general path does).
    pub fn new(cuda: &'a dyn Cuda, env: &Settings, peers: &Peers, mm: &'a MemMgr) -> Option<PostLine<'a>> {
        let caps = peers.uniform(cuda, env)?;
        let relaxed = !env.disable_weak_consistency && caps.has_weak;
        Some(PostLine {
            cuda,
            batch: cuda.batch_entry(),
            mm,
            caps,
            batch_flags: if relaxed { CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING } else { 0 },
            dump_memops: env.enable_dump_memops,
        })
    }
}

/// The process's line: the `OnceLock`'s state word and the value share one aligned line.
#[repr(C, align(64))]
struct Line(OnceLock<PostLine<'static>>);

const _: () = assert!(size_of::<Line>() == 64, "the post line is one cache line");

static LINE: Line = Line(OnceLock::new());

/// The process's post line, made on the first post that can use one. `Ok(None)` when the GPUs
/// differ (then it is asked again next time, at the cost of the peer table's `OnceLock`); `Err`
/// when the driver cannot be loaded (`EIO`, as every driver-backed call).
#[inline]
pub fn process_line() -> Result<Option<&'static PostLine<'static>>> {
    match LINE.0.get() {
        Some(l) => Ok(Some(l)),
        None => fill(),
    }
}

/// The process's post line if a post has made it (no call: for the export's unguarded path).
#[inline(always)]
pub fn ready() -> Option<&'static PostLine<'static>> {
    LINE.0.get()
}

#[cold]
#[inline(never)]
fn fill() -> Result<Option<&'static PostLine<'static>>> {
    let Some(line) = PostLine::new(cuda()?, settings(), peers(), memmgr()) else { return Ok(None) };
    Ok(Some(LINE.0.get_or_init(|| line)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testcuda::FakeCuda;

    #[test]
    fn a_line_copies_caps_and_flags_and_needs_uniform_gpus() {
        let (cuda, mm) = (FakeCuda::new(), MemMgr::default());
        let env = Settings::default();
        let line = PostLine::new(&cuda, &env, &Peers::default(), &mm).expect("one GPU is uniform");
        assert_eq!(line.caps, Peers::default().uniform(&cuda, &env).unwrap());
        assert_eq!(line.batch_flags, 0, "relaxed ordering is off by default");
        assert!(!line.dump_memops);
        assert!(line.batch.is_none(), "the fake has no driver entry point");
        assert!(std::ptr::eq(line.mm, &mm));

        let dump = Settings { enable_dump_memops: true, ..Settings::default() };
        assert!(PostLine::new(&cuda, &dump, &Peers::default(), &mm).unwrap().dump_memops);

        let none = FakeCuda::new();
        none.set_device_count(None);
        assert!(PostLine::new(&none, &env, &Peers::default(), &mm).is_none(), "no uniform caps, no line");
    }
}
