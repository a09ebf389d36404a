//! Translation of descriptors and peer-op lists into CUDA stream memory operations (spec §5), and
//! their submission in `cuStreamBatchMemOp` batches no larger than the driver accepts.
//!
//! Everything here is safe code over plain values: the C layer copies descriptors and peer-op
//! lists out of application memory into [`Desc`]/[`PeerOp`] first.

#![forbid(unsafe_code)]

use std::mem::MaybeUninit;

use gpudirect_common::{Errno, Result};

use gpudirect_common::cuda::CuResult;

use crate::abi::*;
use crate::cuda::{CuRes, Cuda, errno_of};
use crate::engine::memmgr::MemMgr;
use crate::engine::memo::Memo;
use crate::engine::peer::{self, Caps, Peers};
use crate::engine::post_line::PostLine;
use crate::engine::ranges::Ranges;
use crate::env::Settings;

/// Largest number of operations one `cuStreamBatchMemOp` call takes ("must be less than 256").
pub const MAX_BATCH: usize = 255;
/// Largest COPY_BLOCK payload (upstream's `GDS_GPU_MAX_INLINE_SIZE`).
pub const MAX_INLINE_COPY: usize = 256;

/// One peer operation, copied out of a `struct peer_op_wr`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerOp {
    Fence {
        flags: u64,
    },
    StoreDword {
        data: u32,
        target: u64,
        offset: usize,
    },
    StoreQword {
        data: u64,
        target: u64,
        offset: usize,
    },
    /// The payload is copied at submission time, as upstream consumes `src` then.
    CopyBlock {
        data: Vec<u8>,
        target: u64,
        offset: usize,
    },
    /// `op` is one of the `IBV_EXP_PEER_OP_POLL_*_DWORD` values.
    Poll {
        op: u32,
        data: u32,
        target: u64,
        offset: usize,
    },
    /// RESERVED1 or anything unknown.
    Other(u32),
}

/// One descriptor, copied out of a `gds_descriptor_t`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Desc {
    Send(Vec<PeerOp>),
    Wait(Vec<PeerOp>),
    WaitValue32 { ptr: usize, value: u32, cond: u32, flags: i32 },
    WriteValue32 { ptr: usize, value: u32, flags: i32 },
    WriteMemory { dest: usize, src: usize, count: usize, flags: i32 },
}

/// A stream memory operation, as it will be handed to the driver.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemOp {
    /// `flags` = CUDA wait condition, possibly `| CU_STREAM_WAIT_VALUE_FLUSH`.
    Wait32 {
        addr: u64,
        value: u32,
        flags: u32,
    },
    Write32 {
        addr: u64,
        value: u32,
        flags: u32,
    },
    Write64 {
        addr: u64,
        value: u64,
        flags: u32,
    },
}

impl MemOp {
    pub fn to_params(self) -> BatchMemOpParams {
        let (operation, address, value64, flags) = match self {
            MemOp::Wait32 { addr, value, flags } => (CU_STREAM_MEM_OP_WAIT_VALUE_32, addr, u64::from(value), flags),
            MemOp::Write32 { addr, value, flags } => (CU_STREAM_MEM_OP_WRITE_VALUE_32, addr, u64::from(value), flags),
            MemOp::Write64 { addr, value, flags } => (CU_STREAM_MEM_OP_WRITE_VALUE_64, addr, value, flags),
        };
        BatchMemOpParams { operation, address, value64, flags, ..Default::default() }
    }
}

impl MemOp {
    /// The memop a parameter record holds (for logs); `None` for an operation we never emit.
    fn from_params(p: &BatchMemOpParams) -> Option<MemOp> {
        let (addr, flags) = (p.address, p.flags);
        Some(match p.operation {
            CU_STREAM_MEM_OP_WAIT_VALUE_32 => MemOp::Wait32 { addr, value: p.value64 as u32, flags },
            CU_STREAM_MEM_OP_WRITE_VALUE_32 => MemOp::Write32 { addr, value: p.value64 as u32, flags },
            CU_STREAM_MEM_OP_WRITE_VALUE_64 => MemOp::Write64 { addr, value: p.value64, flags },
            _ => return None,
        })
    }
}

impl std::fmt::Display for MemOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            MemOp::Wait32 { addr, value, flags } => {
                write!(f, "WAIT_VALUE_32 addr={addr:#x} value={value:#x} flags={flags:#x}")
            }
            MemOp::Write32 { addr, value, flags } => {
                write!(f, "WRITE_VALUE_32 addr={addr:#x} value={value:#x} flags={flags:#x}")
            }
            MemOp::Write64 { addr, value, flags } => {
                write!(f, "WRITE_VALUE_64 addr={addr:#x} value={value:#x} flags={flags:#x}")
            }
        }
    }
}

/// Exactly one memory type in `flags`.
#[inline]
fn mem_type_ok(flags: i32) -> bool {
    matches!(flags & GDS_MEMORY_MASK, GDS_MEMORY_GPU | GDS_MEMORY_HOST | GDS_MEMORY_IO)
}

/// Whether a WAIT_VALUE32 request's condition and flags are valid.
#[inline]
pub fn wait_value32_ok(cond: u32, flags: i32) -> bool {
    flags & !(GDS_WAIT_POST_FLUSH_REMOTE | GDS_MEMORY_MASK) == 0 && mem_type_ok(flags) && cond <= GDS_WAIT_COND_NOR
}

/// Checks the flags of a WAIT_VALUE32 request (prepare time and post time). The test is inline
/// (it runs several times per enqueue); reporting a failure is out of line.
#[inline]
pub fn check_wait_value32(cond: u32, flags: i32) -> Result<()> {
    if wait_value32_ok(cond, flags) {
        return Ok(());
    }
    bad_wait_value32(cond, flags)
}

#[cold]
fn bad_wait_value32(cond: u32, flags: i32) -> Result<()> {
    const F: &str = "gds_prepare_wait_value32";
    if flags & !(GDS_WAIT_POST_FLUSH_REMOTE | GDS_MEMORY_MASK) != 0 {
        gds_err!(F, "invalid flags {flags:#x}");
        return Err(Errno::EINVAL);
    }
    check_mem_type(F, flags)?;
    if cond > GDS_WAIT_COND_NOR {
        gds_err!(F, "invalid wait condition {cond}");
        return Err(Errno::EINVAL);
    }
    Ok(())
}

/// Whether a WRITE_VALUE32 request's flags are valid.
#[inline]
pub fn write_value32_ok(flags: i32) -> bool {
    flags & !(GDS_WRITE_PRE_BARRIER_SYS | GDS_MEMORY_MASK) == 0 && mem_type_ok(flags)
}

/// Checks the flags of a WRITE_VALUE32 request (inline test, out-of-line report).
#[inline]
pub fn check_write_value32(flags: i32) -> Result<()> {
    if write_value32_ok(flags) {
        return Ok(());
    }
    bad_write_value32(flags)
}

