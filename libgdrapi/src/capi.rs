//! The `gdr_*` C ABI: exactly the 17 functions of gdrcopy 2.6, with upstream's signatures.
//!
//! Each function checks its pointers, makes one call (the control path in
//! `crate::handles::control`, the copies in `fastcopy` and `copy_general`), and converts the
//! result to upstream's convention (0 or a positive errno); every one but the two copies is
//! guarded by [`gpudirect_common::export!`], which also keeps panics from unwinding into C (EIO,
//! NULL or nothing, by return type, with a log line). Failure values per function are tabulated
//! in docs/return-values.md.
//!
//! # The C pointer contract
//! Every function that dereferences a pointer it is given is an `unsafe extern "C" fn` (safe Rust
//! cannot call it by accident with a bad pointer); `gdr_open`, `gdr_close`, `gdr_unpin_buffer` and
//! `gdr_unmap` take only values the library validates itself, so they stay safe. Their contract
//! is gdrapi.h's: every pointer argument is NULL (refused with `EINVAL`, or ignored where upstream
//! ignores it) or valid for what the function reads or writes through it for the length of the
//! call; handles and `gdr_t` values need not be valid (they are checked). For the two copies the
//! host pointer is valid for `size` bytes (read by `gdr_copy_to_mapping`, written by
//! `gdr_copy_from_mapping`) and does not overlap the mapping; the handle and `map_d_ptr` need not
//! be valid (a stale handle or a range outside the mapping is `EINVAL`).

use std::ffi::{c_char, c_int, c_ulong, c_void};

use gpudirect_common::boundary::Library;
use gpudirect_common::{Errno, Result};

use crate::abi::{GdrInfoV1, GdrInfoV2, GdrMh, MappingType, set_info_bits};
use crate::backend::PinRequest;
use crate::core::{self, Direction};
use crate::fastcopy::{self, FROM_MAPPING, TO_MAPPING};
use crate::handles::{control, parking, registry};

/// Opaque `gdr_t` as C sees it.
pub type GdrT = *mut c_void;

/// libgdrapi's side of the C boundary: a panic is logged as an internal error of the function,
/// an error is its errno.
pub(crate) struct Gdr;

impl Library for Gdr {
    type Error = Errno;
    #[inline(always)]
    fn panicked(function: &str, message: &str) {
        gdr_err!("internal error in {function}: {message}");
    }
    #[inline(always)]
    fn errno(_function: &str, e: Errno) -> c_int {
        e.0
    }
}

/// Checks a caller's out-pointer.
fn out<'a, T>(p: *mut T, what: &str) -> Result<&'a mut T> {
    if p.is_null() {
        gdr_err!("{what} is NULL");
        return Err(Errno::EINVAL);
    }
    // SAFETY: non-NULL, and the C pointer contract (module docs) says the pointer refers to a
    // writable object of type T owned by the caller for the duration of the call.
    Ok(unsafe { &mut *p })
}

fn pin(g: GdrT, req: PinRequest, handle: *mut GdrMh) -> Result<()> {
    let handle = out(handle, "handle")?;
    handle.h = control::pin(g as usize, req)? as c_ulong;
    Ok(())
}

