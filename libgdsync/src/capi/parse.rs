//! Reading the application's structures: descriptors, prepared requests and the peer-op lists
//! in them are copied, once, into the safe values of [`crate::engine::memops`] (`Desc`, `PeerOp`,
//! `ValueDesc`); nothing below the C layer dereferences application pointers, except the CPU
//! executor and the mapped-memory helpers. Every refusal is logged and is `EINVAL`.

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::engine::memops::{self, Desc, MAX_INLINE_COPY, PeerOp, ValueDesc};

/// Logs `what` and returns EINVAL. Cold and out of line: the checks of the hot entry points
/// (the prepare calls a post is made of) then keep no logging code, and no saved register, on
/// their way through.
#[cold]
#[inline(never)]
pub(super) fn einval(origin: &str, what: &str) -> Errno {
    gds_err!(origin, "{what}");
    Errno::EINVAL
}

/// A 32-bit word pointer from the application must be non-NULL and 4-byte aligned.
#[inline]
pub(super) fn dword_ptr_ok(ptr: *mut u32) -> bool {
    !ptr.is_null() && (ptr as usize) & 3 == 0
}

/// [`dword_ptr_ok`], reported under `origin` when it fails.
#[inline]
pub(super) fn check_dword_ptr(origin: &str, ptr: *mut u32) -> Result<()> {
    if dword_ptr_ok(ptr) { Ok(()) } else { bad_dword_ptr(origin, ptr) }
}

#[cold]
pub(super) fn bad_dword_ptr(origin: &str, ptr: *mut u32) -> Result<()> {
    Err(einval(origin, &format!("invalid pointer {ptr:p}")))
}

/// Copies the first `entries` ops of a request's own `wr` array.
///
/// Upstream walks the `next` pointers from `storage`; a prepared request always links `wr[i]` to
/// `wr[i+1]`, so reading the array by index is the same list, and stays correct when the
/// application copied the request after preparing it.
pub(super) fn parse_ops(origin: &str, wr: &[PeerOpWr], entries: u32) -> Result<Vec<PeerOp>> {
    let n = entries as usize;
    if n > wr.len() {
        return Err(einval(origin, &format!("request claims {n} ops, more than its {} slots", wr.len())));
    }
    wr[..n].iter().map(|op| parse_op(origin, op)).collect()
}

pub(super) fn parse_op(origin: &str, op: &PeerOpWr) -> Result<PeerOp> {
    // Union reads below: every variant is plain integers/pointers, so any bit pattern is a valid
    // value; the op type says which one the provider wrote.
    Ok(match op.type_ {
        IBV_EXP_PEER_OP_FENCE => {
            // SAFETY: see above.
            let flags = unsafe { op.wr.fence_flags };
            PeerOp::Fence { flags }
        }
        IBV_EXP_PEER_OP_STORE_DWORD => {
            // SAFETY: see above.
            let d = unsafe { op.wr.dword_va };
            PeerOp::StoreDword { data: d.data, target: d.target_id, offset: d.offset }
        }
        IBV_EXP_PEER_OP_STORE_QWORD => {
            // SAFETY: see above.
            let q = unsafe { op.wr.qword_va };
            PeerOp::StoreQword { data: q.data, target: q.target_id, offset: q.offset }
        }
        IBV_EXP_PEER_OP_POLL_AND_DWORD | IBV_EXP_PEER_OP_POLL_NOR_DWORD | IBV_EXP_PEER_OP_POLL_GEQ_DWORD => {
            // SAFETY: see above.
            let d = unsafe { op.wr.dword_va };
            PeerOp::Poll { op: op.type_, data: d.data, target: d.target_id, offset: d.offset }
        }
        IBV_EXP_PEER_OP_COPY_BLOCK => {
            // SAFETY: see above.
            let c = unsafe { op.wr.copy_op };
            if c.src.is_null() || c.len > MAX_INLINE_COPY {
                return Err(einval(origin, &format!("COPY_BLOCK of {} bytes from {:p}", c.len, c.src)));
            }
            // SAFETY: the provider that prepared the op made `src` point to `len` readable bytes
            // (its WQE in the send queue); len is bounded above.
            let data = unsafe { std::slice::from_raw_parts(c.src as *const u8, c.len) }.to_vec();
            PeerOp::CopyBlock { data, target: c.target_id, offset: c.offset }
        }
        t => PeerOp::Other(t),
    })
}