#[cold]
fn bad_write_value32(flags: i32) -> Result<()> {
    const F: &str = "gds_prepare_write_value32";
    if flags & !(GDS_WRITE_PRE_BARRIER_SYS | GDS_MEMORY_MASK) != 0 {
        gds_err!(F, "invalid flags {flags:#x}");
        return Err(Errno::EINVAL);
    }
    check_mem_type(F, flags)
}

/// Checks the flags of a WRITE_MEMORY request.
pub fn check_write_memory(flags: i32) -> Result<()> {
    const F: &str = "gds_prepare_write_memory";
    if flags & !(GDS_WRITE_MEMORY_POST_BARRIER_SYS | GDS_WRITE_MEMORY_PRE_BARRIER_SYS | GDS_MEMORY_MASK) != 0 {
        gds_err!(F, "invalid flags {flags:#x}");
        return Err(Errno::EINVAL);
    }
    check_mem_type(F, flags)
}

/// Exactly one memory type must be given (upstream meant to check this; its check never fired).
fn check_mem_type(origin: &str, flags: i32) -> Result<()> {
    match flags & GDS_MEMORY_MASK {
        GDS_MEMORY_GPU | GDS_MEMORY_HOST | GDS_MEMORY_IO => Ok(()),
        t => {
            gds_err!(origin, "invalid memory type {t:#x} in flags {flags:#x} (need one of GPU, HOST, IO)");
            Err(Errno::EINVAL)
        }
    }
}

/// The WAIT_VALUE_32 memop for a poll of `addr` (`cond` a GDS_WAIT_COND_*, `gds_flags` the
/// descriptor's flags: remote flush). The refusals and the warning are out of line, so that a
/// post inlines this as a handful of tests.
#[inline]
fn wait_op(caps: &Caps, addr: u64, value: u32, cond: u32, gds_flags: i32) -> Result<MemOp> {
    check_aligned(WAIT_ORIGIN, "wait address", addr, 4)?;
    let mut flags = match cond {
        GDS_WAIT_COND_GEQ | GDS_WAIT_COND_EQ | GDS_WAIT_COND_AND => cond,
        GDS_WAIT_COND_NOR if caps.has_wait_nor => cond,
        c => return Err(refuse_wait_cond(caps, c)),
    };
    if gds_flags & GDS_WAIT_POST_FLUSH_REMOTE != 0 {
        if caps.has_remote_flush {
            flags |= CU_STREAM_WAIT_VALUE_FLUSH;
        } else {
            warn_no_remote_flush();
        }
    }
    Ok(MemOp::Wait32 { addr, value, flags })
}

const WAIT_ORIGIN: &str = "gds_fill_poll";

#[cold]
#[inline(never)]
fn refuse_wait_cond(caps: &Caps, cond: u32) -> Errno {
    if cond == GDS_WAIT_COND_NOR {
        gds_err!(
            WAIT_ORIGIN,
            "GDS_WAIT_COND_NOR is not available on GPU {} (unsupported by the device, or GDS_DISABLE_WAIT_NOR is not 0)",
            caps.device
        );
    } else {
        gds_err!(WAIT_ORIGIN, "invalid wait condition {cond}");
    }
    Errno::EINVAL
}

#[cold]
#[inline(never)]
fn warn_no_remote_flush() {
    gds_warn_once!(
        WAIT_ORIGIN,
        "GPU cannot flush remote writes (or GDS_DISABLE_REMOTE_FLUSH is set): consistency of RDMA data for GPU work launched after a wait is not guaranteed"
    );
}

/// A write without barrier only where the driver accepts that flag (v1 entry points).
fn write_flags(caps: &Caps, barrier: bool) -> u32 {
    if barrier || !caps.write_no_barrier {
        CU_STREAM_WRITE_VALUE_DEFAULT
    } else {
        CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER
    }
}

/// The WRITE_VALUE_32 memop storing `value` at `addr`.
#[inline]
fn write_op(caps: &Caps, addr: u64, value: u32, barrier: bool) -> Result<MemOp> {
    check_aligned("gds_fill_poke", "write address", addr, 4)?;
    Ok(MemOp::Write32 { addr, value, flags: write_flags(caps, barrier) })
}

/// A WAIT_VALUE32 or WRITE_VALUE32 descriptor: the two that carry no op list (plain values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueDesc {
    Wait { ptr: usize, value: u32, cond: u32, flags: i32 },
    Write { ptr: usize, value: u32, flags: i32 },
}

impl From<ValueDesc> for Desc {
    fn from(v: ValueDesc) -> Desc {
        match v {
            ValueDesc::Wait { ptr, value, cond, flags } => Desc::WaitValue32 { ptr, value, cond, flags },
            ValueDesc::Write { ptr, value, flags } => Desc::WriteValue32 { ptr, value, flags },
        }
    }
}

/// The memop of one value descriptor (spec §5.5 step 4): flag checks, alignment, translation of
/// the address (registering host memory on first use), then the wait/write memop.
#[inline]
fn value_op(
    caps: &Caps,
    d: ValueDesc,
    map: &mut (impl FnMut(usize, usize, i32) -> Result<u64> + ?Sized),
) -> Result<MemOp> {
    match d {
        ValueDesc::Wait { ptr, value, cond, flags } => {
            check_wait_value32(cond, flags)?;
            aligned(ptr, 4)?;
            let addr = map(ptr, 4, flags & GDS_MEMORY_MASK)?;
            wait_op(caps, addr, value, cond, flags)
        }
        ValueDesc::Write { ptr, value, flags } => {
            check_write_value32(flags)?;
            aligned(ptr, 4)?;
            let addr = map(ptr, 4, flags & GDS_MEMORY_MASK)?;
            write_op(caps, addr, value, flags & GDS_WRITE_PRE_BARRIER_SYS != 0)
        }
    }
}

/// Builds the memop list for one submission.
pub struct Emitter<'a> {
    caps: &'a Caps,
    ranges: &'a Ranges,
    pub ops: Vec<MemOp>,
}

impl<'a> Emitter<'a> {
    fn poll(&mut self, addr: u64, value: u32, cond: u32, gds_flags: i32) -> Result<()> {
        let op = wait_op(self.caps, addr, value, cond, gds_flags)?;
        self.ops.push(op);
        Ok(())
    }

    fn write_flags(&self, barrier: bool) -> u32 {
        write_flags(self.caps, barrier)
    }

    fn poke(&mut self, addr: u64, value: u32, barrier: bool) -> Result<()> {
        let op = write_op(self.caps, addr, value, barrier)?;
        self.ops.push(op);
        Ok(())
    }

    fn poke64(&mut self, addr: u64, value: u64, barrier: bool) -> Result<()> {
        check_aligned("gds_fill_poke64", "write address", addr, 8)?;
        let flags = self.write_flags(barrier);
        self.ops.push(MemOp::Write64 { addr, value, flags });
        Ok(())
    }