gpudirect_common::export! {
    library = Gdr;
    safety = "The gdrapi.h pointer contract: see [the module docs](crate::capi).";

    pub fn gdr_open() -> GdrT {
        control::open().map_or(std::ptr::null_mut(), |g| g as GdrT)
    }

    pub fn gdr_close(g: GdrT) -> c_int {
        control::close(g as usize)
    }

    pub unsafe fn gdr_pin_buffer(
        g: GdrT,
        addr: c_ulong,
        size: usize,
        p2p_token: u64,
        va_space: u32,
        handle: *mut GdrMh,
    ) -> c_int {
        pin(g, PinRequest { addr, size: size as u64, flags: 0, p2p_token, va_space }, handle)
    }

    pub unsafe fn gdr_pin_buffer_v2(g: GdrT, addr: c_ulong, size: usize, flags: u32, handle: *mut GdrMh) -> c_int {
        pin(g, PinRequest { addr, size: size as u64, flags, ..Default::default() }, handle)
    }

    pub fn gdr_unpin_buffer(g: GdrT, handle: GdrMh) -> c_int {
        control::unpin(g as usize, handle.h as usize)
    }

    pub unsafe fn gdr_get_callback_flag(g: GdrT, handle: GdrMh, flag: *mut c_int) -> c_int {
        let flag = out(flag, "flag")?;
        *flag = c_int::from(control::callback_flag(g as usize, handle.h as usize)?);
        Ok(())
    }

    pub unsafe fn gdr_get_info_v2(g: GdrT, handle: GdrMh, info: *mut GdrInfoV2) -> c_int {
        let info = out(info, "info")?;
        let f = control::info(g as usize, handle.h as usize)?;
        info.va = f.va;
        info.mapped_size = f.mapped_size;
        info.page_size = f.page_size;
        info.tm_cycles = f.tm_cycles;
        info.cycles_per_ms = f.cycles_per_ms;
        set_info_bits(
            &mut info.flag_bits,
            f.mapping_type != MappingType::None,
            f.mapping_type == MappingType::WriteCombined,
        );
        info.mapping_type = f.mapping_type as u32;
        Ok(())
    }

    /// The pre-2.4 entry point, kept for old binaries: fills the 40-byte `struct gdr_info`.
    pub unsafe fn gdr_get_info(g: GdrT, handle: GdrMh, info: *mut GdrInfoV1) -> c_int {
        let info = out(info, "info")?;
        control::info_v1(g as usize, handle.h as usize, info)
    }

    pub unsafe fn gdr_map_v2(g: GdrT, handle: GdrMh, ptr_va: *mut *mut c_void, size: usize, flags: c_int) -> c_int {
        let va = out(ptr_va, "va")?;
        *va = control::map(g as usize, handle.h as usize, size, flags)? as *mut c_void;
        Ok(())
    }

    unguarded pub unsafe fn gdr_map(g: GdrT, handle: GdrMh, va: *mut *mut c_void, size: usize) -> c_int {
        // SAFETY: forwarded to the guarded export with the same contract.
        unsafe { gdr_map_v2(g, handle, va, size, crate::abi::GDR_MAP_FLAG_DEFAULT) }
    }

    pub fn gdr_unmap(g: GdrT, handle: GdrMh, va: *mut c_void, size: usize) -> c_int {
        control::unmap(g as usize, handle.h as usize, va as usize, size)
    }
}
/// The general path of both copy calls (see [`fastcopy`] for the fast one): any mapping type, the
/// process's fence rule, size 0, and every refusal with its errno and log line.
///
/// Like the fast path, a successful copy runs outside the unwinding guard, because the guard's
/// closure call costs as much as the rest of the path together: nothing on it can panic (no
/// indexing, allocation, formatting or unwrap; the copy engines were selected by `gdr_open`,
/// inside the guard). Were a panic ever introduced there, the `extern "C"` boundary would abort
/// the process, never unwind into C. Every refusal is reported by [`copy_failed`], which runs the
/// whole call again inside the guard, so the errno and the log line are the guarded path's.
/// `extern "C"` (cannot unwind) so that the fast path reaches it with a jump.
///
/// Takes the export's arguments in its own order ([`fastcopy::General`]).
///
/// # Safety
/// As `gdr_copy_*`: the host pointer is valid for `size` bytes in the copy's direction and does
/// not overlap the mapping; `h` and the mapping pointer need not be valid.
#[inline(never)]
unsafe extern "C" fn copy_general<const TO: bool>(h: usize, a: usize, b: usize, size: usize) -> c_int {
    let (dir, mapped, host) = if TO { (Direction::ToMapping, a, b) } else { (Direction::FromMapping, b, a) };
    if let Some((announced, m, t)) = registry::mapped(h)
        && (size == 0 || (host != 0 && m.contains(mapped, size)))
    {
        // SAFETY: `m` stays ours while `announced` lives (unmapping parks it) and the device
        // range lies inside it; the C contract: `host` is valid for `size` bytes in the copy's
        // direction and does not overlap the mapping.
        unsafe { core::copy_checked(t, dir, mapped, host, size) };
        drop(announced);
        return 0;
    }
    copy_failed(dir, h, mapped, host, size)
}

