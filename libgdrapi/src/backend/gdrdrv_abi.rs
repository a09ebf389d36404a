//! The gdrdrv 2.6 ioctl ABI: command numbers, parameter structs and the one unsafe `ioctl` call.
//!
//! Several commands were declared upstream with a *pointer* type as the size argument, so their
//! encoded size is 8 although the driver copies the whole struct; the numbers below reproduce that.

use std::ffi::{c_int, c_ulong};
use std::os::fd::{AsRawFd, BorrowedFd};

use gpudirect_common::{Errno, Result};

pub const GDRDRV_IOCTL_MAGIC: u32 = 0xDA;

/// `_IOWR(0xDA, nr, size)` with the asm-generic encoding (x86-64, arm64, ppc64 share the bits).
const fn iowr(nr: u32, size: u32) -> c_ulong {
    ((3u32 << 30) | (size << 16) | (GDRDRV_IOCTL_MAGIC << 8) | nr) as c_ulong
}

pub const IOC_PIN_BUFFER: c_ulong = iowr(1, size_of::<PinBufferParams>() as u32);
pub const IOC_UNPIN_BUFFER: c_ulong = iowr(2, 8);
pub const IOC_GET_CB_FLAG: c_ulong = iowr(3, 8);
pub const IOC_GET_INFO: c_ulong = iowr(4, 8);
pub const IOC_GET_INFO_V2: c_ulong = iowr(5, 8);
pub const IOC_GET_ATTR: c_ulong = iowr(6, 8);
pub const IOC_PIN_BUFFER_V2: c_ulong = iowr(7, size_of::<PinBufferV2Params>() as u32);
pub const IOC_REQ_MAPPING_TYPE: c_ulong = iowr(8, 8);
pub const IOC_GET_VERSION: c_ulong = iowr(255, 8);

/// Driver versions at which features appeared (the library gates on them).
pub const VERSION_WITH_GET_INFO_V2: u32 = 0x0002_0004;
pub const VERSION_WITH_GET_ATTR: u32 = 0x0002_0005;
pub const VERSION_WITH_PIN_BUFFER_V2: u32 = 0x0002_0005;
pub const VERSION_WITH_REQ_MAPPING_TYPE: u32 = 0x0002_0005;