    /// Translates a provider's op list (spec §5.3). `discard_flush` drops the remote flush of the
    /// polls (flush coalescing, §5.5).
    pub fn peer_ops(&mut self, ops: &[PeerOp], discard_flush: bool) -> Result<()> {
        const F: &str = "gds_post_ops";
        if !self.caps.has_memops {
            gds_err!(F, "GPU {} has no stream memory operations", self.caps.device);
            return Err(Errno::EINVAL);
        }
        // Without a memory-barrier memop, a write FENCE becomes a barrier on the next store.
        let mut prev_was_fence = false;
        for (i, op) in ops.iter().enumerate() {
            let r = match op {
                PeerOp::Fence { flags } => {
                    if flags & IBV_EXP_PEER_FENCE_OP_WRITE != 0 {
                        prev_was_fence = true;
                    }
                    Ok(())
                }
                PeerOp::StoreDword { data, target, offset } => {
                    let addr = self.ranges.get(*target)?.dev_addr(*offset, 4)?;
                    let b = std::mem::take(&mut prev_was_fence);
                    self.poke(addr, *data, b)
                }
                PeerOp::StoreQword { data, target, offset } => {
                    let addr = self.ranges.get(*target)?.dev_addr(*offset, 8)?;
                    let b = std::mem::take(&mut prev_was_fence);
                    if self.caps.has_write64 {
                        // Upstream drops a pending fence here; we keep the ordering it asked for.
                        self.poke64(addr, *data, b)
                    } else {
                        self.poke(addr, *data as u32, b).and_then(|_| self.poke(addr + 4, (*data >> 32) as u32, false))
                    }
                }
                PeerOp::CopyBlock { .. } => {
                    gds_err!(
                        F,
                        "op {i}: COPY_BLOCK needs the WRITE_MEMORY stream operation, which public CUDA drivers do not offer"
                    );
                    Err(Errno::EINVAL)
                }
                PeerOp::Poll { op, data, target, offset } => {
                    let addr = self.ranges.get(*target)?.dev_addr(*offset, 4)?;
                    let cond = match *op {
                        IBV_EXP_PEER_OP_POLL_AND_DWORD => GDS_WAIT_COND_AND,
                        IBV_EXP_PEER_OP_POLL_NOR_DWORD => GDS_WAIT_COND_NOR,
                        _ => GDS_WAIT_COND_GEQ,
                    };
                    let flags = if discard_flush { 0 } else { GDS_WAIT_POST_FLUSH_REMOTE };
                    self.poll(addr, *data, cond, flags)
                }
                PeerOp::Other(t) => {
                    gds_err!(F, "op {i}: unsupported peer op type {t}");
                    Err(Errno::EINVAL)
                }
            };
            if let Err(e) = r {
                gds_err!(F, "error {e} in peer op {i}");
                return Err(e);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
/// Translates a descriptor array (spec §5.5 steps 2–5). `map` turns (pointer, size, memory type)
/// into a device address, registering memory as needed.
pub fn translate(
    caps: &Caps,
    ranges: &Ranges,
    descs: &[Desc],
    map: &mut dyn FnMut(usize, usize, i32) -> Result<u64>,
) -> Result<Vec<MemOp>> {
    let mut ops = Vec::new();
    translate_into(caps, ranges, descs, map, &mut ops)?;
    Ok(ops)
}

/// [`translate`] into a caller's (cleared) buffer, so a hot caller can reuse its capacity.
pub fn translate_into(
    caps: &Caps,
    ranges: &Ranges,
    descs: &[Desc],
    map: &mut dyn FnMut(usize, usize, i32) -> Result<u64>,
    out: &mut Vec<MemOp>,
) -> Result<()> {
    // Flush coalescing: when no SEND follows the last WAIT, only that last WAIT flushes.
    let last_wait = descs.iter().rposition(|d| matches!(d, Desc::Wait(_)));
    let coalesce = last_wait.is_some_and(|lw| !descs[lw + 1..].iter().any(|d| matches!(d, Desc::Send(_))));
    out.clear();
    let mut e = Emitter { caps, ranges, ops: std::mem::take(out) };
    let r = emit_all(&mut e, descs, last_wait, coalesce, map);
    *out = e.ops;
    r
}

fn emit_all(
    e: &mut Emitter<'_>,
    descs: &[Desc],
    last_wait: Option<usize>,
    coalesce: bool,
    map: &mut dyn FnMut(usize, usize, i32) -> Result<u64>,
) -> Result<()> {
    const F: &str = "gds_stream_post_descriptors";
    for (i, d) in descs.iter().enumerate() {
        let r = match d {
            Desc::Send(ops) => e.peer_ops(ops, false),
            Desc::Wait(ops) => e.peer_ops(ops, coalesce && Some(i) != last_wait),
            &Desc::WaitValue32 { ptr, value, cond, flags } => {
                value_op(e.caps, ValueDesc::Wait { ptr, value, cond, flags }, map).map(|op| e.ops.push(op))
            }
            &Desc::WriteValue32 { ptr, value, flags } => {
                value_op(e.caps, ValueDesc::Write { ptr, value, flags }, map).map(|op| e.ops.push(op))
            }
            &Desc::WriteMemory { flags, .. } => check_write_memory(flags).and_then(|_| {
                gds_err!(
                    F,
                    "descriptor {i}: WRITE_MEMORY needs the CU_STREAM_MEM_OP_WRITE_MEMORY stream operation, which public CUDA drivers do not offer"
                );
                Err(Errno::EINVAL)
            }),
        };
        if let Err(err) = r {
            gds_err!(F, "descriptor {i} failed: {err}");
            return Err(err);
        }
    }
    Ok(())
}

fn aligned(ptr: usize, a: usize) -> Result<()> {
    check_aligned("gds_stream_post_descriptors", "pointer", ptr as u64, a as u64)
}

/// `Ok` when `addr` is a multiple of `a` (a power of two); otherwise logs
/// "`what` ADDR is not A-byte aligned" under `origin` and fails with `EINVAL`.
#[inline]
pub(crate) fn check_aligned(origin: &str, what: &str, addr: u64, a: u64) -> Result<()> {
    if addr & (a - 1) == 0 { Ok(()) } else { misaligned(origin, what, addr, a) }
}

#[cold]
fn misaligned(origin: &str, what: &str, addr: u64, a: u64) -> Result<()> {
    gds_err!(origin, "{what} {addr:#x} is not {a}-byte aligned");
    Err(Errno::EINVAL)
}

/// Hands `ops` to the driver in order, at most [`MAX_BATCH`] per call.
#[cfg(test)]
pub fn submit(cuda: &dyn Cuda, stream: usize, ops: &[MemOp], relaxed: bool, dump: bool) -> Result<()> {
    submit_with(cuda, stream, ops, relaxed, dump, &mut Vec::new())
}

/// [`submit`] building the driver's parameter array in a caller's reusable buffer.
fn submit_with(
    cuda: &dyn Cuda,
    stream: usize,
    ops: &[MemOp],
    relaxed: bool,
    dump: bool,
    params: &mut Vec<BatchMemOpParams>,
) -> Result<()> {
    const F: &str = "gds_stream_batch_ops";
    let flags = if relaxed { CU_STREAM_BATCH_MEM_OP_RELAXED_ORDERING } else { 0 };
    let mut done = 0usize;
    for chunk in ops.chunks(MAX_BATCH) {
        params.clear();
        params.extend(chunk.iter().map(|o| o.to_params()));
        if let Err(r) = cuda.batch_mem_op(stream, params, flags) {
            gds_err!(
                F,
                "cuStreamBatchMemOp({} ops) failed: {} ({r}); {done} of {} ops were already enqueued",
                chunk.len(),
                cuda.error_string(r),
                ops.len()
            );
            for (i, o) in chunk.iter().enumerate() {
                gds_info!(F, "op[{}] {o}", done + i);
            }
            return Err(errno_of(r));
        }
        if dump {
            for (i, o) in chunk.iter().enumerate() {
                gds_info!(F, "op[{}] {o}", done + i);
            }
        }
        done += chunk.len();
    }
    Ok(())
}

/// Buffers one submission needs, kept per thread so that a steady stream of calls allocates
/// nothing (see [`with_scratch`]).
#[derive(Default)]
pub struct Scratch {
    pub descs: Vec<Desc>,
    ops: Vec<MemOp>,
    params: Vec<BatchMemOpParams>,
}

impl Scratch {
    /// Larger buffers than this are not kept after a call (one huge call must not pin memory).
    const KEEP: usize = 4 * MAX_BATCH;

    fn trim(&mut self) {
        self.descs.clear();
        if self.descs.capacity() > Self::KEEP {
            self.descs = Vec::new();
        }
        if self.ops.capacity() > Self::KEEP {
            self.ops = Vec::new();
        }
        if self.params.capacity() > MAX_BATCH {
            self.params = Vec::new();
        }
    }
}

/// Runs `f` with this thread's [`Scratch`]. The buffers are taken out of the thread-local slot
/// for the call (an empty set stays behind), so a nested call or one during thread exit simply
/// starts from empty buffers.
pub fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    thread_local! {
        static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::default();
    }
    let mut s = SCRATCH.try_with(std::cell::Cell::take).unwrap_or_default();
    let r = f(&mut s);
    s.trim();
    let _ = SCRATCH.try_with(|c| c.set(s));
    r
}

/// `gds_stream_post_descriptors` after the C layer copied the descriptors into `scratch.descs`.
pub fn stream_post(
    cuda: &dyn Cuda,
    env: &Settings,
    peers: &Peers,
    mm: &MemMgr,
    ranges: &Ranges,
    stream: usize,
    scratch: &mut Scratch,
) -> Result<()> {
    let Scratch { descs, ops, params } = scratch;
    if descs.is_empty() {
        return Ok(());
    }
    // Every GPU alike: the stream's device cannot matter (peer.rs); otherwise resolve it.
    let (caps, resolved) = match peers.uniform(cuda, env) {
        Some(c) => (c, false),
        None => (peers.from_stream(cuda, env, stream)?, true),
    };
    translate_into(&caps, ranges, descs, &mut |p, s, t| mm.map_mem(cuda, p, s, t), ops)?;
    gds_dbg!("gds_stream_post_descriptors", "{} descriptors -> {} memops", descs.len(), ops.len());
    let relaxed = !env.disable_weak_consistency && caps.has_weak;
    let r = submit_with(cuda, stream, ops, relaxed, env.enable_dump_memops, params);
    if resolved { r } else { classify_refusal(cuda, stream, r) }
}

/// After a submission on a stream that was not looked up first (uniform capabilities): a stream
/// the driver refused gets upstream's answer for a stream whose context cannot be found (EINVAL,
/// with its log line); other failures stay as they are.
fn classify_refusal(cuda: &dyn Cuda, stream: usize, r: Result<()>) -> Result<()> {
    r.map_err(|e| peer::device_of_stream(cuda, stream).err().unwrap_or(e))
}

/// At most this many descriptors take [`post_values`].
pub const FAST_MAX: usize = 4;

/// [`stream_post`] for up to [`FAST_MAX`] WAIT_VALUE32/WRITE_VALUE32 descriptors (a flag wait
/// plus a flag write is the call a stream-synchronised program makes per step) when every GPU is
/// alike: the memops go from the descriptors into one stack array and one driver call, with the
/// same checks, flags, log lines and errors as the general path. Everything it reads besides the
/// descriptors and the registration cache is on `line` ([`PostLine`]).
pub fn post_values(line: &PostLine, stream: usize, descs: impl Iterator<Item = ValueDesc>) -> Result<()> {
    const F: &str = "gds_stream_post_descriptors";
    let mut params = [BatchMemOpParams::default(); FAST_MAX];
    let mut map = |p, s, t| line.mm.map_mem(line.cuda, p, s, t);
    let mut n = 0;
    for (d, slot) in descs.zip(params.iter_mut()) {
        match value_op(&line.caps, d, &mut map) {
            Ok(op) => *slot = op.to_params(),
            Err(err) => {
                gds_err!(F, "descriptor {n} failed: {err}");
                return Err(err);
            }
        }
        n += 1;
    }
    if n == 0 {
        return Ok(());
    }
    let ops = &mut params[..n];
    let r = line.cuda.batch_mem_op(stream, ops, line.batch_flags);
    batch_done(line, stream, ops, r)
}

/// What follows a value batch's driver call: the dump of its memops where
/// `GDS_ENABLE_DUMP_MEMOPS` asks for it, or the refusal's log lines and errno (upstream's answer
/// for a stream the driver refused).
pub fn batch_done(line: &PostLine, stream: usize, ops: &[BatchMemOpParams], r: CuRes<()>) -> Result<()> {
    let r = match r {
        Ok(()) => {
            if line.dump_memops {
                dump_params("gds_stream_batch_ops", ops);
            }
            Ok(())
        }
        Err(r) => Err(batch_failed(line.cuda, ops, r)),
    };
    classify_refusal(line.cuda, stream, r)
}

/// A place for one memop's parameters: initialised (tests) or not (the unguarded post, which
/// saves zeroing its stack array: it reads back only the slots written).
pub trait ParamSlot {
    fn put(&mut self, p: BatchMemOpParams);
}

impl ParamSlot for BatchMemOpParams {
    #[inline(always)]
    fn put(&mut self, p: BatchMemOpParams) {
        *self = p;
    }
}

impl ParamSlot for MaybeUninit<BatchMemOpParams> {
    #[inline(always)]
    fn put(&mut self, p: BatchMemOpParams) {
        self.write(p);
    }
}

/// The memops of [`post_values`]'s common case, built without a log line, a registration or a
/// lock: every descriptor a value descriptor whose flags need no warning (no NOR where the GPU
/// lacks it, no remote flush where it cannot flush), whose word is aligned and translated by
/// this thread's memo `memo` ([`MemMgr::remembered_by`]). Writes them to the front of `params`
/// and returns how many; `None` (nothing written that matters) for anything else, which
/// [`post_values`] then handles with its checks, logs and errors. The same memops as
/// [`post_values`] builds (the unit test compares them). Panic-free and without a call, for the
/// export's unguarded path.
#[inline(always)]
pub fn plain_values(
    caps: &Caps,
    mm: &MemMgr,
    memo: &Memo,
    descs: impl Iterator<Item = Option<ValueDesc>>,
    params: &mut [impl ParamSlot; FAST_MAX],
) -> Option<usize> {
    let mut n = 0;
    for (d, slot) in descs.zip(params.iter_mut()) {
        slot.put(plain_op(caps, mm, memo, d?)?.to_params());
        n += 1;
    }
    (n > 0).then_some(n)
}

/// One descriptor's memop for [`plain_values`], or `None`.
#[inline(always)]
fn plain_op(caps: &Caps, mm: &MemMgr, memo: &Memo, d: ValueDesc) -> Option<MemOp> {
    match d {
        ValueDesc::Wait { ptr, value, cond, flags } => {
            let flush = flags & GDS_WAIT_POST_FLUSH_REMOTE != 0;
            let plain = wait_value32_ok(cond, flags)
                && (cond != GDS_WAIT_COND_NOR || caps.has_wait_nor)
                && (!flush || caps.has_remote_flush);
            let addr = plain.then(|| plain_addr(mm, memo, ptr, flags)).flatten()?;
            Some(MemOp::Wait32 { addr, value, flags: if flush { cond | CU_STREAM_WAIT_VALUE_FLUSH } else { cond } })
        }
        ValueDesc::Write { ptr, value, flags } => {
            let addr = write_value32_ok(flags).then(|| plain_addr(mm, memo, ptr, flags)).flatten()?;
            Some(MemOp::Write32 { addr, value, flags: write_flags(caps, flags & GDS_WRITE_PRE_BARRIER_SYS != 0) })
        }
    }
}

/// The device address of the aligned word at `ptr` (of the memory type in `flags`), from this
/// thread's memo, if aligned too.
#[inline(always)]
fn plain_addr(mm: &MemMgr, memo: &Memo, ptr: usize, flags: i32) -> Option<u64> {
    (ptr & 3 == 0).then(|| mm.remembered_by(memo, ptr, 4, flags & GDS_MEMORY_MASK)).flatten().filter(|a| a & 3 == 0)
}

/// A refused batch: its log lines (the error and every op) and its errno.
#[cold]
#[inline(never)]
fn batch_failed(cuda: &dyn Cuda, ops: &[BatchMemOpParams], r: CuResult) -> Errno {
    gds_err!("gds_stream_batch_ops", "cuStreamBatchMemOp({} ops) failed: {} ({r})", ops.len(), cuda.error_string(r));
    dump_params("gds_stream_batch_ops", ops);
    errno_of(r)
}

fn dump_params(origin: &str, params: &[BatchMemOpParams]) {
    for (i, p) in params.iter().enumerate() {
        gds_info!(origin, "op[{i}] {}", MemOp::from_params(p).map_or_else(|| format!("{p:?}"), |o| o.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::testcuda::{DEV_OFFSET, FakeCuda};
    use crate::engine::memo;
    use crate::engine::ranges::Range;

    fn caps() -> Caps {
        // v1-driver behaviour: writes without barrier are expressible.
        Caps {
            device: 0,
            has_memops: true,
            has_remote_flush: true,
            has_write64: true,
            write_no_barrier: true,
            ..Default::default()
        }
    }

    #[test]
    fn v2_drivers_get_every_write_with_its_barrier() {
        let r = Ranges::default();
        let c = Caps { write_no_barrier: false, ..caps() };
        let (ops, _, _) = send_ops(&r);
        let d = [Desc::WriteValue32 { ptr: 0x20, value: 1, flags: GDS_MEMORY_HOST }, Desc::Send(ops)];
        let got = translate(&c, &r, &d, &mut identity).unwrap();
        assert_eq!(got.len(), 3);
        for o in got {
            match o {
                MemOp::Write32 { flags, .. } | MemOp::Write64 { flags, .. } => {
                    assert_eq!(flags, CU_STREAM_WRITE_VALUE_DEFAULT, "{o}")
                }
                MemOp::Wait32 { .. } => unreachable!(),
            }
        }
    }
    fn identity(p: usize, _s: usize, t: i32) -> Result<u64> {
        if t == GDS_MEMORY_GPU || t == GDS_MEMORY_HOST || t == GDS_MEMORY_IO {
            Ok(p as u64)
        } else {
            Err(Errno::EINVAL)
        }
    }

    #[test]
    fn value32_descriptors_translate_to_waits_and_writes() {
        let r = Ranges::default();
        let descs = [
            Desc::WaitValue32 { ptr: 0x1000, value: 5, cond: GDS_WAIT_COND_GEQ, flags: GDS_MEMORY_HOST },
            Desc::WaitValue32 {
                ptr: 0x1004,
                value: 6,
                cond: GDS_WAIT_COND_EQ,
                flags: GDS_MEMORY_GPU | GDS_WAIT_POST_FLUSH_REMOTE,
            },
            Desc::WaitValue32 { ptr: 0x1008, value: 1, cond: GDS_WAIT_COND_AND, flags: GDS_MEMORY_IO },
            Desc::WriteValue32 { ptr: 0x2000, value: 7, flags: GDS_MEMORY_HOST },
            Desc::WriteValue32 { ptr: 0x2004, value: 8, flags: GDS_MEMORY_HOST | GDS_WRITE_PRE_BARRIER_SYS },
        ];
        let ops = translate(&caps(), &r, &descs, &mut identity).unwrap();
        assert_eq!(
            ops,
            vec![
                MemOp::Wait32 { addr: 0x1000, value: 5, flags: 0 },
                MemOp::Wait32 { addr: 0x1004, value: 6, flags: 1 | CU_STREAM_WAIT_VALUE_FLUSH },
                MemOp::Wait32 { addr: 0x1008, value: 1, flags: 2 },
                MemOp::Write32 { addr: 0x2000, value: 7, flags: CU_STREAM_WRITE_VALUE_NO_MEMORY_BARRIER },
                MemOp::Write32 { addr: 0x2004, value: 8, flags: CU_STREAM_WRITE_VALUE_DEFAULT },
            ]
        );
    }

    #[test]
    fn flush_is_dropped_without_the_capability_and_nor_needs_it() {
        let r = Ranges::default();
        let c = Caps { has_remote_flush: false, ..caps() };
        let d = [Desc::WaitValue32 {
            ptr: 0x10,
            value: 1,
            cond: GDS_WAIT_COND_GEQ,
            flags: GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH_REMOTE,
        }];
        assert_eq!(
            translate(&c, &r, &d, &mut identity).unwrap(),
            vec![MemOp::Wait32 { addr: 0x10, value: 1, flags: 0 }]
        );
        let nor = [Desc::WaitValue32 { ptr: 0x10, value: 1, cond: GDS_WAIT_COND_NOR, flags: GDS_MEMORY_HOST }];
        assert_eq!(translate(&caps(), &r, &nor, &mut identity), Err(Errno::EINVAL));
        let c = Caps { has_wait_nor: true, ..caps() };
        assert_eq!(
            translate(&c, &r, &nor, &mut identity).unwrap(),
            vec![MemOp::Wait32 { addr: 0x10, value: 1, flags: 3 }]
        );
    }

    #[test]
    fn bad_arguments_are_refused() {
        let r = Ranges::default();
        let bad = [
            Desc::WaitValue32 { ptr: 0x10, value: 1, cond: 4, flags: GDS_MEMORY_HOST },
            Desc::WaitValue32 { ptr: 0x10, value: 1, cond: 0, flags: GDS_MEMORY_HOST | 0x100 },
            Desc::WaitValue32 { ptr: 0x10, value: 1, cond: 0, flags: 0 },
            Desc::WaitValue32 { ptr: 0x12, value: 1, cond: 0, flags: GDS_MEMORY_HOST },
            Desc::WriteValue32 { ptr: 0x10, value: 1, flags: GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH_REMOTE },
            Desc::WriteValue32 { ptr: 0x10, value: 1, flags: GDS_MEMORY_GPU | GDS_MEMORY_HOST },
            Desc::WriteValue32 { ptr: 0x11, value: 1, flags: GDS_MEMORY_GPU },
            Desc::WriteMemory { dest: 0x10, src: 0x20, count: 4, flags: GDS_MEMORY_HOST },
            Desc::WriteMemory { dest: 0x10, src: 0x20, count: 4, flags: GDS_MEMORY_HOST | 0x40 },
        ];
        for d in bad {
            assert_eq!(translate(&caps(), &r, std::slice::from_ref(&d), &mut identity), Err(Errno::EINVAL), "{d:?}");
        }
    }

    fn send_ops(r: &Ranges) -> (Vec<PeerOp>, u64, u64) {
        let dbr = r.register(Range { cpu: 0x5000, dev: 0xd000, len: 64 });
        let bf = r.register(Range { cpu: 0x6000, dev: 0xb000, len: 4096 });
        let ops = vec![
            PeerOp::StoreDword { data: 0x0100_0000, target: dbr, offset: 4 },
            PeerOp::Fence {
                flags: IBV_EXP_PEER_FENCE_OP_WRITE | IBV_EXP_PEER_FENCE_FROM_HCA | IBV_EXP_PEER_FENCE_MEM_SYS,
            },
            PeerOp::StoreQword { data: 0x1122_3344_5566_7788, target: bf, offset: 0 },
        ];
        (ops, dbr, bf)
    }

    #[test]
    fn mlx5_send_list_with_and_without_write64() {
        let r = Ranges::default();
        let (ops, _, _) = send_ops(&r);
        let got = translate(&caps(), &r, &[Desc::Send(ops.clone())], &mut identity).unwrap();
        assert_eq!(
            got,
            vec![
                MemOp::Write32 { addr: 0xd004, value: 0x0100_0000, flags: 1 },
                MemOp::Write64 { addr: 0xb000, value: 0x1122_3344_5566_7788, flags: 0 },
            ]
        );
        let c = Caps { has_write64: false, ..caps() };
        let got = translate(&c, &r, &[Desc::Send(ops)], &mut identity).unwrap();
        assert_eq!(
            got,
            vec![
                MemOp::Write32 { addr: 0xd004, value: 0x0100_0000, flags: 1 },
                MemOp::Write32 { addr: 0xb000, value: 0x5566_7788, flags: 0 },
                MemOp::Write32 { addr: 0xb004, value: 0x1122_3344, flags: 1 },
            ]
        );
    }

    fn wait_ops(r: &Ranges, op: u32) -> Vec<PeerOp> {
        let cq = r.register(Range { cpu: 0x8000, dev: 0xc000, len: 4096 });
        let flag = r.register(Range { cpu: 0x9000, dev: 0xf000, len: 64 });
        vec![
            PeerOp::Poll { op, data: 0x0100_0000, target: cq, offset: 60 },
            PeerOp::StoreDword { data: 0, target: flag, offset: 8 },
        ]
    }

    #[test]
    fn wait_lists_and_flush_coalescing() {
        let r = Ranges::default();
        let w1 = wait_ops(&r, IBV_EXP_PEER_OP_POLL_AND_DWORD);
        let w2 = wait_ops(&r, IBV_EXP_PEER_OP_POLL_GEQ_DWORD);
        let (s, _, _) = send_ops(&r);
        let f = CU_STREAM_WAIT_VALUE_FLUSH;
        // WAIT, WAIT: only the last one flushes.
        let got = translate(&caps(), &r, &[Desc::Wait(w1.clone()), Desc::Wait(w2.clone())], &mut identity).unwrap();
        assert_eq!(got[0], MemOp::Wait32 { addr: 0xc03c, value: 0x0100_0000, flags: GDS_WAIT_COND_AND });
        assert_eq!(got[1], MemOp::Write32 { addr: 0xf008, value: 0, flags: 1 });
        assert_eq!(got[2], MemOp::Wait32 { addr: 0xc03c, value: 0x0100_0000, flags: f });
        // WAIT, SEND, WAIT, WRITE: the trailing write does not stop coalescing.
        let d = [
            Desc::Wait(w1.clone()),
            Desc::Send(s.clone()),
            Desc::Wait(w2.clone()),
            Desc::WriteValue32 { ptr: 0x40, value: 1, flags: GDS_MEMORY_HOST },
        ];
        let got = translate(&caps(), &r, &d, &mut identity).unwrap();
        let waits: Vec<u32> =
            got.iter().filter_map(|o| if let MemOp::Wait32 { flags, .. } = o { Some(*flags) } else { None }).collect();
        assert_eq!(waits, vec![GDS_WAIT_COND_AND, f]);
        // WAIT, WAIT, SEND: a send after the last wait disables coalescing: both flush.
        let d = [Desc::Wait(w1), Desc::Wait(w2), Desc::Send(s)];
        let got = translate(&caps(), &r, &d, &mut identity).unwrap();
        let waits: Vec<u32> =
            got.iter().filter_map(|o| if let MemOp::Wait32 { flags, .. } = o { Some(*flags) } else { None }).collect();
        assert_eq!(waits, vec![GDS_WAIT_COND_AND | f, f]);
    }

    #[test]
    fn bad_peer_ops_fail() {
        let r = Ranges::default();
        let id = r.register(Range { cpu: 0x1000, dev: 0x2000, len: 8 });
        let cases = [
            vec![PeerOp::Other(IBV_EXP_PEER_OP_RESERVED1)],
            vec![PeerOp::CopyBlock { data: vec![0; 8], target: id, offset: 0 }],
            vec![PeerOp::StoreDword { data: 0, target: 12345, offset: 0 }],
            vec![PeerOp::StoreDword { data: 0, target: id, offset: 6 }],
            vec![PeerOp::StoreQword { data: 0, target: id, offset: 4 }],
        ];
        for ops in cases {
            assert_eq!(
                translate(&caps(), &r, &[Desc::Send(ops.clone())], &mut identity),
                Err(Errno::EINVAL),
                "{ops:?}"
            );
        }
        let no_memops = Caps { has_memops: false, ..caps() };
        let ok = vec![PeerOp::StoreDword { data: 0, target: id, offset: 0 }];
        assert_eq!(translate(&no_memops, &r, &[Desc::Send(ok)], &mut identity), Err(Errno::EINVAL));
    }

    #[test]
    fn batches_split_at_the_driver_limit_in_order() {
        let cuda = FakeCuda::new();
        let ops: Vec<MemOp> =
            (0..600u32).map(|i| MemOp::Write32 { addr: 0x1000 + 4 * u64::from(i), value: i, flags: 0 }).collect();
        cuda.stream_ctx(0x77, 0xc1, 0);
        submit(&cuda, 0x77, &ops, false, false).unwrap();
        let b = cuda.batches();
        assert_eq!(b.iter().map(|x| x.1.len()).collect::<Vec<_>>(), vec![255, 255, 90]);
        let values: Vec<u64> = b.iter().flat_map(|x| x.1.iter().map(|p| p.value64)).collect();
        assert_eq!(values, (0..600u64).collect::<Vec<_>>());
        assert!(b.iter().all(|x| x.0 == 0x77 && x.2 == 0));
        assert_eq!(
            b[0].1[0],
            BatchMemOpParams { operation: 2, address: 0x1000, value64: 0, flags: 0, ..Default::default() }
        );
    }

    #[test]
    fn driver_errors_become_errnos() {
        let cuda = FakeCuda::new();
        let ops = [MemOp::Wait32 { addr: 0x10, value: 1, flags: 0 }];
        cuda.fail_batch(0, 801);
        assert_eq!(submit(&cuda, 1, &ops, false, false), Err(Errno::EPERM));
        cuda.fail_batch(0, 1);
        assert_eq!(submit(&cuda, 1, &ops, false, false), Err(Errno::EINVAL));
        cuda.fail_batch(0, 700);
        assert_eq!(submit(&cuda, 1, &ops, false, false), Err(Errno::EIO));
    }

    #[test]
    fn stream_post_registers_host_memory_and_uses_the_streams_device() {
        let cuda = FakeCuda::new();
        cuda.stream_ctx(0x5000_0000, 0xc7, 1);
        let env = Settings::default();
        let (peers, mm, r) = (Peers::default(), MemMgr::default(), Ranges::default());
        let word = Box::new(0u32);
        let p = &*word as *const u32 as usize;
        let d = [
            Desc::WaitValue32 { ptr: p, value: 1, cond: GDS_WAIT_COND_GEQ, flags: GDS_MEMORY_HOST },
            Desc::WriteValue32 { ptr: p, value: 2, flags: GDS_MEMORY_HOST },
        ];
        let post = |stream: usize, d: &[Desc]| {
            let mut s = Scratch { descs: d.to_vec(), ..Default::default() };
            stream_post(&cuda, &env, &peers, &mm, &r, stream, &mut s)
        };
        post(0x5000_0000, &d).unwrap();
        let b = cuda.batches();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].1[0].address, p as u64 + DEV_OFFSET);
        assert_eq!(b[0].1[1].address, p as u64 + DEV_OFFSET);
        assert_eq!(cuda.registered().len(), 1);
        // One GPU: the stream's device is not looked up on the way (peers.uniform).
        assert_eq!(cuda.stream_lookups(), 0);
        post(0x5000_0000, &d).unwrap();
        assert_eq!((cuda.stream_lookups(), cuda.registered().len(), cuda.batches().len()), (0, 1, 2));
        // Unknown stream: the driver refuses the batch, the answer is EINVAL as upstream's lookup
        // gives, and nothing was enqueued.
        assert_eq!(post(0x6000_0000, &d), Err(Errno::EINVAL));
        assert_eq!(cuda.batches().len(), 2);
        // Nothing to do: no driver call at all.
        post(0x6000_0000, &[]).unwrap();
    }

    #[test]
    fn gpus_that_differ_resolve_the_stream_every_call() {
        let cuda = FakeCuda::new();
        cuda.set_device_count(Some(2));
        cuda.stream_ctx(0x5000_0000, 0xc7, 1);
        let env = Settings::default();
        let (peers, mm, r) = (Peers::default(), MemMgr::default(), Ranges::default());
        // Device 1 was probed earlier with a capability device 0 lacks: not uniform.
        cuda.set_attr(123, 1);
        let env_nor = Settings::from_lookup(|n| (n == "GDS_DISABLE_WAIT_NOR").then(|| "0".into()));
        let _ = peers.caps(&cuda, &env_nor, 1);
        cuda.set_attr(123, 0);
        let word = Box::new(0u32);
        let p = &*word as *const u32 as usize;
        let d = [Desc::WaitValue32 { ptr: p, value: 1, cond: GDS_WAIT_COND_NOR, flags: GDS_MEMORY_HOST }];
        let mut s = Scratch { descs: d.to_vec(), ..Default::default() };
        stream_post(&cuda, &env, &peers, &mm, &r, 0x5000_0000, &mut s).unwrap();
        assert_eq!(cuda.stream_lookups(), 1, "stream resolved");
        assert_eq!(cuda.batches()[0].1[0].flags, GDS_WAIT_COND_NOR, "device 1's capabilities were used");
        // Unknown stream: EINVAL from the lookup, before any work.
        let mut s = Scratch { descs: d.to_vec(), ..Default::default() };
        assert_eq!(stream_post(&cuda, &env, &peers, &mm, &r, 0x6000_0000, &mut s), Err(Errno::EINVAL));
        assert_eq!(cuda.batches().len(), 1);
    }

    #[test]
    fn plain_values_are_the_value_path_s_memops_or_nothing() {
        let word = Box::new([0u32; 4]);
        let p = word.as_ptr() as usize;
        let wait = |cond, flags| ValueDesc::Wait { ptr: p, value: 7, cond, flags };
        let write = |ptr, flags| ValueDesc::Write { ptr, value: 9, flags };
        for (nor, flush, no_barrier) in [(false, false, false), (true, true, true), (true, false, true)] {
            let caps = Caps { has_wait_nor: nor, has_remote_flush: flush, write_no_barrier: no_barrier, ..caps() };
            // (descriptor, whether the plain path must take it)
            let cases = [
                (wait(GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST), true),
                (wait(GDS_WAIT_COND_EQ, GDS_MEMORY_GPU), true),
                (wait(GDS_WAIT_COND_AND, GDS_MEMORY_IO), true),
                (wait(GDS_WAIT_COND_NOR, GDS_MEMORY_HOST), nor),
                (wait(GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH_REMOTE), flush),
                (wait(9, GDS_MEMORY_HOST), false),
                (wait(GDS_WAIT_COND_GEQ, 0), false),
                (ValueDesc::Wait { ptr: p + 2, value: 0, cond: GDS_WAIT_COND_GEQ, flags: GDS_MEMORY_HOST }, false),
                (write(p + 4, GDS_MEMORY_HOST), true),
                (write(p + 8, GDS_MEMORY_GPU | GDS_WRITE_PRE_BARRIER_SYS), true),
                (write(p + 4, GDS_MEMORY_HOST | 0x100), false),
                (write(0, GDS_MEMORY_HOST), false),
            ];
            for (d, plain) in cases {
                let cuda = FakeCuda::new();
                let mm = MemMgr::default();
                let mut params = [BatchMemOpParams::default(); FAST_MAX];
                let once = || std::iter::once(Some(d));
                assert!(
                    plain_values(&caps, &mm, &memo::get(), once(), &mut params).is_none(),
                    "{d:?}: nothing translated yet"
                );
                // The value path's memop (what `post_values` submits); it registers the word's page.
                let general = value_op(&caps, d, &mut |p, s, t| mm.map_mem(&cuda, p, s, t));
                let built = plain_values(&caps, &mm, &memo::get(), once(), &mut params).map(|n| params[..n].to_vec());
                assert_eq!(built.is_some(), plain, "{d:?} with {caps:?}");
                if let Some(ops) = built {
                    assert_eq!(general.map(|op| vec![op.to_params()]), Ok(ops), "{d:?}: the same memop");
                }
            }
            // Several at once, and any descriptor that is not a value one, stop it all.
            let mm = MemMgr::default();
            let cuda = FakeCuda::new();
            mm.map_mem(&cuda, p, 16, GDS_MEMORY_HOST).expect("registered");
            let mut params = [BatchMemOpParams::default(); FAST_MAX];
            let two = [Some(wait(GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST)), Some(write(p + 4, GDS_MEMORY_HOST))];
            assert_eq!(plain_values(&caps, &mm, &memo::get(), two.into_iter(), &mut params), Some(2));
            assert!(plain_values(&caps, &mm, &memo::get(), [two[0], None].into_iter(), &mut params).is_none());
        }
    }

    #[test]
    fn value_fast_path_matches_the_general_path() {
        let env = Settings::default();
        let word = Box::new([0u32; 4]);
        let p = word.as_ptr() as usize;
        let vals = [
            ValueDesc::Wait { ptr: p, value: 1, cond: GDS_WAIT_COND_GEQ, flags: GDS_MEMORY_HOST },
            ValueDesc::Write { ptr: p + 4, value: 2, flags: GDS_MEMORY_HOST | GDS_WRITE_PRE_BARRIER_SYS },
            ValueDesc::Wait { ptr: p + 8, value: 3, cond: GDS_WAIT_COND_AND, flags: GDS_MEMORY_GPU },
        ];
        let run = |fast: bool| {
            let cuda = FakeCuda::new();
            cuda.stream_ctx(0x5000_0000, 0xc7, 0);
            let (peers, mm, r) = (Peers::default(), MemMgr::default(), Ranges::default());
            let res = if fast {
                let line = PostLine::new(&cuda, &env, &peers, &mm).expect("uniform");
                post_values(&line, 0x5000_0000, vals.iter().copied())
            } else {
                let mut s = Scratch { descs: vals.iter().map(|&v| Desc::from(v)).collect(), ..Default::default() };
                stream_post(&cuda, &env, &peers, &mm, &r, 0x5000_0000, &mut s)
            };
            (res, cuda.batches(), cuda.registered())
        };
        let (fast, slow) = (run(true), run(false));
        assert_eq!(fast.0, Ok(()));
        assert_eq!(fast, slow, "same driver calls, same registrations");
        assert_eq!(fast.1.len(), 1);
        assert_eq!(fast.1[0].1.len(), 3);

        // Errors: a bad descriptor submits nothing; an unknown stream is EINVAL; a refused batch
        // is the driver's error. (GPUs that differ have no line: post_line's test.)
        let cuda = FakeCuda::new();
        let (peers, mm) = (Peers::default(), MemMgr::default());
        let line = PostLine::new(&cuda, &env, &peers, &mm).expect("uniform");
        let bad = [vals[0], ValueDesc::Write { ptr: p + 2, value: 0, flags: GDS_MEMORY_HOST }];
        cuda.stream_ctx(0x5000_0000, 0xc7, 0);
        assert_eq!(post_values(&line, 0x5000_0000, bad.into_iter()), Err(Errno::EINVAL));
        assert!(cuda.batches().is_empty());
        assert_eq!(post_values(&line, 0x6000_0000, vals.into_iter()), Err(Errno::EINVAL));
        assert!(cuda.batches().is_empty());
        assert_eq!(post_values(&line, 0x5000_0000, std::iter::empty()), Ok(()));
        cuda.fail_batch(0, crate::cuda::CUDA_ERROR_OUT_OF_MEMORY);
        assert_eq!(post_values(&line, 0x5000_0000, vals.into_iter()), Err(Errno::ENOMEM));
        assert!(cuda.batches().is_empty());
    }

    #[test]
    fn scratch_is_reused_and_nested_calls_are_safe() {
        let outer = with_scratch(|s| {
            s.descs.push(Desc::WriteValue32 { ptr: 4, value: 1, flags: GDS_MEMORY_HOST });
            // A nested use (never on the real paths) gets its own empty buffers.
            let inner = with_scratch(|t| t.descs.len());
            (inner, s.descs.len())
        });
        assert_eq!(outer, (0, 1));
        assert!(with_scratch(|s| s.descs.is_empty()), "descriptors do not leak into the next call");
        // Capacity is kept for the next call on this thread.
        with_scratch(|s| s.ops.reserve(16));
        assert!(with_scratch(|s| s.ops.capacity() >= 16));
    }
}