/// Whether copies through `handle` take the fast path ([`fastcopy`]) now: `Some(true)` for a live
/// write-combined mapping, `None` where the process cannot use the fast path at all (no
/// `membarrier`, or mappings of several types live). Not part of the C ABI; for tests, because a
/// fast path that silently stopped being taken would still copy correctly, only slower.
#[doc(hidden)]
pub fn fast_path_ready(handle: GdrMh) -> Option<bool> {
    crate::conditions::allowed()
        .then(|| registry::Mirror::of(handle.h as usize).is_some_and(|m| m.fast_window().lim != 0))
}

/// How many unmapped ranges are parked because a copy may still have been using them
/// ([`parking`]). Not part of the C ABI; for tests.
#[doc(hidden)]
pub fn parked_mappings() -> usize {
    parking::parked_count()
}

/// The copy path's refusals: the same call inside the guard, with the checks that say why.
#[cold]
#[inline(never)]
fn copy_failed(dir: Direction, h: usize, mapped: usize, host: usize, size: usize) -> c_int {
    let name = match dir {
        Direction::ToMapping => "gdr_copy_to_mapping",
        Direction::FromMapping => "gdr_copy_from_mapping",
    };
    gpudirect_common::guarded!(Gdr, name, -> c_int {
        let (_announced, m, t) = registry::mapping_of(h)?;
        if size != 0 && host == 0 {
            return Err(null_host());
        }
        // SAFETY: as in `copy_general`.
        unsafe { core::copy_within(m, t, dir, mapped, host, size) }
    })
}

#[cold]
fn null_host() -> Errno {
    gdr_err!("host pointer is NULL");
    Errno::EINVAL
}

gpudirect_common::export! {
    library = Gdr;
    safety = "The gdrapi.h pointer contract: see [the module docs](crate::capi).";

    /// Not guarded: the fast path is a leaf that cannot panic, and every other case goes to the
    /// general path ([`copy_general`]), whose refusals run under the guard ([`copy_failed`]).
    unguarded pub unsafe fn gdr_copy_to_mapping(
        handle: GdrMh,
        map_d_ptr: *mut c_void,
        h_ptr: *const c_void,
        size: usize,
    ) -> c_int {
        // SAFETY: the export's contract; the fast path checks the handle and the range.
        unsafe {
            fastcopy::copy::<TO_MAPPING>(
                handle.h as usize,
                map_d_ptr as usize,
                h_ptr as usize,
                size,
                copy_general::<TO_MAPPING>,
            )
        }
    }

    /// Not guarded, as [`gdr_copy_to_mapping`].
    unguarded pub unsafe fn gdr_copy_from_mapping(
        handle: GdrMh,
        h_ptr: *mut c_void,
        map_d_ptr: *const c_void,
        size: usize,
    ) -> c_int {
        // SAFETY: the export's contract; the fast path checks the handle and the range.
        unsafe {
            fastcopy::copy::<FROM_MAPPING>(
                handle.h as usize,
                h_ptr as usize,
                map_d_ptr as usize,
                size,
                copy_general::<FROM_MAPPING>,
            )
        }
    }

    pub unsafe fn gdr_runtime_get_version(major: *mut c_int, minor: *mut c_int) {
        let (ma, mi) = core::runtime_version();
        if let Ok(m) = out(major, "major") {
            *m = ma;
        }
        if let Ok(m) = out(minor, "minor") {
            *m = mi;
        }
    }

    pub unsafe fn gdr_driver_get_version(g: GdrT, major: *mut c_int, minor: *mut c_int) -> c_int {
        let major = out(major, "major")?;
        let minor = out(minor, "minor")?;
        let (ma, mi) = control::driver_version(g as usize)?;
        *major = ma;
        *minor = mi;
        Ok(())
    }

    pub unsafe fn gdr_get_attribute(g: GdrT, attr: c_int, v: *mut c_int) -> c_int {
        let v = out(v, "v")?;
        *v = 0;
        *v = control::attribute(g as usize, attr)?;
        Ok(())
    }

    pub unsafe fn gdr_get_mapping_type_string(mapping_type: c_int, pstr: *mut *const c_char) -> c_int {
        let pstr = out(pstr, "pstr")?;
        let t = u32::try_from(mapping_type).ok().and_then(MappingType::from_raw).ok_or(Errno::EINVAL)?;
        *pstr = t.name().as_ptr();
        Ok(())
    }
}
