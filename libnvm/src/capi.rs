//! libnvm's C ABI: the 27 `nvm_*` functions of a libnvm build with CUDA and without SmartIO,
//! with upstream's names and signatures (spec §A5).
//!
//! Every handle the library gives out (`nvm_ctrl_t*`, `nvm_dma_t*`, `nvm_aq_ref`) is recorded
//! in a table, so a NULL, stale or foreign handle gets `EINVAL` and a log line instead of a
//! crash. Every body runs inside the common boundary guard: a panic becomes `EIO`.
//! docs/storage.md tabulates what each function returns on each failure.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::cell::Cell;
use std::collections::HashMap;
use std::ffi::{CString, c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};

use gpudirect_common::Errno;
use gpudirect_common::boundary::{CReturn, Library};

use crate::abi::{NvmCmd, NvmCpl, NvmCtrl, NvmCtrlInfo, NvmDma, NvmNsInfo, NvmQueue};
use crate::admin::AdminQueue;
use crate::ctrl::Controller;
use crate::dma::DmaWindow;
use crate::mmio::{Regs, Ring};
use crate::queue;
use crate::status::{self, Error, Result};

/// The C handle of a controller; `handle` first, so `&CtrlBox` is an `nvm_ctrl_t*`.
#[repr(C)]
struct CtrlBox {
    handle: NvmCtrl,
    ctrl: Arc<Controller>,
}

/// A DMA handle: the window and the allocation of its `nvm_dma_t` (header + ioaddrs).
struct DmaEntry {
    window: DmaWindow,
    layout: Layout,
}

struct AqEntry {
    aq: Arc<AdminQueue>,
    ctrl: Arc<CtrlBox>,
}

#[derive(Default)]
struct Tables {
    ctrls: HashMap<usize, Arc<CtrlBox>>,
    dmas: HashMap<usize, DmaEntry>,
    aqs: HashMap<usize, AqEntry>,
}

// SAFETY: the raw pointers inside (mm_ptr, window addresses) are plain addresses that the library
// never dereferences through these tables; the objects they describe are shared by design.
unsafe impl Send for Tables {}
// SAFETY: CtrlBox's raw mm_ptr mirrors the controller's register window (itself Send + Sync).
unsafe impl Send for CtrlBox {}
// SAFETY: as for Send; the handle is never written after creation.
unsafe impl Sync for CtrlBox {}

static TABLES: LazyLock<Mutex<Tables>> = LazyLock::new(|| Mutex::new(Tables::default()));

fn tables() -> MutexGuard<'static, Tables> {
    TABLES.lock().unwrap_or_else(|p| p.into_inner())
}

/// libnvm's side of the C boundary: an `int` function returns 0, a positive errno or a negative
/// NVMe status, and logs its failure with the function's name; a panic is logged and becomes
/// EIO (NULL, nothing) by the return type.
struct Nvm;

impl Library for Nvm {
    type Error = Error;
    fn panicked(function: &str, message: &str) {
        nvm_err!(function, "internal error: {message}");
    }
    fn errno(function: &str, e: Error) -> c_int {
        nvm_err!(function, "{}", status::describe(e.packed()));
        e.packed()
    }
}

/// [`Nvm`] without the panic's log line, for `nvm_strerror`, which reports nothing.
struct NvmQuiet;

impl Library for NvmQuiet {
    type Error = Error;
    fn panicked(_function: &str, _message: &str) {}
    fn errno(function: &str, e: Error) -> c_int {
        Nvm::errno(function, e)
    }
}

fn bad(name: &str, what: &str) -> Error {
    nvm_err!(name, "{what}");
    Errno::EINVAL.into()
}

fn lookup_ctrl(name: &str, ctrl: *const NvmCtrl) -> Result<Arc<CtrlBox>> {
    tables().ctrls.get(&(ctrl as usize)).cloned().ok_or_else(|| bad(name, "Invalid controller handle"))
}

fn lookup_aq(name: &str, r: *mut c_void) -> Result<Arc<AdminQueue>> {
    tables().aqs.get(&(r as usize)).map(|e| e.aq.clone()).ok_or_else(|| bad(name, "Invalid admin queue reference"))
}

