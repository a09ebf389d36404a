//! `gdsync/core.h`: parameters, QPs and CQs (through the verbs provider), and descriptors.

use std::ffi::{c_int, c_void};
use std::ptr::NonNull;

use gpudirect_common::{Errno, Result};

use crate::abi::*;
use crate::capi::hooks::Gds;
use crate::capi::parse::*;
use crate::capi::post::{post, post_plain, post_scratch};
use crate::engine::memops::{self, Desc};
use crate::engine::post_line::process_line;
use crate::engine::ranges::ranges;
use crate::verbs::provider;

// ---------------------------------------------------------------------------------------------
// gdsync/core.h: parameters

gpudirect_common::export! {
    library = Gds;

    /// `int gds_query_param(gds_param_t param, int *value)`
    ///
    /// # Safety
    /// `value` is NULL or writable.
    pub unsafe fn gds_query_param(param: c_int, value: *mut c_int) -> c_int {
        if value.is_null() {
            return Err(einval("gds_query_param", "NULL value"));
        }
        match param {
            GDS_PARAM_VERSION => {
                // SAFETY: non-NULL, writable per the contract.
                unsafe { value.write(GDS_API_VERSION as c_int) };
                Ok(())
            }
            p => Err(einval("gds_query_param", &format!("unknown param {p}"))),
        }
    }

    // ---------------------------------------------------------------------------------------------
    // gdsync/core.h: QPs and CQs (verbs provider)

    /// `struct gds_qp *gds_create_qp(struct ibv_pd *, struct ibv_context *, gds_qp_init_attr_t *,
    /// int gpu_id, int flags)`
    ///
    /// # Safety
    /// Pointers are NULL or valid verbs objects / attributes.
    on_panic(null_with_errno(Errno::EIO)) pub unsafe fn gds_create_qp(
        pd: *mut c_void,
        context: *mut c_void,
        qp_init_attr: *mut c_void,
        gpu_id: c_int,
        flags: c_int,
    ) -> *mut GdsQp {
        // SAFETY: the export's contract.
        match unsafe { create_qp(pd, context, qp_init_attr, gpu_id, flags) } {
            Ok(p) => p.as_ptr(),
            Err(e) => null_with_errno(e),
        }
    }

    /// `int gds_destroy_qp(struct gds_qp *qp)`
    ///
    /// # Safety
    /// `qp` is NULL or came from `gds_create_qp`.
    pub unsafe fn gds_destroy_qp(qp: *mut GdsQp) -> c_int {
        match NonNull::new(qp) {
            None => Ok(()),
            // SAFETY: from gds_create_qp per the contract.
            Some(q) => unsafe { provider().destroy_qp(q) },
        }
    }
}

/// [`gds_create_qp`]'s work, under its guard.
///
/// # Safety
/// As [`gds_create_qp`].
unsafe fn create_qp(
    pd: *mut c_void,
    context: *mut c_void,
    qp_init_attr: *mut c_void,
    gpu_id: c_int,
    flags: c_int,
) -> Result<NonNull<GdsQp>> {
    const F: &str = "gds_create_qp";
    crate::fork::check(F)?;
    let allowed = GDS_CREATE_QP_WQ_ON_GPU
        | GDS_CREATE_QP_TX_CQ_ON_GPU
        | GDS_CREATE_QP_RX_CQ_ON_GPU
        | GDS_CREATE_QP_WQ_DBREC_ON_GPU;
    if flags & !allowed != 0 {
        return Err(einval(F, &format!("invalid flags {flags:#x}")));
    }
    if pd.is_null() || context.is_null() || qp_init_attr.is_null() {
        return Err(einval(F, "NULL pd, context or attributes"));
    }
    if !(0..16).contains(&gpu_id) {
        return Err(einval(F, &format!("invalid GPU id {gpu_id}")));
    }
    // SAFETY: non-NULL application pointers, forwarded.
    unsafe { provider().create_qp(pd, context, qp_init_attr, gpu_id, flags) }
}

