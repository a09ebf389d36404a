//! Stream submission shared by the exports of every header: a list of parsed descriptors
//! ([`post`], [`post_scratch`]), and the unguarded common case of a value post ([`post_plain`]).

use std::ffi::c_int;

use gpudirect_common::Result;

use crate::abi::*;
use crate::capi::hooks::Gds;
use crate::cuda::{CuRes, cuda};
use crate::engine::memmgr::memmgr;
use crate::engine::memo;
use crate::engine::memops::{self, Desc, Scratch};
use crate::engine::peer::peers;
use crate::engine::post_line::{self, PostLine};
use crate::engine::ranges::ranges;
use crate::env::settings;

/// Submits `descs` on `stream` (the descriptor lists built by the verbs entry points).
pub(super) fn post(stream: CuStream, descs: Vec<Desc>) -> Result<()> {
    if descs.is_empty() {
        return Ok(());
    }
    memops::with_scratch(|s| {
        s.descs = descs;
        post_scratch(stream, s)
    })
}

/// Submits the descriptors already parsed into `s.descs`.
pub(super) fn post_scratch(stream: CuStream, s: &mut Scratch) -> Result<()> {
    if s.descs.is_empty() {
        return Ok(());
    }
    let c = cuda()?;
    memops::stream_post(c, settings(), peers(), memmgr(), ranges(), stream as usize, s)
}

/// The common case of a value post, unguarded: up to FAST_MAX value descriptors (a flag wait and
/// write) whose words this thread translated before, once a post has made the post line
/// (`memops::plain_values`). No call but the driver's own (which cannot unwind into us), so
/// nothing here can panic; a batch the driver refused goes on under the guard for its log lines
/// and errno. `None` (nothing done) for everything else, which the caller's guarded body handles.
#[inline(always)]
pub(super) fn post_plain(stream: CuStream, values: impl Iterator<Item = Option<memops::ValueDesc>>) -> Option<c_int> {
    if !crate::fork::settled() {
        return None;
    }
    let line = post_line::ready()?;
    let entry = line.batch?;
    let mut params = [std::mem::MaybeUninit::uninit(); memops::FAST_MAX];
    // SAFETY: used by `plain_values` only, which reads the memo and writes nothing of it.
    let memo = unsafe { memo::in_place() };
    let n = memops::plain_values(&line.caps, line.mm, memo, values, &mut params)?;
    // SAFETY: `plain_values` wrote the first `n` slots (`1 <= n <= FAST_MAX`).
    let ops = unsafe { std::slice::from_raw_parts_mut(params.as_mut_ptr().cast::<BatchMemOpParams>(), n) };
    let r = entry.call(stream as usize, ops, line.batch_flags);
    if r.is_ok() && !line.dump_memops {
        return Some(0);
    }
    Some(plain_batch_done(line, stream, ops, r))
}

/// The rest of a plain batch under the guard: its dump, or its refusal's log lines and errno.
#[cold]
#[inline(never)]
fn plain_batch_done(line: &PostLine, stream: CuStream, ops: &[BatchMemOpParams], r: CuRes<()>) -> c_int {
    gpudirect_common::guarded!(Gds, "gds_stream_post_descriptors", -> c_int {
        memops::batch_done(line, stream as usize, ops, r)
    })
}