fn register_ctrl(c: Controller) -> *mut NvmCtrl {
    let ctrl = Arc::new(c);
    let b = Arc::new(CtrlBox { handle: ctrl.handle(), ctrl });
    let p = Arc::as_ptr(&b) as *mut NvmCtrl;
    tables().ctrls.insert(p as usize, b);
    p
}

/// Writes `v` through an out-pointer the caller vouched for (checked non-NULL).
fn put<T>(out: NonNull<T>, v: T) {
    // SAFETY: callers pass out-pointers from the C caller, checked non-NULL; the C contract of
    // every function here says they point at writable objects of type T.
    unsafe { out.as_ptr().write(v) }
}

fn nonnull<T>(name: &str, p: *mut T, what: &str) -> Result<NonNull<T>> {
    NonNull::new(p).ok_or_else(|| bad(name, &format!("{what} is NULL")))
}

gpudirect_common::export! {
    library = Nvm;

    /// # Safety
    /// `ctrl` must be NULL or a valid out-pointer; `fd` any descriptor.
    pub unsafe fn nvm_ctrl_init(ctrl: *mut *mut NvmCtrl, fd: c_int) -> c_int {
        const N: &str = "nvm_ctrl_init";
        let out = nonnull(N, ctrl, "Controller out-pointer")?;
        let c = Controller::from_fd(fd)?;
        put(out, register_ctrl(c));
        Ok(())
    }

    /// # Safety
    /// `mm_ptr` must map at least `mm_size` bytes of controller registers for as long as the handle
    /// is used; `ctrl` must be NULL or a valid out-pointer.
    pub unsafe fn nvm_raw_ctrl_init(ctrl: *mut *mut NvmCtrl, mm_ptr: *mut c_void, mm_size: usize) -> c_int {
        const N: &str = "nvm_raw_ctrl_init";
        let out = nonnull(N, ctrl, "Controller out-pointer")?;
        put(out, std::ptr::null_mut());
        let base = nonnull(N, mm_ptr, "Register pointer")?;
        if mm_size < crate::abi::NVM_CTRL_MEM_MINSIZE {
            return Err(bad(N, "Register mapping is smaller than NVM_CTRL_MEM_MINSIZE"));
        }
        // SAFETY: the caller's contract: mm_ptr maps mm_size bytes of registers while in use.
        let regs = unsafe { Regs::new(base, mm_size) };
        let c = Controller::from_regs(regs)?;
        put(out, register_ctrl(c));
        Ok(())
    }

    pub fn nvm_ctrl_free(ctrl: *mut NvmCtrl) {
        if ctrl.is_null() {
            return;
        }
        if tables().ctrls.remove(&(ctrl as usize)).is_none() {
            nvm_err!("nvm_ctrl_free", "Invalid controller handle");
        }
    }

    pub fn nvm_raw_ctrl_reset(ctrl: *const NvmCtrl, acq_ioaddr: u64, asq_ioaddr: u64) -> c_int {
        const N: &str = "nvm_raw_ctrl_reset";
        lookup_ctrl(N, ctrl)?.ctrl.reset(acq_ioaddr, asq_ioaddr)
    }
}

/// Publishes a window as a C `nvm_dma_t` (header + ioaddrs in one allocation, 64-byte aligned).
fn register_dma(name: &str, window: DmaWindow) -> Result<*mut NvmDma> {
    let n = window.ioaddrs().len();
    let size = n
        .checked_mul(8)
        .and_then(|b| b.checked_add(std::mem::size_of::<NvmDma>()))
        .ok_or_else(|| bad(name, "Window too large"))?;
    let layout = Layout::from_size_align(size, 64).map_err(|_| Error::Os(Errno::ENOMEM))?;
    // SAFETY: layout has a non-zero size (at least sizeof(nvm_dma_t)).
    let p = unsafe { alloc_zeroed(layout) }.cast::<NvmDma>();
    if p.is_null() {
        return Err(Errno::ENOMEM.into());
    }
    // SAFETY: p is a fresh, suitably aligned allocation of 32 + 8n bytes: room for the header
    // and for n ioaddrs from offset 24 (the flexible array).
    unsafe {
        p.write(NvmDma { vaddr: window.vaddr(), page_size: window.page_size(), n_ioaddrs: n, ioaddrs: [] });
        let arr = p.cast::<u8>().add(std::mem::offset_of!(NvmDma, ioaddrs)).cast::<u64>();
        std::ptr::copy_nonoverlapping(window.ioaddrs().as_ptr(), arr, n);
    }
    tables().dmas.insert(p as usize, DmaEntry { window, layout });
    Ok(p)
}