/// NULL with `errno` set to `e`: upstream's failure convention for a pointer-returning function.
fn null_with_errno<T>(e: Errno) -> *mut T {
    // SAFETY: errno is thread-local; writing it is always allowed.
    unsafe { *libc::__errno_location() = e.0 };
    std::ptr::null_mut()
}

/// The QP as a non-NULL pointer whose `qp` member is set.
///
/// # Safety
/// `qp` is NULL or points to a `struct gds_qp`.
unsafe fn live_qp(origin: &str, qp: *mut GdsQp) -> Result<NonNull<GdsQp>> {
    // SAFETY: NULL or a valid gds_qp.
    match unsafe { qp.as_ref() } {
        Some(q) if !q.qp.is_null() => Ok(NonNull::from(q)),
        _ => Err(einval(origin, "NULL QP")),
    }
}

pub(super) fn init_send_request(r: &mut SendRequest) {
    // SAFETY: all-zero bytes are a valid SendRequest (integers and NULL pointers).
    *r = unsafe { std::mem::zeroed() };
    let base = r.wr.as_mut_ptr();
    for i in 0..GDS_SEND_INFO_MAX_OPS - 1 {
        r.wr[i].next = base.wrapping_add(i + 1);
    }
    r.commit.storage = base;
    r.commit.entries = GDS_SEND_INFO_MAX_OPS as u32;
}

fn init_wait_request(r: &mut WaitRequest, offset: u32) {
    // SAFETY: all-zero bytes are a valid WaitRequest.
    *r = unsafe { std::mem::zeroed() };
    let base = r.wr.as_mut_ptr();
    for i in 0..GDS_WAIT_INFO_MAX_OPS - 1 {
        r.wr[i].next = base.wrapping_add(i + 1);
    }
    r.peek.storage = base;
    r.peek.entries = GDS_WAIT_INFO_MAX_OPS as u32;
    r.peek.whence = IBV_EXP_PEER_PEEK_ABSOLUTE;
    r.peek.offset = offset;
}

