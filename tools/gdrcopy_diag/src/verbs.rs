//! The dma-buf probes NCCL and UCX run on each RDMA device, through libibverbs loaded at run
//! time (../shared/spec/peer-memory.md §13): NCCL `ibv_reg_dmabuf_mr(pd, 0, 0, 0, -1, 0)`,
//! EOPNOTSUPP or EPROTONOSUPPORT = unsupported, any other answer = supported; UCX
//! `ibv_reg_dmabuf_mr(pd, 0, page size, 0, -1, access)`, success or EBADF = supported.
//! The only unsafe code here is these verbs calls.

use gpudirect_common::dl::Library;
use std::ffi::{CStr, c_char, c_int, c_void};

/// The errno each probe ended with (0: the call returned an MR).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaBufProbe {
    pub nccl_errno: i32,
    pub ucx_errno: i32,
}

impl DmaBufProbe {
    pub fn nccl_supported(self) -> bool {
        self.nccl_errno != libc::EOPNOTSUPP && self.nccl_errno != libc::EPROTONOSUPPORT
    }
    pub fn ucx_supported(self) -> bool {
        self.ucx_errno == 0 || self.ucx_errno == libc::EBADF
    }
}

type GetDeviceList = unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void;
type FreeDeviceList = unsafe extern "C" fn(*mut *mut c_void);
type GetDeviceName = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type OpenDevice = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type CloseDevice = unsafe extern "C" fn(*mut c_void) -> c_int;
type AllocPd = unsafe extern "C" fn(*mut c_void) -> *mut c_void;
type DeallocPd = unsafe extern "C" fn(*mut c_void) -> c_int;
type RegDmabufMr = unsafe extern "C" fn(*mut c_void, u64, usize, u64, c_int, c_int) -> *mut c_void;
type DeregMr = unsafe extern "C" fn(*mut c_void) -> c_int;

/// IBV_ACCESS_LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ.
const ACCESS: c_int = 0x1 | 0x2 | 0x4;

/// Device name → probe answers, or why the probes could not run (no libibverbs, a device that
/// cannot be opened: those are left out of the map).
pub fn probe_all() -> Result<Vec<(String, DmaBufProbe)>, String> {
    let lib = Library::open("libibverbs.so.1")?;
    macro_rules! sym {
        ($name:literal, $ty:ty) => {{
            let p = lib.symbol($name).ok_or_else(|| format!("libibverbs.so.1 lacks {:?}", $name))?;
            // SAFETY: the symbol is libibverbs' exported function of that name, whose C
            // prototype (infiniband/verbs.h) `$ty` spells; `lib` outlives every call below.
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p.as_ptr()) }
        }};
    }
    let get_list = sym!(c"ibv_get_device_list", GetDeviceList);
    let free_list = sym!(c"ibv_free_device_list", FreeDeviceList);
    let get_name = sym!(c"ibv_get_device_name", GetDeviceName);
    let open = sym!(c"ibv_open_device", OpenDevice);
    let close = sym!(c"ibv_close_device", CloseDevice);
    let alloc_pd = sym!(c"ibv_alloc_pd", AllocPd);
    let dealloc_pd = sym!(c"ibv_dealloc_pd", DeallocPd);
    let reg = sym!(c"ibv_reg_dmabuf_mr", RegDmabufMr);
    let dereg = sym!(c"ibv_dereg_mr", DeregMr);
    let page = 4096usize;

    let mut n: c_int = 0;
    // SAFETY: `n` is a valid out pointer; the list is freed below with ibv_free_device_list.
    let list = unsafe { get_list(&mut n) };
    if list.is_null() {
        return Err(format!("ibv_get_device_list: {}", std::io::Error::last_os_error()));
    }
    let mut out = Vec::new();
    for i in 0..usize::try_from(n).unwrap_or(0) {
        // SAFETY: the list holds `n` device pointers (verbs.h), valid until it is freed.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a live device of the list; the name is a NUL-terminated string it owns.
        let name = unsafe { CStr::from_ptr(get_name(dev)) }.to_string_lossy().into_owned();
        // SAFETY: `dev` is a live device; the context is closed below.
        let ctx = unsafe { open(dev) };
        if ctx.is_null() {
            continue;
        }
        // SAFETY: `ctx` is an open context; the PD is deallocated below.
        let pd = unsafe { alloc_pd(ctx) };
        if !pd.is_null() {
            let one = |len: usize, access: c_int| -> i32 {
                // SAFETY: `pd` is a live PD; fd -1 is never a dma-buf, so the kernel or the
                // provider refuses without touching memory; an MR that comes back is deregistered.
                let mr = unsafe { reg(pd, 0, len, 0, -1, access) };
                if mr.is_null() {
                    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
                } else {
                    // SAFETY: `mr` was just returned by ibv_reg_dmabuf_mr.
                    unsafe { dereg(mr) };
                    0
                }
            };
            let probe = DmaBufProbe { nccl_errno: one(0, 0), ucx_errno: one(page, ACCESS) };
            out.push((name, probe));
            // SAFETY: `pd` is live and has no MR left.
            unsafe { dealloc_pd(pd) };
        }
        // SAFETY: `ctx` is open and its PD is gone.
        unsafe { close(ctx) };
    }
    // SAFETY: `list` came from ibv_get_device_list and is freed once.
    unsafe { free_list(list) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_follow_each_consumer_rule() {
        let p = |n, u| DmaBufProbe { nccl_errno: n, ucx_errno: u };
        // rxe: the provider has no reg_dmabuf_mr.
        assert!(!p(libc::EOPNOTSUPP, libc::EOPNOTSUPP).nccl_supported());
        assert!(!p(libc::EOPNOTSUPP, libc::EOPNOTSUPP).ucx_supported());
        assert!(!p(libc::EPROTONOSUPPORT, 0).nccl_supported());
        // mlx5: the kernel rejects fd -1 with EBADF; NCCL counts any such answer as support.
        assert!(p(libc::EBADF, libc::EBADF).nccl_supported());
        assert!(p(libc::EBADF, libc::EBADF).ucx_supported());
        assert!(p(libc::EINVAL, libc::EINVAL).nccl_supported());
        assert!(!p(libc::EINVAL, libc::EINVAL).ucx_supported());
    }

    /// Runs the real probes where libibverbs exists; with no device the list is just empty.
    #[test]
    fn probes_run_or_say_why_not() {
        match probe_all() {
            Ok(v) => {
                for (name, _) in v {
                    assert!(!name.is_empty());
                }
            }
            Err(e) => eprintln!("SKIP verbs probe: {e}"),
        }
    }
}