fn dma_out(name: &str, map: *mut *mut NvmDma) -> Result<NonNull<*mut NvmDma>> {
    let out = nonnull(name, map, "DMA handle out-pointer")?;
    put(out, std::ptr::null_mut());
    Ok(out)
}

gpudirect_common::export! {
    library = Nvm;

    /// # Safety
    /// `map` must be NULL or a valid out-pointer; `page_addrs` NULL or `n_pages` readable u64s.
    pub unsafe fn nvm_dma_map(
        map: *mut *mut NvmDma,
        ctrl: *const NvmCtrl,
        vaddr: *mut c_void,
        page_size: usize,
        n_pages: usize,
        page_addrs: *const u64,
    ) -> c_int {
        const N: &str = "nvm_dma_map";
        let out = dma_out(N, map)?;
        let c = lookup_ctrl(N, ctrl)?;
        if page_size == 0 || n_pages == 0 || page_addrs.is_null() {
            return Err(bad(N, "Page size, page count or address list is zero/NULL"));
        }
        if n_pages > (isize::MAX as usize) / 8 {
            return Err(bad(N, "Too many pages"));
        }
        // SAFETY: the caller's contract: page_addrs holds n_pages readable addresses.
        let addrs = unsafe { std::slice::from_raw_parts(page_addrs, n_pages) };
        let w = DmaWindow::from_addrs(&c.ctrl, vaddr, page_size, addrs)
            .inspect_err(|_| nvm_err!(N, "Size is not a multiple of the controller page size"))?;
        put(out, register_dma(N, w)?);
        Ok(())
    }
}

fn map_module(
    name: &str,
    map: *mut *mut NvmDma,
    ctrl: *const NvmCtrl,
    vaddr: *mut c_void,
    size: usize,
    device: bool,
) -> Result<()> {
    let out = dma_out(name, map)?;
    let c = lookup_ctrl(name, ctrl)?;
    let w = DmaWindow::map_module(&c.ctrl, vaddr, size, device)?;
    put(out, register_dma(name, w)?);
    Ok(())
}