pub const PIN_FLAG_FORCE_PCIE: u32 = 0x1;
pub const ATTR_USE_PERSISTENT_MAPPING: u32 = 1;
pub const ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: u32 = 2;

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct PinBufferParams {
    pub addr: u64,
    pub size: u64,
    pub p2p_token: u64,
    pub va_space: u32,
    pub handle: u64,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct PinBufferV2Params {
    pub addr: u64,
    pub size: u64,
    pub flags: u32,
    pub pad: u32,
    pub handle: u64,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct UnpinBufferParams {
    pub handle: u64,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct GetCbFlagParams {
    pub handle: u64,
    pub flag: u32,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct GetInfoParams {
    pub handle: u64,
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tsc_khz: u32,
    pub tm_cycles: u64,
    pub mapped: u32,
    pub wc_mapping: u32,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct GetInfoV2Params {
    pub handle: u64,
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tsc_khz: u32,
    pub tm_cycles: u64,
    pub mapping_type: u32,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct GetAttrParams {
    pub attr: u32,
    pub val: u32,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct ReqMappingTypeParams {
    pub handle: u64,
    pub mapping_type: u32,
}

#[repr(C)]
#[derive(Default, Debug, Clone, Copy)]
pub struct GetVersionParams {
    pub gdrdrv_version: u32,
    pub minimum_gdr_api_version: u32,
}

/// Marker for the parameter structs above: plain-old-data that the driver reads and writes whole.
///
/// # Safety
/// Implementors must be `repr(C)` structs of integers whose layout equals the driver's struct for
/// every command they are used with.
pub unsafe trait IoctlParams: Copy {}
// SAFETY: each struct is repr(C), made of integers, and laid out as gdrdrv's (tests below).
unsafe impl IoctlParams for PinBufferParams {}
// SAFETY: as above.
unsafe impl IoctlParams for PinBufferV2Params {}
// SAFETY: as above.
unsafe impl IoctlParams for UnpinBufferParams {}
// SAFETY: as above.
unsafe impl IoctlParams for GetCbFlagParams {}
// SAFETY: as above.
unsafe impl IoctlParams for GetInfoParams {}
// SAFETY: as above.
unsafe impl IoctlParams for GetInfoV2Params {}
// SAFETY: as above.
unsafe impl IoctlParams for GetAttrParams {}
// SAFETY: as above.
unsafe impl IoctlParams for ReqMappingTypeParams {}
// SAFETY: as above.
unsafe impl IoctlParams for GetVersionParams {}

/// Issues `cmd` on the gdrdrv file with `params` as the in/out argument.
pub fn ioctl<P: IoctlParams>(fd: BorrowedFd<'_>, cmd: c_ulong, params: &mut P) -> Result<()> {
    // SAFETY: `fd` is an open descriptor for the call's duration; `params` is a live, exclusively
    // borrowed struct whose layout matches what the driver copies for `cmd` (IoctlParams contract).
    let r: c_int = unsafe { libc::ioctl(fd.as_raw_fd(), cmd, params as *mut P) };
    if r == -1 { Err(Errno::last()) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    #[test]
    fn command_numbers_match_gdrdrv() {
        assert_eq!(IOC_PIN_BUFFER, 0xC028_DA01);
        assert_eq!(IOC_UNPIN_BUFFER, 0xC008_DA02);
        assert_eq!(IOC_GET_CB_FLAG, 0xC008_DA03);
        assert_eq!(IOC_GET_INFO, 0xC008_DA04);
        assert_eq!(IOC_GET_INFO_V2, 0xC008_DA05);
        assert_eq!(IOC_GET_ATTR, 0xC008_DA06);
        assert_eq!(IOC_PIN_BUFFER_V2, 0xC020_DA07);
        assert_eq!(IOC_REQ_MAPPING_TYPE, 0xC008_DA08);
        assert_eq!(IOC_GET_VERSION, 0xC008_DAFF);
    }

    #[test]
    fn parameter_layouts_match_gdrdrv() {
        assert_eq!(size_of::<PinBufferParams>(), 40);
        assert_eq!(offset_of!(PinBufferParams, va_space), 24);
        assert_eq!(offset_of!(PinBufferParams, handle), 32);
        assert_eq!(size_of::<PinBufferV2Params>(), 32);
        assert_eq!(offset_of!(PinBufferV2Params, flags), 16);
        assert_eq!(offset_of!(PinBufferV2Params, handle), 24);
        assert_eq!(size_of::<UnpinBufferParams>(), 8);
        assert_eq!(size_of::<GetCbFlagParams>(), 16);
        assert_eq!(offset_of!(GetCbFlagParams, flag), 8);
        assert_eq!(size_of::<GetInfoParams>(), 48);
        assert_eq!(offset_of!(GetInfoParams, tsc_khz), 28);
        assert_eq!(offset_of!(GetInfoParams, tm_cycles), 32);
        assert_eq!(offset_of!(GetInfoParams, mapped), 40);
        assert_eq!(offset_of!(GetInfoParams, wc_mapping), 44);
        assert_eq!(size_of::<GetInfoV2Params>(), 48);
        assert_eq!(offset_of!(GetInfoV2Params, mapping_type), 40);
        assert_eq!(size_of::<GetAttrParams>(), 8);
        assert_eq!(std::mem::align_of::<GetAttrParams>(), 4);
        assert_eq!(size_of::<ReqMappingTypeParams>(), 16);
        assert_eq!(offset_of!(ReqMappingTypeParams, mapping_type), 8);
        assert_eq!(size_of::<GetVersionParams>(), 8);
    }
}