/// Prepares a send into `request` (upstream's gds_prepare_send body).
///
/// # Safety
/// As `gds_prepare_send`.
unsafe fn prepare_send(
    qp: *mut GdsQp,
    wr: *mut c_void,
    bad_wr: *mut *mut c_void,
    request: &mut SendRequest,
) -> Result<()> {
    init_send_request(request);
    // SAFETY: forwarded contract.
    let q = unsafe { live_qp("gds_prepare_send", qp) }?;
    // SAFETY: forwarded contract.
    unsafe { provider().prepare_send(q, wr, bad_wr, request) }
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_prepare_send(struct gds_qp *, gds_send_wr *, gds_send_wr **bad_wr, gds_send_request_t *)`
    ///
    /// # Safety
    /// `request` is NULL or writable; the others as for ibv_post_send.
    pub unsafe fn gds_prepare_send(
        qp: *mut GdsQp,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
        request: *mut SendRequest,
    ) -> c_int {
        // SAFETY: NULL or writable per the contract.
        let req = unsafe { request.as_mut() }.ok_or_else(|| einval("gds_prepare_send", "NULL request"))?;
        // SAFETY: forwarded contract.
        unsafe { prepare_send(qp, wr, bad_wr, req) }
    }

    /// `int gds_post_send(struct gds_qp *, gds_send_wr *, gds_send_wr **bad_wr)`: CPU-rung send.
    ///
    /// # Safety
    /// As for ibv_post_send.
    pub unsafe fn gds_post_send(qp: *mut GdsQp, wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int {
        // SAFETY: all-zero is a valid request; it is initialised again by prepare_send.
        let mut req: Box<SendRequest> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: forwarded contract.
        unsafe { prepare_send(qp, wr, bad_wr, &mut req) }?;
        let ops = parse_ops("gds_post_send", &req.wr, req.commit.entries)?;
        // SAFETY: the ops name ranges the provider registered for this QP.
        if let Err(e) = unsafe { crate::engine::cpu::peer_ops(&ops, ranges()) } {
            // SAFETY: prepare_send succeeded, so qp is live.
            let q = unsafe { live_qp("gds_post_send", qp) }?;
            // SAFETY: as above.
            let _ = unsafe { provider().rollback_send(q, req.commit.rollback_id) };
            return Err(e);
        }
        // SAFETY: prepare_send succeeded, so qp is live.
        let q = unsafe { live_qp("gds_post_send", qp) }?;
        provider().after_cpu_send(q);
        Ok(())
    }

    /// `int gds_post_recv(struct gds_qp *, struct ibv_recv_wr *, struct ibv_recv_wr **bad_wr)`
    ///
    /// # Safety
    /// As for ibv_post_recv.
    pub unsafe fn gds_post_recv(qp: *mut GdsQp, wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int {
        // SAFETY: forwarded contract.
        let q = unsafe { live_qp("gds_post_recv", qp) }?;
        // SAFETY: forwarded contract.
        unsafe { provider().post_recv(q, wr, bad_wr) }
    }

    /// `int gds_stream_queue_send(CUstream, struct gds_qp *, gds_send_wr *, gds_send_wr **bad_wr)`
    ///
    /// # Safety
    /// As `gds_prepare_send`; `stream` is a live stream or a predefined handle.
    pub unsafe fn gds_stream_queue_send(
        stream: CuStream,
        qp: *mut GdsQp,
        wr: *mut c_void,
        bad_wr: *mut *mut c_void,
    ) -> c_int {
        if wr.is_null() {
            return Err(einval("gds_stream_queue_send", "NULL work request"));
        }
        // SAFETY: all-zero is a valid request.
        let mut req: Box<SendRequest> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: forwarded contract.
        unsafe { prepare_send(qp, wr, bad_wr, &mut req) }?;
        let ops = parse_ops("gds_stream_queue_send", &req.wr, req.commit.entries)?;
        post(stream, vec![Desc::Send(ops)])
    }
}

/// # Safety
/// `request` is NULL or points to `count` requests.
unsafe fn send_descs(origin: &str, count: c_int, request: *const SendRequest) -> Result<Vec<Desc>> {
    if request.is_null() || count <= 0 {
        return Err(einval(origin, &format!("NULL request or count {count}")));
    }
    // SAFETY: `count` requests at `request` per the contract.
    let reqs = unsafe { std::slice::from_raw_parts(request, count as usize) };
    reqs.iter().map(|r| parse_ops(origin, &r.wr, r.commit.entries).map(Desc::Send)).collect()
}

/// # Safety
/// `request` is NULL or points to `count` requests.
unsafe fn wait_descs(origin: &str, count: c_int, request: *const WaitRequest) -> Result<Vec<Desc>> {
    if request.is_null() || count <= 0 {
        return Err(einval(origin, &format!("NULL request or count {count}")));
    }
    // SAFETY: `count` requests at `request` per the contract.
    let reqs = unsafe { std::slice::from_raw_parts(request, count as usize) };
    reqs.iter().map(|r| parse_ops(origin, &r.wr, r.peek.entries).map(Desc::Wait)).collect()
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_stream_post_send(CUstream, gds_send_request_t *)`
    ///
    /// # Safety
    /// `request` is NULL or a prepared request; `stream` a live stream or predefined handle.
    pub unsafe fn gds_stream_post_send(stream: CuStream, request: *mut SendRequest) -> c_int {
        // SAFETY: forwarded contract (one request).
        let d = unsafe { send_descs("gds_stream_post_send", 1, request) }?;
        post(stream, d)
    }

    /// `int gds_stream_post_send_all(CUstream, int count, gds_send_request_t *)`
    ///
    /// # Safety
    /// `request` is NULL or `count` prepared requests.
    pub unsafe fn gds_stream_post_send_all(stream: CuStream, count: c_int, request: *mut SendRequest) -> c_int {
        // SAFETY: forwarded contract.
        let d = unsafe { send_descs("gds_stream_post_send_all", count, request) }?;
        post(stream, d)
    }
}