gpudirect_common::export! {
    library = Nvm;

    /// # Safety
    /// `map` must be NULL or a valid out-pointer; `vaddr..vaddr+size` memory of this process.
    pub unsafe fn nvm_dma_map_host(
        map: *mut *mut NvmDma,
        ctrl: *const NvmCtrl,
        vaddr: *mut c_void,
        size: usize,
    ) -> c_int {
        map_module("nvm_dma_map_host", map, ctrl, vaddr, size, false)
    }

    /// # Safety
    /// `map` must be NULL or a valid out-pointer; `devptr` a CUDA device pointer (never dereferenced).
    pub unsafe fn nvm_dma_map_device(
        map: *mut *mut NvmDma,
        ctrl: *const NvmCtrl,
        devptr: *mut c_void,
        size: usize,
    ) -> c_int {
        map_module("nvm_dma_map_device", map, ctrl, devptr, size, true)
    }

    /// # Safety
    /// `map` must be NULL or a valid out-pointer.
    pub unsafe fn nvm_dma_create(map: *mut *mut NvmDma, ctrl: *const NvmCtrl, size: usize) -> c_int {
        const N: &str = "nvm_dma_create";
        let out = dma_out(N, map)?;
        let c = lookup_ctrl(N, ctrl)?;
        let w = DmaWindow::create(&c.ctrl, size)?;
        put(out, register_dma(N, w)?);
        Ok(())
    }

    pub fn nvm_dma_unmap(map: *mut NvmDma) {
        if map.is_null() {
            return;
        }
        let Some(e) = tables().dmas.remove(&(map as usize)) else {
            nvm_err!("nvm_dma_unmap", "Invalid DMA handle");
            return;
        };
        drop(e.window);
        // SAFETY: allocated by register_dma with exactly this layout, removed from the table
        // above so it is freed once.
        unsafe { dealloc(map.cast(), e.layout) }
    }

    /// # Safety
    /// `r` must be NULL or a valid out-pointer. The window's memory (`aq_mem->vaddr`, two pages)
    /// must be CPU-accessible host memory that outlives the reference.
    pub unsafe fn nvm_aq_create(r: *mut *mut c_void, ctrl: *const NvmCtrl, aq_mem: *const NvmDma) -> c_int {
        const N: &str = "nvm_aq_create";
        let out = nonnull(N, r, "Reference out-pointer")?;
        put(out, std::ptr::null_mut());
        let c = lookup_ctrl(N, ctrl)?;
        let (vaddr, ps, n, io0, io1) = {
            let t = tables();
            if !t.dmas.contains_key(&(aq_mem as usize)) {
                return Err(bad(N, "Invalid DMA handle"));
            }
            // SAFETY: a live handle from register_dma (checked in the table, which we hold).
            let d = unsafe { &*aq_mem };
            let n = d.n_ioaddrs;
            // SAFETY: as above; the array holds n_ioaddrs entries from offset 24.
            let io = |i: usize| unsafe { aq_mem.cast::<u8>().add(24).cast::<u64>().add(i).read() };
            (d.vaddr, d.page_size, n, if n > 0 { io(0) } else { 0 }, if n > 1 { io(1) } else { 0 })
        };
        let cps = c.ctrl.page_size();
        if ps != cps || n < 2 {
            return Err(bad(N, "Admin queue memory must be at least two controller pages"));
        }
        let base = nonnull(N, vaddr, "Admin queue memory address")?;
        let acq_n = usize::from(c.ctrl.ring_entries(16));
        let asq_n = usize::from(c.ctrl.ring_entries(64));
        // SAFETY: the window covers n >= 2 pages of CPU-accessible memory at vaddr (contract of
        // this function); page 0 holds acq_n 16-byte entries, page 1 asq_n 64-byte entries.
        let (acq, asq) = unsafe {
            let p1 = NonNull::new_unchecked(base.as_ptr().cast::<u8>().add(cps).cast::<c_void>());
            (Ring::new(base, acq_n, 16), Ring::new(p1, asq_n, 64))
        };
        let aq = AdminQueue::create(c.ctrl.clone(), acq, asq, io0, io1)?;
        let b = Box::new(0u8);
        let key = Box::into_raw(b) as usize;
        tables().aqs.insert(key, AqEntry { aq: Arc::new(aq), ctrl: c });
        put(out, key as *mut c_void);
        Ok(())
    }
}

fn release_ref(name: &str, r: *mut c_void) {
    if r.is_null() {
        return;
    }
    if tables().aqs.remove(&(r as usize)).is_none() {
        nvm_err!(name, "Invalid admin queue reference");
        return;
    }
    // SAFETY: the key was made by Box::into_raw in nvm_aq_create and is freed once (removed from
    // the table above).
    drop(unsafe { Box::from_raw(r.cast::<u8>()) });
}

gpudirect_common::export! {
    library = Nvm;

    pub fn nvm_aq_destroy(r: *mut c_void) {
        release_ref("nvm_aq_destroy", r)
    }

    pub fn nvm_rpc_unbind(r: *mut c_void) {
        release_ref("nvm_rpc_unbind", r)
    }

    pub fn nvm_ctrl_from_aq_ref(r: *mut c_void) -> *const NvmCtrl {
        if r.is_null() {
            return std::ptr::null();
        }
        match tables().aqs.get(&(r as usize)) {
            Some(e) => Arc::as_ptr(&e.ctrl) as *const NvmCtrl,
            None => {
                nvm_err!("nvm_ctrl_from_aq_ref", "Invalid admin queue reference");
                std::ptr::null()
            }
        }
    }

    /// # Safety
    /// `cmd` and `cpl` must be NULL or valid pointers to a command and a completion.
    ///
    /// Returns the completion's status when the command ran, so its body is of the return type.
    on_panic(libc::EIO) pub unsafe fn nvm_raw_rpc(r: *mut c_void, cmd: *mut NvmCmd, cpl: *mut NvmCpl) -> c_int {
        const N: &str = "nvm_raw_rpc";
        let mut status = 0;
        let rc = <c_int as CReturn<Nvm>>::finish(N, || {
            let aq = lookup_aq(N, r)?;
            let cmd = nonnull(N, cmd, "Command")?;
            let out = nonnull(N, cpl, "Completion")?;
            // SAFETY: the caller's contract; copied by value.
            let c = unsafe { cmd.as_ptr().read() };
            let done = aq.raw(&c)?;
            put(out, done);
            status = crate::status::Status::of(&done).packed();
            Ok(())
        });
        if rc != 0 { rc } else { status }
    }
}

