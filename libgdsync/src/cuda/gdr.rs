//! libgdrapi, loaded at run time like any consumer would (`dlopen("libgdrapi.so.2")`), for GPU
//! memory with a CPU mapping (spec §4.6). This is the only module calling into libgdrapi.

use std::ffi::{c_int, c_ulong, c_void};
use std::sync::OnceLock;

use gpudirect_common::Errno;
use gpudirect_common::cuda::as_fn;
use gpudirect_common::dl::Library;

use crate::abi::GdrMh;

/// `gdr_info_v2_t`, the workspace's one definition (the v1 call fills its first 40 bytes).
pub use gpudirect_common::gdr_abi::GdrInfoV2 as GdrInfo;

type FnVersion = unsafe extern "C" fn(*mut c_int, *mut c_int);
type FnOpen = unsafe extern "C" fn() -> *mut c_void;
type FnPin = unsafe extern "C" fn(*mut c_void, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int;
type FnUnpin = unsafe extern "C" fn(*mut c_void, GdrMh) -> c_int;
type FnMap = unsafe extern "C" fn(*mut c_void, GdrMh, *mut *mut c_void, usize) -> c_int;
type FnUnmap = unsafe extern "C" fn(*mut c_void, GdrMh, *mut c_void, usize) -> c_int;
type FnGetInfo = unsafe extern "C" fn(*mut c_void, GdrMh, *mut GdrInfo) -> c_int;

/// An open gdrcopy instance (one per process, never closed, as upstream).
pub struct Gdr {
    _lib: Library,
    g: usize,
    pin: FnPin,
    unpin: FnUnpin,
    map: FnMap,
    unmap: FnUnmap,
    get_info: FnGetInfo,
}

/// The gdrcopy API major version this library speaks.
const GDR_API_MAJOR: c_int = 2;

fn rc(r: c_int) -> Result<(), Errno> {
    match r {
        0 => Ok(()),
        r if r < 0 => Err(Errno(-r)),
        r => Err(Errno(r)),
    }
}

impl Gdr {
    fn open() -> Result<Gdr, String> {
        let lib = Library::open("libgdrapi.so.2")?;
        let sym =
            |n: &std::ffi::CStr| lib.symbol(n).ok_or_else(|| format!("libgdrapi.so.2 lacks {}", n.to_string_lossy()));
        // All as_fn below: gdrcopy 2.x exports these symbols with exactly these prototypes
        // (gdrapi.h 2.x; gdr_mh_t is a one-`unsigned long` struct passed by value).
        // SAFETY: see above.
        let version = unsafe { as_fn::<FnVersion>(sym(c"gdr_runtime_get_version")?) };
        let (mut major, mut minor) = (0, 0);
        // SAFETY: two valid out pointers.
        unsafe { version(&mut major, &mut minor) };
        if major != GDR_API_MAJOR {
            return Err(format!("libgdrapi API version {major}.{minor} is not {GDR_API_MAJOR}.x"));
        }
        // SAFETY: see above.
        let open = unsafe { as_fn::<FnOpen>(sym(c"gdr_open")?) };
        let get_info = match lib.symbol(c"gdr_get_info_v2") {
            // SAFETY: see above.
            Some(p) => unsafe { as_fn::<FnGetInfo>(p) },
            // SAFETY: the v1 symbol writes 40 bytes, within our 48-byte GdrInfo.
            None => unsafe { as_fn::<FnGetInfo>(sym(c"gdr_get_info")?) },
        };
        // SAFETY: see above.
        let (pin, unpin, map, unmap) = unsafe {
            (
                as_fn::<FnPin>(sym(c"gdr_pin_buffer")?),
                as_fn::<FnUnpin>(sym(c"gdr_unpin_buffer")?),
                as_fn::<FnMap>(sym(c"gdr_map")?),
                as_fn::<FnUnmap>(sym(c"gdr_unmap")?),
            )
        };
        // SAFETY: gdr_open takes no arguments.
        let g = unsafe { open() };
        if g.is_null() {
            return Err("gdr_open() failed (is the gdrdrv module loaded?)".into());
        }
        Ok(Gdr { _lib: lib, g: g as usize, pin, unpin, map, unmap, get_info })
    }

    pub fn pin(&self, dptr: u64, size: usize) -> Result<GdrMh, Errno> {
        let mut mh = GdrMh::default();
        // SAFETY: g is live; out pointer valid; gdrcopy validates the address.
        rc(unsafe { (self.pin)(self.g as *mut c_void, dptr as c_ulong, size, 0, 0, &mut mh) })?;
        Ok(mh)
    }
    pub fn unpin(&self, mh: GdrMh) -> Result<(), Errno> {
        // SAFETY: mh came from pin.
        rc(unsafe { (self.unpin)(self.g as *mut c_void, mh) })
    }
    pub fn map(&self, mh: GdrMh, size: usize) -> Result<usize, Errno> {
        let mut va: *mut c_void = std::ptr::null_mut();
        // SAFETY: mh came from pin; out pointer valid.
        rc(unsafe { (self.map)(self.g as *mut c_void, mh, &mut va, size) })?;
        Ok(va as usize)
    }
    pub fn unmap(&self, mh: GdrMh, va: usize, size: usize) -> Result<(), Errno> {
        // SAFETY: va/size are what map returned for mh.
        rc(unsafe { (self.unmap)(self.g as *mut c_void, mh, va as *mut c_void, size) })
    }
    pub fn info(&self, mh: GdrMh) -> Result<GdrInfo, Errno> {
        let mut i = GdrInfo::default();
        // SAFETY: out pointer to a 48-byte struct.
        rc(unsafe { (self.get_info)(self.g as *mut c_void, mh, &mut i) })?;
        Ok(i)
    }
}

/// The process's gdrcopy instance, opened on first use.
pub fn gdr() -> Result<&'static Gdr, Errno> {
    static G: OnceLock<Result<Gdr, String>> = OnceLock::new();
    match G.get_or_init(Gdr::open) {
        Ok(g) => Ok(g),
        Err(e) => {
            gds_err!("gds_alloc_mapped_memory", "gdrcopy unavailable: {e}");
            Err(Errno::ENODEV)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_positive_errnos() {
        assert_eq!(rc(0), Ok(()));
        assert_eq!(rc(-22), Err(Errno::EINVAL));
        assert_eq!(rc(12), Err(Errno::ENOMEM));
    }
}