/// Prepares a wait (upstream's gds_prepare_wait_cq body).
///
/// # Safety
/// `cq` points to a `struct gds_cq`.
unsafe fn prepare_wait(cq: NonNull<GdsCq>, request: &mut WaitRequest) -> Result<()> {
    // SAFETY: valid gds_cq per the contract; the offset is claimed even if the provider fails,
    // as upstream does, so later waits keep targeting the right CQEs.
    let offset = unsafe {
        let c = &mut *cq.as_ptr();
        let o = c.curr_offset;
        c.curr_offset = o.wrapping_add(1);
        o
    };
    init_wait_request(request, offset);
    // SAFETY: forwarded contract.
    unsafe { provider().prepare_wait(cq, request) }
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_prepare_wait_cq(struct gds_cq *, gds_wait_request_t *, int flags)`
    ///
    /// # Safety
    /// `cq` is NULL or a QP's CQ; `request` NULL or writable.
    pub unsafe fn gds_prepare_wait_cq(cq: *mut GdsCq, request: *mut WaitRequest, flags: c_int) -> c_int {
        const F: &str = "gds_prepare_wait_cq";
        if flags != 0 {
            return Err(einval(F, &format!("invalid flags {flags:#x}")));
        }
        // SAFETY: NULL or writable.
        let req = unsafe { request.as_mut() }.ok_or_else(|| einval(F, "NULL request"))?;
        let cq = NonNull::new(cq).ok_or_else(|| einval(F, "NULL CQ"))?;
        // SAFETY: forwarded contract.
        unsafe { prepare_wait(cq, req) }
    }

    /// `int gds_stream_post_wait_cq(CUstream, gds_wait_request_t *)`
    ///
    /// # Safety
    /// As `gds_stream_post_send`.
    pub unsafe fn gds_stream_post_wait_cq(stream: CuStream, request: *mut WaitRequest) -> c_int {
        // SAFETY: forwarded contract.
        let d = unsafe { wait_descs("gds_stream_post_wait_cq", 1, request) }?;
        post(stream, d)
    }

    /// `int gds_stream_post_wait_cq_all(CUstream, int count, gds_wait_request_t *)`
    ///
    /// # Safety
    /// As `gds_stream_post_send_all`.
    pub unsafe fn gds_stream_post_wait_cq_all(
        stream: CuStream,
        count: c_int,
        request: *mut WaitRequest,
    ) -> c_int {
        // SAFETY: forwarded contract.
        let d = unsafe { wait_descs("gds_stream_post_wait_cq_all", count, request) }?;
        post(stream, d)
    }

    /// `int gds_stream_wait_cq(CUstream, struct gds_cq *, int flags)`
    ///
    /// # Safety
    /// As `gds_prepare_wait_cq` plus a live stream.
    pub unsafe fn gds_stream_wait_cq(stream: CuStream, cq: *mut GdsCq, flags: c_int) -> c_int {
        const F: &str = "gds_stream_wait_cq";
        let cq = NonNull::new(cq).ok_or_else(|| einval(F, "NULL CQ"))?;
        if stream.is_null() {
            return Err(einval(F, "NULL stream"));
        }
        if flags != 0 {
            return Err(einval(F, &format!("invalid flags {flags:#x}")));
        }
        // SAFETY: all-zero is a valid request.
        let mut req: Box<WaitRequest> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: forwarded contract. Unlike upstream (which returned 0), a failure is reported.
        unsafe { prepare_wait(cq, &mut req) }?;
        let ops = parse_ops(F, &req.wr, req.peek.entries)?;
        if let Err(e) = post(stream, vec![Desc::Wait(ops)]) {
            // SAFETY: forwarded contract.
            let _ = unsafe { provider().abort_wait(cq, req.peek.peek_id) };
            return Err(e);
        }
        Ok(())
    }

    /// `int gds_post_wait_cq(struct gds_cq *, gds_wait_request_t *, int flags)`
    ///
    /// # Safety
    /// `cq` NULL or a QP's CQ; `request` NULL or a prepared request.
    pub unsafe fn gds_post_wait_cq(cq: *mut GdsCq, request: *mut WaitRequest, flags: c_int) -> c_int {
        const F: &str = "gds_post_wait_cq";
        if flags != 0 {
            return Err(einval(F, &format!("invalid flags {flags:#x}")));
        }
        let cq = NonNull::new(cq).ok_or_else(|| einval(F, "NULL CQ"))?;
        // SAFETY: NULL or readable.
        let req = unsafe { request.as_ref() }.ok_or_else(|| einval(F, "NULL request"))?;
        // SAFETY: forwarded contract.
        unsafe { provider().abort_wait(cq, req.peek.peek_id) }
    }

    // ---------------------------------------------------------------------------------------------
    // gdsync/core.h: descriptors

    /// `int gds_prepare_wait_value32(gds_wait_value32_t *, uint32_t *ptr, uint32_t value,
    /// gds_wait_cond_flag_t, int flags)`
    ///
    /// # Safety
    /// `desc` is NULL or writable.
    unguarded pub unsafe fn gds_prepare_wait_value32(
        desc: *mut WaitValue32,
        ptr: *mut u32,
        value: u32,
        cond_flags: u32,
        flags: c_int,
    ) -> c_int {
        if crate::fork::settled()
            && !desc.is_null()
            && memops::wait_value32_ok(cond_flags, flags)
            && dword_ptr_ok(ptr)
        {
            // The common case, unguarded: a few tests and one store, no call, so nothing here can
            // panic, and the call needs no stack frame (inside the guard, whose landing pad is on
            // the same function, it saved six registers). Everything else jumps to the guarded body,
            // out of line, which tests again and reports.
            // SAFETY: non-NULL, and writable per the contract.
            unsafe { desc.write(WaitValue32 { ptr, value, cond_flags, flags }) };
            return 0;
        }
        // SAFETY: forwarded contract.
        unsafe { prepare_wait_value32_guarded(desc, ptr, value, cond_flags, flags) }
    }
}

/// [`gds_prepare_wait_value32`] under the guard, for everything but the common case. `extern "C"`
/// like the export (nothing unwinds out of the guard), so the export reaches it with a jump and
/// needs no stack frame.
///
/// # Safety
/// As [`gds_prepare_wait_value32`].
#[inline(never)]
unsafe extern "C" fn prepare_wait_value32_guarded(
    desc: *mut WaitValue32,
    ptr: *mut u32,
    value: u32,
    cond_flags: u32,
    flags: c_int,
) -> c_int {
    gpudirect_common::guarded!(Gds, "gds_prepare_wait_value32", -> c_int {
        const F: &str = "gds_prepare_wait_value32";
        // SAFETY: NULL or writable.
        let d = unsafe { desc.as_mut() }.ok_or_else(|| einval(F, "NULL descriptor"))?;
        memops::check_wait_value32(cond_flags, flags)?;
        check_dword_ptr(F, ptr)?;
        *d = WaitValue32 { ptr, value, cond_flags, flags };
        Ok(())
    })
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_prepare_write_value32(gds_write_value32_t *, uint32_t *ptr, uint32_t value, int flags)`
    ///
    /// # Safety
    /// `desc` is NULL or writable.
    unguarded pub unsafe fn gds_prepare_write_value32(
        desc: *mut WriteValue32,
        ptr: *mut u32,
        value: u32,
        flags: c_int,
    ) -> c_int {
        if crate::fork::settled() && !desc.is_null() && memops::write_value32_ok(flags) && dword_ptr_ok(ptr) {
            // The common case, unguarded, as in `gds_prepare_wait_value32`.
            // SAFETY: non-NULL, and writable per the contract.
            unsafe { desc.write(WriteValue32 { ptr, value, flags }) };
            return 0;
        }
        // SAFETY: forwarded contract.
        unsafe { prepare_write_value32_guarded(desc, ptr, value, flags) }
    }
}

/// [`gds_prepare_write_value32`] under the guard, for everything but the common case (`extern
/// "C"` as [`prepare_wait_value32_guarded`]).
///
/// # Safety
/// As [`gds_prepare_write_value32`].
#[inline(never)]
unsafe extern "C" fn prepare_write_value32_guarded(
    desc: *mut WriteValue32,
    ptr: *mut u32,
    value: u32,
    flags: c_int,
) -> c_int {
    gpudirect_common::guarded!(Gds, "gds_prepare_write_value32", -> c_int {
        const F: &str = "gds_prepare_write_value32";
        // SAFETY: NULL or writable.
        let d = unsafe { desc.as_mut() }.ok_or_else(|| einval(F, "NULL descriptor"))?;
        memops::check_write_value32(flags)?;
        check_dword_ptr(F, ptr)?;
        *d = WriteValue32 { ptr, value, flags };
        Ok(())
    })
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_prepare_write_memory(gds_write_memory_t *, uint8_t *dest, const uint8_t *src, size_t count, int flags)`
    ///
    /// # Safety
    /// `desc` is NULL or writable.
    pub unsafe fn gds_prepare_write_memory(
        desc: *mut WriteMemory,
        dest: *mut u8,
        src: *const u8,
        count: usize,
        flags: c_int,
    ) -> c_int {
        const F: &str = "gds_prepare_write_memory";
        // SAFETY: NULL or writable.
        let d = unsafe { desc.as_mut() }.ok_or_else(|| einval(F, "NULL descriptor"))?;
        memops::check_write_memory(flags)?;
        if count > 0 && (dest.is_null() || src.is_null()) {
            return Err(einval(F, "NULL destination or source"));
        }
        *d = WriteMemory { dest, src, count, flags };
        Ok(())
    }

    /// `int gds_stream_post_descriptors(CUstream, size_t n_descs, gds_descriptor_t *descs, int flags)`
    ///
    /// # Safety
    /// `descs` is NULL or `n_descs` descriptors whose pointers are valid; `stream` live or predefined.
    unguarded pub unsafe fn gds_stream_post_descriptors(
        stream: CuStream,
        n_descs: usize,
        descs: *mut Descriptor,
        flags: c_int,
    ) -> c_int {
        // The common case, unguarded as the prepares' is (see `post_plain`).
        if flags == 0
            // SAFETY: forwarded contract.
            && let Some(values) = unsafe { few_descs(n_descs, descs) }
            && let Some(r) = post_plain(stream, values.iter().map(value_desc))
        {
            return r;
        }
        // SAFETY: forwarded contract.
        unsafe { post_descriptors_guarded(stream, n_descs, descs, flags) }
    }
}

/// [`gds_stream_post_descriptors`] under the guard, for everything but its common case.
///
/// # Safety
/// As [`gds_stream_post_descriptors`].
#[inline(never)]
unsafe fn post_descriptors_guarded(stream: CuStream, n_descs: usize, descs: *mut Descriptor, flags: c_int) -> c_int {
    gpudirect_common::guarded!(Gds, "gds_stream_post_descriptors", -> c_int {
        if flags != 0 {
            gds_dbg!("gds_stream_post_descriptors", "flags {flags:#x} ignored (reserved, as upstream)");
        }
        // SAFETY: forwarded contract.
        if let Some(values) = unsafe { value_descs(n_descs, descs) }
            && let Some(line) = process_line()?
        {
            return memops::post_values(line, stream as usize, values.iter().filter_map(value_desc));
        }
        memops::with_scratch(|s| {
            // SAFETY: forwarded contract.
            unsafe { parse_descs_into("gds_stream_post_descriptors", n_descs, descs, &mut s.descs) }?;
            post_scratch(stream, s)
        })
    })
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_post_descriptors(size_t n_descs, gds_descriptor_t *descs, int flags)`: CPU execution.
    ///
    /// # Safety
    /// As `gds_stream_post_descriptors`; every pointer must be CPU-accessible.
    pub unsafe fn gds_post_descriptors(n_descs: usize, descs: *mut Descriptor, flags: c_int) -> c_int {
        let _ = flags; // forwarded to the op-list executor upstream, where it has no effect
        // SAFETY: forwarded contract.
        let d = unsafe { parse_descs("gds_post_descriptors", n_descs, descs) }?;
        // SAFETY: forwarded contract.
        unsafe { crate::engine::cpu::execute(&d, ranges()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_param() {
        let mut v = 0;
        // SAFETY: valid out pointer / NULL.
        unsafe {
            assert_eq!(gds_query_param(GDS_PARAM_VERSION, &mut v), 0);
            assert_eq!(v, 0x0002_0002);
            assert_eq!(gds_query_param(1, &mut v), libc::EINVAL);
            assert_eq!(gds_query_param(GDS_PARAM_VERSION, std::ptr::null_mut()), libc::EINVAL);
        }
    }

    #[test]
    fn prepare_functions_check_and_store() {
        let mut word = 0u32;
        let mut w = WaitValue32 { ptr: std::ptr::null_mut(), value: 0, cond_flags: 0, flags: 0 };
        // SAFETY: valid pointers or NULL where the test says so.
        unsafe {
            assert_eq!(
                gds_prepare_wait_value32(
                    &mut w,
                    &mut word,
                    5,
                    GDS_WAIT_COND_EQ,
                    GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH_REMOTE
                ),
                0
            );
            assert_eq!((w.value, w.cond_flags, w.flags), (5, 1, GDS_MEMORY_HOST | GDS_WAIT_POST_FLUSH_REMOTE));
            assert_eq!(gds_prepare_wait_value32(&mut w, &mut word, 5, 4, GDS_MEMORY_HOST), libc::EINVAL);
            assert_eq!(
                gds_prepare_wait_value32(&mut w, &mut word, 5, 0, GDS_WRITE_PRE_BARRIER_SYS | GDS_MEMORY_HOST),
                libc::EINVAL
            );
            assert_eq!(gds_prepare_wait_value32(std::ptr::null_mut(), &mut word, 5, 0, GDS_MEMORY_HOST), libc::EINVAL);
            let mut x = WriteValue32 { ptr: std::ptr::null_mut(), value: 0, flags: 0 };
            assert_eq!(gds_prepare_write_value32(&mut x, &mut word, 9, GDS_MEMORY_GPU | GDS_WRITE_PRE_BARRIER_SYS), 0);
            assert_eq!(x.value, 9);
            assert_eq!(
                gds_prepare_write_value32(&mut x, &mut word, 9, GDS_MEMORY_GPU | GDS_WAIT_POST_FLUSH_REMOTE),
                libc::EINVAL
            );
            assert_eq!(gds_prepare_write_value32(&mut x, std::ptr::null_mut(), 9, GDS_MEMORY_GPU), libc::EINVAL);
            // Refusals leave the descriptor as it was, on the fast path's tests as on the guarded
            // body's: a misaligned word, two memory types.
            let odd = (&raw mut word).cast::<u8>().wrapping_add(1).cast::<u32>();
            assert_eq!(gds_prepare_write_value32(&mut x, odd, 7, GDS_MEMORY_HOST), libc::EINVAL);
            assert_eq!(gds_prepare_write_value32(&mut x, &mut word, 7, GDS_MEMORY_HOST | GDS_MEMORY_GPU), libc::EINVAL);
            assert_eq!(gds_prepare_wait_value32(&mut w, odd, 7, GDS_WAIT_COND_EQ, GDS_MEMORY_HOST), libc::EINVAL);
            assert_eq!(
                gds_prepare_wait_value32(&mut w, &mut word, 7, GDS_WAIT_COND_EQ, GDS_MEMORY_HOST | GDS_MEMORY_IO),
                libc::EINVAL
            );
            assert_eq!((x.value, w.value), (9, 5));
            let mut m = WriteMemory { dest: std::ptr::null_mut(), src: std::ptr::null(), count: 0, flags: 0 };
            let src = [1u8; 8];
            let mut dst = [0u8; 8];
            assert_eq!(
                gds_prepare_write_memory(
                    &mut m,
                    dst.as_mut_ptr(),
                    src.as_ptr(),
                    8,
                    GDS_MEMORY_HOST | GDS_WRITE_MEMORY_PRE_BARRIER_SYS
                ),
                0
            );
            assert_eq!(m.count, 8);
            assert_eq!(
                gds_prepare_write_memory(&mut m, dst.as_mut_ptr(), src.as_ptr(), 8, GDS_MEMORY_HOST | 0x80),
                libc::EINVAL
            );
        }
    }

    #[test]
    fn verbs_entry_points_check_arguments() {
        let mut cq = GdsCq { cq: std::ptr::null_mut(), curr_offset: 7 };
        // SAFETY: all-zero is a valid request.
        let mut req: Box<WaitRequest> = Box::new(unsafe { std::mem::zeroed() });
        // SAFETY: valid pointers / NULL where intended.
        unsafe {
            assert_eq!(gds_prepare_wait_cq(&mut cq, &mut *req, 1), libc::EINVAL);
            assert_eq!(gds_prepare_wait_cq(&mut cq, &mut *req, 0), libc::EINVAL, "not a CQ of a gds QP");
            assert_eq!(cq.curr_offset, 8, "the CQE index is claimed as upstream does");
            assert_eq!(req.peek.offset, 7);
            assert_eq!(req.peek.entries, 32);
            assert_eq!(req.peek.storage, req.wr.as_mut_ptr());
            let second = &mut req.wr[1] as *mut PeerOpWr;
            assert_eq!(req.wr[0].next, second);
            assert!(req.wr[31].next.is_null());
            assert_eq!(gds_destroy_qp(std::ptr::null_mut()), 0);
            assert!(gds_create_qp(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), 0, 0).is_null());
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
            let mut attr = [0u8; 152];
            let (pd, ctx) = (8usize as *mut c_void, 16usize as *mut c_void);
            assert!(gds_create_qp(pd, ctx, attr.as_mut_ptr().cast(), 0, 0x40).is_null());
            assert_eq!(*libc::__errno_location(), libc::EINVAL);
            assert!(gds_create_qp(pd, ctx, attr.as_mut_ptr().cast(), 16, 0).is_null(), "GPU id out of range");
            assert_eq!(gds_post_wait_cq(&mut cq, &mut *req, 0), libc::EINVAL);
            let mut fake = GdsQp {
                qp: 8usize as *mut c_void,
                send_cq: GdsCq { cq: std::ptr::null_mut(), curr_offset: 0 },
                recv_cq: GdsCq { cq: std::ptr::null_mut(), curr_offset: 0 },
                res_domain: std::ptr::null_mut(),
                dev_context: std::ptr::null_mut(),
            };
            assert_eq!(
                gds_post_recv(&mut fake, std::ptr::null_mut(), std::ptr::null_mut()),
                libc::EINVAL,
                "unknown QP"
            );
            assert_eq!(gds_destroy_qp(&mut fake), libc::EINVAL, "unknown QP");
            assert_eq!(gds_post_recv(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut()), libc::EINVAL);
            // SAFETY: all-zero is a valid request.
            let mut s: Box<SendRequest> = Box::new(std::mem::zeroed());
            assert_eq!(
                gds_prepare_send(std::ptr::null_mut(), std::ptr::null_mut(), std::ptr::null_mut(), &mut *s),
                libc::EINVAL
            );
            assert_eq!(s.commit.entries, 32, "request initialised before the QP check, as upstream");
        }
    }

    #[test]
    fn descriptor_parsing_rejects_bad_input_before_any_work() {
        // SAFETY: the arrays are valid for their lengths; NULL where intended.
        unsafe {
            let mut d = [Descriptor { tag: 9, u: DescriptorUnion { send: std::ptr::null_mut() } }];
            assert_eq!(gds_post_descriptors(1, d.as_mut_ptr(), 0), libc::EINVAL);
            assert_eq!(gds_post_descriptors(1, std::ptr::null_mut(), 0), libc::EINVAL);
            assert_eq!(gds_post_descriptors(0, std::ptr::null_mut(), 0), 0);
            d[0].tag = GDS_TAG_SEND;
            assert_eq!(gds_post_descriptors(1, d.as_mut_ptr(), 0), libc::EINVAL, "NULL request");
            let mut req: Box<SendRequest> = Box::new(std::mem::zeroed());
            req.commit.entries = 33;
            d[0].u.send = &mut *req;
            assert_eq!(gds_post_descriptors(1, d.as_mut_ptr(), 0), libc::EINVAL, "too many ops");
            req.commit.entries = 0;
            assert_eq!(gds_post_descriptors(1, d.as_mut_ptr(), 0), 0, "empty send is a no-op");
            assert_eq!(gds_stream_post_send_all(std::ptr::null_mut(), 0, &mut *req), libc::EINVAL);
        }
    }
}