/// A 4 KiB CPU view of a caller's buffer.
///
/// # Safety
/// `buffer` must be NULL or point at 4096 writable bytes (the admin functions' contract).
unsafe fn buf4k<'a>(name: &str, buffer: *mut c_void) -> Result<&'a [Cell<u8>]> {
    let p = nonnull(name, buffer.cast::<Cell<u8>>(), "Buffer")?;
    // SAFETY: the caller's contract: 4096 writable bytes; Cell<u8> has u8's layout.
    Ok(unsafe { std::slice::from_raw_parts(p.as_ptr(), 4096) })
}

gpudirect_common::export! {
    library = Nvm;

    /// # Safety
    /// `info` NULL or writable; `buffer` NULL or 4096 writable bytes whose bus address is `ioaddr`.
    pub unsafe fn nvm_admin_ctrl_info(
        r: *mut c_void,
        info: *mut NvmCtrlInfo,
        buffer: *mut c_void,
        ioaddr: u64,
    ) -> c_int {
        const N: &str = "nvm_admin_ctrl_info";
        let out = nonnull(N, info, "Info")?;
        // SAFETY: see buf4k.
        let buf = unsafe { buf4k(N, buffer)? };
        if ioaddr == 0 {
            return Err(bad(N, "Bus address is 0"));
        }
        let aq = lookup_aq(N, r)?;
        put(out, NvmCtrlInfo::default());
        put(out, aq.ctrl_info(buf, ioaddr)?);
        Ok(())
    }

    /// # Safety
    /// As `nvm_admin_ctrl_info`.
    pub unsafe fn nvm_admin_ns_info(
        r: *mut c_void,
        info: *mut NvmNsInfo,
        ns_id: u32,
        buffer: *mut c_void,
        ioaddr: u64,
    ) -> c_int {
        const N: &str = "nvm_admin_ns_info";
        let out = nonnull(N, info, "Info")?;
        // SAFETY: see buf4k.
        let buf = unsafe { buf4k(N, buffer)? };
        if ioaddr == 0 {
            return Err(bad(N, "Bus address is 0"));
        }
        let aq = lookup_aq(N, r)?;
        put(out, NvmNsInfo { ns_id, ..Default::default() });
        put(out, aq.ns_info(ns_id, buf, ioaddr)?);
        Ok(())
    }

    /// # Safety
    /// `buffer` NULL or 4096 writable bytes whose bus address is `ioaddr`.
    pub unsafe fn nvm_admin_get_log_page(
        r: *mut c_void,
        ns_id: u32,
        buffer: *mut c_void,
        ioaddr: u64,
        log_id: u8,
        log_offset: u64,
    ) -> c_int {
        const N: &str = "nvm_admin_get_log_page";
        // SAFETY: see buf4k.
        let buf = unsafe { buf4k(N, buffer)? };
        if ioaddr == 0 {
            return Err(bad(N, "Bus address is 0"));
        }
        lookup_aq(N, r)?.get_log_page(ns_id, buf, ioaddr, log_id, log_offset)
    }

    pub fn nvm_admin_set_num_queues(r: *mut c_void, n_cqs: u16, n_sqs: u16) -> c_int {
        const N: &str = "nvm_admin_set_num_queues";
        if n_cqs == 0 || n_sqs == 0 {
            return Err(bad(N, "Queue count is 0"));
        }
        lookup_aq(N, r)?.request_num_queues(n_cqs, n_sqs).map(|_| ())
    }

    /// # Safety
    /// `n_cqs`, `n_sqs` NULL or writable.
    pub unsafe fn nvm_admin_get_num_queues(r: *mut c_void, n_cqs: *mut u16, n_sqs: *mut u16) -> c_int {
        const N: &str = "nvm_admin_get_num_queues";
        let c = nonnull(N, n_cqs, "CQ count")?;
        let s = nonnull(N, n_sqs, "SQ count")?;
        let (nc, ns) = lookup_aq(N, r)?.get_num_queues()?;
        put(c, nc);
        put(s, ns);
        Ok(())
    }

    /// # Safety
    /// `n_cqs`, `n_sqs` NULL or readable and writable.
    pub unsafe fn nvm_admin_request_num_queues(r: *mut c_void, n_cqs: *mut u16, n_sqs: *mut u16) -> c_int {
        const N: &str = "nvm_admin_request_num_queues";
        let c = nonnull(N, n_cqs, "CQ count")?;
        let s = nonnull(N, n_sqs, "SQ count")?;
        // SAFETY: checked non-NULL; the caller's contract makes them readable.
        let (want_c, want_s) = unsafe { (c.as_ptr().read(), s.as_ptr().read()) };
        if want_c == 0 || want_s == 0 {
            return Err(bad(N, "Queue count is 0"));
        }
        let (nc, ns) = lookup_aq(N, r)?.request_num_queues(want_c, want_s)?;
        put(c, nc);
        put(s, ns);
        Ok(())
    }

    /// # Safety
    /// `cq` NULL or writable. `qmem` is never dereferenced.
    pub unsafe fn nvm_admin_cq_create(
        r: *mut c_void,
        cq: *mut NvmQueue,
        id: u16,
        qmem: *mut c_void,
        ioaddr: u64,
    ) -> c_int {
        const N: &str = "nvm_admin_cq_create";
        let out = nonnull(N, cq, "Queue descriptor")?;
        if id == 0 {
            return Err(bad(N, "Queue id 0 is the admin queue"));
        }
        let q = lookup_aq(N, r)?.cq_create(id, qmem, ioaddr)?;
        put(out, q);
        Ok(())
    }

    /// # Safety
    /// `sq` NULL or writable; `cq` NULL or readable. `qmem` is never dereferenced.
    pub unsafe fn nvm_admin_sq_create(
        r: *mut c_void,
        sq: *mut NvmQueue,
        cq: *const NvmQueue,
        id: u16,
        qmem: *mut c_void,
        ioaddr: u64,
    ) -> c_int {
        const N: &str = "nvm_admin_sq_create";
        let out = nonnull(N, sq, "Queue descriptor")?;
        let cq = nonnull(N, cq.cast_mut(), "Completion queue descriptor")?;
        if id == 0 {
            return Err(bad(N, "Queue id 0 is the admin queue"));
        }
        // SAFETY: checked non-NULL; the caller's contract makes it readable.
        let cqv = unsafe { cq.as_ptr().read() };
        let q = lookup_aq(N, r)?.sq_create(&cqv, id, qmem, ioaddr)?;
        put(out, q);
        Ok(())
    }

    /// # Safety
    /// `cq` NULL or a readable and writable descriptor.
    pub unsafe fn nvm_admin_cq_delete(r: *mut c_void, cq: *mut NvmQueue) -> c_int {
        const N: &str = "nvm_admin_cq_delete";
        let p = nonnull(N, cq, "Queue descriptor")?;
        // SAFETY: checked non-NULL; the caller's contract.
        let mut q = unsafe { p.as_ptr().read() };
        if q.db.is_null() {
            return Err(bad(N, "Queue is already deleted"));
        }
        lookup_aq(N, r)?.cq_delete(&mut q)?;
        // SAFETY: as above; only the doorbell field changes.
        unsafe { (*p.as_ptr()).db = q.db };
        Ok(())
    }

    /// # Safety
    /// `sq` NULL or a readable and writable descriptor; `cq` NULL or readable.
    pub unsafe fn nvm_admin_sq_delete(r: *mut c_void, sq: *mut NvmQueue, cq: *const NvmQueue) -> c_int {
        const N: &str = "nvm_admin_sq_delete";
        let p = nonnull(N, sq, "Queue descriptor")?;
        let c = nonnull(N, cq.cast_mut(), "Completion queue descriptor")?;
        // SAFETY: checked non-NULL; the caller's contract.
        let (mut s, cv) = unsafe { (p.as_ptr().read(), c.as_ptr().read()) };
        if s.db.is_null() || cv.db.is_null() {
            return Err(bad(N, "Queue is already deleted"));
        }
        lookup_aq(N, r)?.sq_delete(&mut s, &cv)?;
        // SAFETY: as above; only the doorbell field changes.
        unsafe { (*p.as_ptr()).db = s.db };
        Ok(())
    }

    /// # Safety
    /// `q` NULL or writable; `ctrl` NULL or a controller handle (only its fields are read).
    pub unsafe fn nvm_queue_clear(
        q: *mut NvmQueue,
        ctrl: *const NvmCtrl,
        cq: bool,
        no: u16,
        vaddr: *mut c_void,
        ioaddr: u64,
    ) {
        const N: &str = "nvm_queue_clear";
        let (Some(out), false) = (NonNull::new(q), ctrl.is_null()) else {
            nvm_err!(N, "Queue or controller is NULL");
            return;
        };
        // SAFETY: non-NULL; the caller's contract says it is a controller handle (read only).
        let h = unsafe { ctrl.read() };
        let mut d = NvmQueue::default();
        queue::clear(&mut d, h.max_entries, h.page_size, (h.mm_ptr, h.mm_size), h.dstrd, cq, no, vaddr, ioaddr);
        if d.db.is_null() {
            nvm_err!(N, "Doorbell of queue {no} lies outside the register mapping");
        }
        put(out, d);
    }

    /// # Safety
    /// `cq` NULL or a completion queue descriptor whose ring (`vaddr`) is CPU-accessible memory.
    pub unsafe fn nvm_cq_dequeue_block(cq: *mut NvmQueue, timeout: u64) -> *mut NvmCpl {
        const N: &str = "nvm_cq_dequeue_block";
        let Some(p) = NonNull::new(cq) else {
            nvm_err!(N, "Queue is NULL");
            return std::ptr::null_mut();
        };
        // SAFETY: non-NULL; the caller's contract (a descriptor it owns, not used concurrently).
        let q = unsafe { &mut *p.as_ptr() };
        let Some(base) = NonNull::new(q.vaddr) else {
            nvm_err!(N, "Queue memory is NULL");
            return std::ptr::null_mut();
        };
        if q.max_entries == 0 || q.entry_size < 16 {
            nvm_err!(N, "Queue descriptor is not initialised");
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract: the ring holds max_entries entries of entry_size bytes.
        let ring = unsafe { Ring::new(base, usize::from(q.max_entries), usize::from(q.entry_size)) };
        match queue::cq_dequeue_block(q, &ring, timeout) {
            Some(slot) => ring.slot_ptr(slot).cast(),
            None => std::ptr::null_mut(),
        }
    }
}

static STRINGS: LazyLock<Mutex<HashMap<&'static str, &'static std::ffi::CStr>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

gpudirect_common::export! {
    library = NvmQuiet;

    /// A panic returns "Unknown error", as an unknown status does, and logs nothing.
    on_panic(c"Unknown error".as_ptr()) pub fn nvm_strerror(status: c_int) -> *const c_char {
        let (errno, sct, sc) = status::unpack(status);
        match status::nvme_text(sct, sc) {
            Some(t) => {
                let mut m = STRINGS.lock().unwrap_or_else(|p| p.into_inner());
                // Each distinct text is leaked once and kept: the pointers must stay valid forever.
                let s = *m
                    .entry(t)
                    .or_insert_with(|| Box::leak(CString::new(t).unwrap_or_default().into_boxed_c_str()));
                s.as_ptr()
            }
            // SAFETY: strerror returns a pointer to a static (or thread-local) C string.
            None => unsafe { libc::strerror(errno) },
        }
    }
}
