//! The installed libgdrapi, asked directly: its version, which backend `gdr_open` picks, the
//! driver version it negotiated, and a real pin/map/copy round trip. Loaded with dlopen so the
//! tool checks the library consumers get, not a copy built into it.

use std::ffi::{c_int, c_ulong, c_void};

use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;

/// `gdr_mh_t`: one unsigned long, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct MemHandle {
    h: c_ulong,
}

type Gdr = *mut c_void;
/// Returns nothing in gdrcopy 2.6 (it only stores 2 and 6).
type RuntimeGetVersion = unsafe extern "C" fn(*mut c_int, *mut c_int);
type Open = unsafe extern "C" fn() -> Gdr;
type Close = unsafe extern "C" fn(Gdr) -> c_int;
type DriverGetVersion = unsafe extern "C" fn(Gdr, *mut c_int, *mut c_int) -> c_int;
type GetAttribute = unsafe extern "C" fn(Gdr, c_int, *mut c_int) -> c_int;
type Pin = unsafe extern "C" fn(Gdr, c_ulong, usize, u64, u32, *mut MemHandle) -> c_int;
type Unpin = unsafe extern "C" fn(Gdr, MemHandle) -> c_int;
type Map = unsafe extern "C" fn(Gdr, MemHandle, *mut *mut c_void, usize) -> c_int;
type Unmap = unsafe extern "C" fn(Gdr, MemHandle, *mut c_void, usize) -> c_int;
type CopyTo = unsafe extern "C" fn(MemHandle, *mut c_void, *const c_void, usize) -> c_int;
type CopyFrom = unsafe extern "C" fn(MemHandle, *mut c_void, *const c_void, usize) -> c_int;

const GDR_ATTR_USING_DMA_BUF_MMAP: c_int = 3;
/// GPU pages are 64 KiB (gdrapi.h GPU_PAGE_SIZE).
pub const GPU_PAGE: usize = 1 << 16;

pub struct GdrApi {
    lib: Library,
    pub runtime_version: Option<(i32, i32)>,
}

/// The result of `gdr_open` and what the open handle reports.
#[derive(Debug, Default, Clone)]
pub struct OpenOutcome {
    /// errno after a failed gdr_open (0 when it succeeded).
    pub errno: i32,
    /// "gdrdrv" or "dma-buf" when gdr_open succeeded.
    pub backend: Option<&'static str>,
    pub driver_version: Option<(i32, i32)>,
    /// The pin/map/copy round trip: Ok(bytes checked) or what failed.
    pub round_trip: Option<Result<usize, String>>,
}

impl GdrApi {
    pub fn load() -> Result<GdrApi, String> {
        let lib = Library::open("libgdrapi.so.2")?;
        let mut g = GdrApi { lib, runtime_version: None };
        if let Some(f) = g.f::<RuntimeGetVersion>(c"gdr_runtime_get_version") {
            let (mut a, mut b) = (-1, -1);
            // SAFETY: two valid out pointers.
            unsafe { f(&mut a, &mut b) };
            g.runtime_version = (a >= 0 && b >= 0).then_some((a, b));
        }
        Ok(g)
    }

    fn f<F: Copy>(&self, name: &std::ffi::CStr) -> Option<F> {
        // SAFETY: every caller names F as the gdrapi.h prototype of `name`.
        self.lib.symbol(name).map(|p| unsafe { as_fn::<F>(p) })
    }

    /// gdr_open, then (if `device_mem` is given) a pin/map/copy round trip on it, then gdr_close.
    pub fn open_and_try(&self, device_mem: Option<u64>) -> OpenOutcome {
        let mut out = OpenOutcome::default();
        let (Some(open), Some(close)) = (self.f::<Open>(c"gdr_open"), self.f::<Close>(c"gdr_close")) else {
            out.errno = libc::ENOSYS;
            return out;
        };
        // SAFETY: gdr_open takes no arguments; NULL means failure with errno set.
        let g = unsafe { open() };
        if g.is_null() {
            out.errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return out;
        }
        if let Some(f) = self.f::<GetAttribute>(c"gdr_get_attribute") {
            let mut v = 0;
            // SAFETY: g is open; valid out pointer.
            let r = unsafe { f(g, GDR_ATTR_USING_DMA_BUF_MMAP, &mut v) };
            out.backend = Some(if r == 0 && v != 0 { "dma-buf" } else { "gdrdrv" });
        }
        if out.backend == Some("gdrdrv")
            && let Some(f) = self.f::<DriverGetVersion>(c"gdr_driver_get_version")
        {
            let (mut a, mut b) = (0, 0);
            // SAFETY: g is open; two valid out pointers.
            if unsafe { f(g, &mut a, &mut b) } == 0 {
                out.driver_version = Some((a, b));
            }
        }
        if let Some(addr) = device_mem {
            out.round_trip = Some(self.round_trip(g, addr));
        }
        // SAFETY: g came from gdr_open and is closed once.
        unsafe { close(g) };
        out
    }

    /// Pins one GPU page at `addr` (64 KiB aligned), maps it, writes a pattern through the
    /// mapping, reads it back and compares; undoes everything it did.
    fn round_trip(&self, g: Gdr, addr: u64) -> Result<usize, String> {
        let pin = self.f::<Pin>(c"gdr_pin_buffer").ok_or("no gdr_pin_buffer")?;
        let unpin = self.f::<Unpin>(c"gdr_unpin_buffer").ok_or("no gdr_unpin_buffer")?;
        let map = self.f::<Map>(c"gdr_map").ok_or("no gdr_map")?;
        let unmap = self.f::<Unmap>(c"gdr_unmap").ok_or("no gdr_unmap")?;
        let to = self.f::<CopyTo>(c"gdr_copy_to_mapping").ok_or("no gdr_copy_to_mapping")?;
        let from = self.f::<CopyFrom>(c"gdr_copy_from_mapping").ok_or("no gdr_copy_from_mapping")?;
        let mut mh = MemHandle::default();
        // SAFETY: g is open; addr/size describe device memory the caller allocated; valid out pointer.
        let r = unsafe { pin(g, addr as c_ulong, GPU_PAGE, 0, 0, &mut mh) };
        if r != 0 {
            return Err(format!("gdr_pin_buffer failed: {}", errno_text(r)));
        }
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: mh is a live pin of GPU_PAGE bytes; valid out pointer.
        let r = unsafe { map(g, mh, &mut va, GPU_PAGE) };
        let result = if r != 0 {
            Err(format!("gdr_map failed: {}", errno_text(r)))
        } else {
            let pattern: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
            let mut back = vec![0u8; pattern.len()];
            // SAFETY: va maps GPU_PAGE bytes (> 4096); the host buffers hold 4096 bytes each.
            let (w, rd) = unsafe {
                (to(mh, va, pattern.as_ptr().cast(), pattern.len()), from(mh, back.as_mut_ptr().cast(), va, back.len()))
            };
            // SAFETY: va/GPU_PAGE is the mapping made above, unmapped once.
            unsafe { unmap(g, mh, va, GPU_PAGE) };
            if w != 0 || rd != 0 {
                Err(format!("copy through the mapping failed (to: {w}, from: {rd})"))
            } else if back != pattern {
                Err("data read back through the mapping differs from what was written".into())
            } else {
                Ok(pattern.len())
            }
        };
        // SAFETY: mh is the pin made above, released once.
        unsafe { unpin(g, mh) };
        result
    }
}

/// gdrapi functions return an errno value (positive) or -1/negative: say which.
fn errno_text(r: c_int) -> String {
    let e = r.abs();
    format!("{} ({})", std::io::Error::from_raw_os_error(e), r)
}
