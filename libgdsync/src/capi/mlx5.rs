//! `gdsync/mlx5.h`: the peer ops of prepared requests, and a dword wait, described in the terms
//! of an mlx5 doorbell and CQE poll, for programs that drive the NIC themselves.

use std::ffi::c_int;

use gpudirect_common::Result;

use crate::abi::*;
use crate::capi::hooks::Gds;
use crate::capi::parse::*;
use crate::cuda::cuda;
use crate::engine::memmgr::memmgr;
use crate::engine::ranges::ranges;

/// Fills `infos[j]` with `info_of(&requests[j])` for each of the `count` requests, stopping at the
/// first error: the shared loop of `gds_mlx5_get_send_info` and `gds_mlx5_get_wait_info`.
///
/// # Safety
/// `requests` and `infos` are NULL or arrays of `count` elements, `infos` writable.
unsafe fn info_per_request<R, I>(
    origin: &str,
    count: c_int,
    requests: *const R,
    infos: *mut I,
    info_of: impl Fn(&R) -> Result<I>,
) -> Result<()> {
    if count < 0 || (count > 0 && (requests.is_null() || infos.is_null())) {
        return Err(einval(origin, "NULL arrays or negative count"));
    }
    for j in 0..count as usize {
        // SAFETY: j < count elements per the contract.
        let r = unsafe { &*requests.add(j) };
        let info = info_of(r)?;
        // SAFETY: j < count elements, writable.
        unsafe { infos.add(j).write(info) };
    }
    Ok(())
}

gpudirect_common::export! {
    library = Gds;

    /// `int gds_mlx5_get_send_info(int count, const gds_send_request_t *, gds_mlx5_send_info_t *)`
    ///
    /// # Safety
    /// `requests` and `infos` are NULL or arrays of `count` elements.
    pub unsafe fn gds_mlx5_get_send_info(
        count: c_int,
        requests: *const SendRequest,
        infos: *mut Mlx5SendInfo,
    ) -> c_int {
        const F: &str = "gds_mlx5_get_send_info";
        // SAFETY: forwarded contract.
        unsafe {
            info_per_request(F, count, requests, infos, |r: &SendRequest| {
                crate::engine::mlx5_info::send_info(&parse_ops(F, &r.wr, r.commit.entries)?, ranges())
            })
        }
    }

    /// `int gds_mlx5_get_wait_info(int count, const gds_wait_request_t *, gds_mlx5_wait_info_t *)`
    ///
    /// # Safety
    /// As `gds_mlx5_get_send_info`.
    pub unsafe fn gds_mlx5_get_wait_info(
        count: c_int,
        requests: *const WaitRequest,
        infos: *mut Mlx5WaitInfo,
    ) -> c_int {
        const F: &str = "gds_mlx5_get_wait_info";
        // SAFETY: forwarded contract.
        unsafe {
            info_per_request(F, count, requests, infos, |r: &WaitRequest| {
                crate::engine::mlx5_info::wait_info(&parse_ops(F, &r.wr, r.peek.entries)?, ranges())
            })
        }
    }

    /// `int gds_mlx5_get_dword_wait_info(uint32_t *ptr, uint32_t value, int flags, gds_mlx5_dword_wait_info_t *)`
    ///
    /// # Safety
    /// `info` is NULL or writable.
    pub unsafe fn gds_mlx5_get_dword_wait_info(
        ptr: *mut u32,
        value: u32,
        flags: c_int,
        info: *mut Mlx5DwordWaitInfo,
    ) -> c_int {
        const F: &str = "gds_mlx5_get_dword_wait_info";
        // SAFETY: NULL or writable.
        let out = unsafe { info.as_mut() }.ok_or_else(|| einval(F, "NULL info"))?;
        check_dword_ptr(F, ptr)?;
        *out = Mlx5DwordWaitInfo { ptr: std::ptr::null_mut(), value: 0 };
        let d = memmgr().map_mem(cuda()?, ptr as usize, 4, flags & GDS_MEMORY_MASK)?;
        *out = Mlx5DwordWaitInfo { ptr: d as *mut u32, value };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capi::core::init_send_request;

    #[test]
    fn mlx5_info_helpers_walk_requests() {
        let r = ranges();
        let dbr = r.register(crate::engine::ranges::Range { cpu: 0x1000, dev: 0xa000, len: 64 });
        // SAFETY: all-zero is a valid request; arrays valid for count 1.
        unsafe {
            let mut req: Box<SendRequest> = Box::new(std::mem::zeroed());
            init_send_request(&mut req);
            req.commit.entries = 1;
            req.wr[0].type_ = IBV_EXP_PEER_OP_STORE_DWORD;
            req.wr[0].wr.dword_va = DwordVa { data: 0x42, target_id: dbr, offset: 4 };
            let mut info = Mlx5SendInfo {
                bits: 9,
                dbrec_ptr: std::ptr::null_mut(),
                dbrec_value: 0,
                db_ptr: std::ptr::null_mut(),
                db_value: 7,
            };
            assert_eq!(gds_mlx5_get_send_info(1, &*req, &mut info), 0);
            assert_eq!((info.bits, info.dbrec_ptr as u64, info.dbrec_value, info.db_value), (0, 0xa004, 0x42, 0));
            req.wr[0].type_ = IBV_EXP_PEER_OP_POLL_GEQ_DWORD;
            assert_eq!(gds_mlx5_get_send_info(1, &*req, &mut info), libc::EINVAL);
            assert_eq!(gds_mlx5_get_send_info(1, std::ptr::null(), &mut info), libc::EINVAL);
        }
    }
}