/// # Safety
/// `d` is a descriptor from the application; its `send`/`wait` pointer, if that is the tag, must
/// point to a live request.
pub(super) unsafe fn parse_desc(origin: &str, d: &Descriptor) -> Result<Desc> {
    // Union reads: the tag selects the member; all members are plain data.
    Ok(match d.tag {
        GDS_TAG_SEND => {
            // SAFETY: see above.
            let p = unsafe { d.u.send };
            // SAFETY: non-NULL request pointers are live (caller's contract).
            let r = unsafe { p.as_ref() }.ok_or_else(|| einval(origin, "SEND descriptor with a NULL request"))?;
            Desc::Send(parse_ops(origin, &r.wr, r.commit.entries)?)
        }
        GDS_TAG_WAIT => {
            // SAFETY: see above.
            let p = unsafe { d.u.wait };
            // SAFETY: as above.
            let r = unsafe { p.as_ref() }.ok_or_else(|| einval(origin, "WAIT descriptor with a NULL request"))?;
            Desc::Wait(parse_ops(origin, &r.wr, r.peek.entries)?)
        }
        GDS_TAG_WAIT_VALUE32 | GDS_TAG_WRITE_VALUE32 => value_desc(d).expect("tag checked above").into(),
        GDS_TAG_WRITE_MEMORY => {
            // SAFETY: see above.
            let w = unsafe { d.u.writemem };
            Desc::WriteMemory { dest: w.dest as usize, src: w.src as usize, count: w.count, flags: w.flags }
        }
        t => return Err(einval(origin, &format!("invalid descriptor tag {t}"))),
    })
}

/// # Safety
/// `descs` is NULL or points to `n` descriptors (see [`parse_desc`]).
pub(super) unsafe fn parse_descs(origin: &str, n: usize, descs: *const Descriptor) -> Result<Vec<Desc>> {
    let mut v = Vec::new();
    // SAFETY: forwarded contract.
    unsafe { parse_descs_into(origin, n, descs, &mut v) }?;
    Ok(v)
}

/// [`parse_descs`] appending to `out` (the hot path reuses a per-thread buffer).
///
/// # Safety
/// As [`parse_descs`].
pub(super) unsafe fn parse_descs_into(
    origin: &str,
    n: usize,
    descs: *const Descriptor,
    out: &mut Vec<Desc>,
) -> Result<()> {
    if n == 0 {
        return Ok(());
    }
    if descs.is_null() {
        return Err(einval(origin, "NULL descriptor array"));
    }
    // SAFETY: the caller passes `n` descriptors at `descs` (non-NULL checked).
    let s = unsafe { std::slice::from_raw_parts(descs, n) };
    out.reserve(n);
    for d in s {
        // SAFETY: per-descriptor contract forwarded.
        out.push(unsafe { parse_desc(origin, d) }?);
    }
    Ok(())
}

/// The descriptors, when there are 1..=[`memops::FAST_MAX`] of them, whatever their tags: the
/// unguarded post's first test ([`value_desc`] then turns away any that is not a value
/// descriptor, which sends the whole post to the guarded path).
///
/// # Safety
/// As [`parse_descs`].
#[inline(always)]
pub(super) unsafe fn few_descs<'a>(n: usize, descs: *const Descriptor) -> Option<&'a [Descriptor]> {
    // SAFETY: the caller passes `n` descriptors at `descs` (non-NULL checked).
    (n.wrapping_sub(1) < memops::FAST_MAX && !descs.is_null()).then(|| unsafe { std::slice::from_raw_parts(descs, n) })
}

/// The descriptors, when there are 1..=[`memops::FAST_MAX`] of them and all are
/// WAIT_VALUE32/WRITE_VALUE32 (the shape [`memops::post_values`] takes); `None` otherwise.
///
/// # Safety
/// As [`parse_descs`].
pub(super) unsafe fn value_descs<'a>(n: usize, descs: *const Descriptor) -> Option<&'a [Descriptor]> {
    // SAFETY: forwarded contract.
    let s = unsafe { few_descs(n, descs) }?;
    s.iter().all(|d| matches!(d.tag, GDS_TAG_WAIT_VALUE32 | GDS_TAG_WRITE_VALUE32)).then_some(s)
}

/// A WAIT_VALUE32/WRITE_VALUE32 descriptor's values; `None` for the other tags.
pub(super) fn value_desc(d: &Descriptor) -> Option<ValueDesc> {
    // Union reads: the tag selects the member; all members are plain data, any bits valid.
    Some(match d.tag {
        GDS_TAG_WAIT_VALUE32 => {
            // SAFETY: see above.
            let w = unsafe { d.u.wait32 };
            ValueDesc::Wait { ptr: w.ptr as usize, value: w.value, cond: w.cond_flags, flags: w.flags }
        }
        GDS_TAG_WRITE_VALUE32 => {
            // SAFETY: see above.
            let w = unsafe { d.u.write32 };
            ValueDesc::Write { ptr: w.ptr as usize, value: w.value, flags: w.flags }
        }
        _ => return None,
    })
}
