//! A libgdrapi (ours or another) used through its public C ABI, dlopened as a C consumer would
//! load it, and ours statically linked; each pins and maps device memory and hands out its
//! `gdr_copy_*` functions.

use std::ffi::{c_int, c_ulong, c_void};

pub(crate) use gdrapi::abi::GdrMh;

use crate::dl;
use crate::opts::Opts;

type GdrT = *mut c_void;
pub(crate) type CopyFn = unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int;

/// A dlopened libgdrapi with one open instance.
pub(crate) struct GdrLib {
    pub(crate) path: String,
    pub(crate) version: String,
    g: GdrT,
    pin: unsafe extern "C" fn(GdrT, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int,
    map: unsafe extern "C" fn(GdrT, GdrMh, *mut *mut c_void, usize) -> c_int,
    pub(crate) copy_to: CopyFn,
    pub(crate) copy_from: CopyFn,
}

/// A pinned and mapped range, through one library. Lives until the process exits.
#[derive(Clone, Copy)]
pub(crate) struct BarMapping {
    pub(crate) copy_to: CopyFn,
    pub(crate) copy_from: CopyFn,
    pub(crate) mh: GdrMh,
    pub(crate) bar: *mut u8,
}

// SAFETY: the mapping is plain shared memory plus function pointers of a thread-safe library.
unsafe impl Send for BarMapping {}

impl GdrLib {
    /// dlopens `path` and opens an instance.
    pub(crate) fn open(path: &str) -> Result<GdrLib, String> {
        let lib = dl::open(path)?;
        // SAFETY: every `sym` type below is the gdrapi.h 2.x prototype of that symbol; the calls get
        // valid out-pointers. The library stays loaded (`dl::open` never closes it).
        unsafe {
            let runtime_version: unsafe extern "C" fn(*mut c_int, *mut c_int) =
                dl::sym(lib, c"gdr_runtime_get_version")?;
            let open: unsafe extern "C" fn() -> GdrT = dl::sym(lib, c"gdr_open")?;
            let (mut maj, mut min) = (0, 0);
            runtime_version(&mut maj, &mut min);
            let version = format!("{maj}.{min}");
            let g = open();
            if g.is_null() {
                return Err(format!(
                    "gdr_open() of {path} returned NULL (libgdrapi {version}): no /dev/gdrdrv and no usable \
                     dma-buf backend (that needs a CUDA >= 13.3 driver); set GDRCOPY_ENABLE_LOGGING=1 for the reason"
                ));
            }
            Ok(GdrLib {
                path: path.into(),
                version,
                g,
                pin: dl::sym(lib, c"gdr_pin_buffer")?,
                map: dl::sym(lib, c"gdr_map")?,
                copy_to: dl::sym(lib, c"gdr_copy_to_mapping")?,
                copy_from: dl::sym(lib, c"gdr_copy_from_mapping")?,
            })
        }
    }

    /// Pins and maps `[dptr, dptr + len)` (64 KiB aligned device memory).
    pub(crate) fn pin_map(&self, dptr: u64, len: usize) -> Result<BarMapping, String> {
        let mut mh = GdrMh { h: 0 };
        // SAFETY: valid out-pointers; the range lies inside the caller's cuMemAlloc allocation.
        let r = unsafe { (self.pin)(self.g, dptr as c_ulong, len, 0, 0, &mut mh) };
        if r != 0 {
            return Err(format!("gdr_pin_buffer of {} returned {r}", self.path));
        }
        let mut va = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { (self.map)(self.g, mh, &mut va, len) };
        if r != 0 {
            return Err(format!("gdr_map of {} returned {r}", self.path));
        }
        Ok(BarMapping { copy_to: self.copy_to, copy_from: self.copy_from, mh, bar: va.cast() })
    }
}

/// Pins and maps through our statically linked C functions (see `linked` in `main`).
pub(crate) fn linked_mapping(dptr: u64, len: usize) -> Result<BarMapping, String> {
    use gdrapi::capi;
    // SAFETY: the gdrapi.h contract: valid out-pointers, a range inside a device allocation.
    unsafe {
        let g = capi::gdr_open();
        if g.is_null() {
            return Err("gdr_open (linked) returned NULL".into());
        }
        let mut mh = GdrMh { h: 0 };
        let r = capi::gdr_pin_buffer(g, dptr as c_ulong, len, 0, 0, &mut mh);
        if r != 0 {
            return Err(format!("gdr_pin_buffer (linked) returned {r}"));
        }
        let mut va = std::ptr::null_mut();
        let r = capi::gdr_map(g, mh, &mut va, len);
        if r != 0 {
            return Err(format!("gdr_map (linked) returned {r}"));
        }
        let (to, from): (CopyFn, CopyFn) = (capi::gdr_copy_to_mapping, capi::gdr_copy_from_mapping);
        Ok(BarMapping { copy_to: to, copy_from: from, mh, bar: va.cast() })
    }
}

/// Our own cdylib: `--ours`, else `libgdrapi.so` in the profile directory of this benchmark.
pub(crate) fn our_library(o: &Opts) -> Option<String> {
    if let Some(p) = &o.ours {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libgdrapi.so");
    lib.exists().then(|| lib.to_string_lossy().into_owned())
}
