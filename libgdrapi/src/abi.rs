//! Types and constants shared with C through `gdrapi.h`, with upstream's exact values and layouts.
//!
//! Layout tests at the bottom pin every size and offset to the numbers in the spec; the C side is
//! checked again by `compat-tests/`.

#![forbid(unsafe_code)]

use std::ffi::{c_int, c_uint, c_ulong};

pub const MAJOR_VERSION_SHIFT: u32 = 16;
pub const GDR_API_MAJOR_VERSION: c_int = 2;
pub const GDR_API_MINOR_VERSION: c_int = 6;
pub const GDR_API_VERSION: u32 = ((GDR_API_MAJOR_VERSION as u32) << MAJOR_VERSION_SHIFT) | GDR_API_MINOR_VERSION as u32;
pub const MINIMUM_GDRDRV_VERSION: u32 = 2 << MAJOR_VERSION_SHIFT;

pub const GPU_PAGE_SHIFT: u32 = 16;
pub const GPU_PAGE_SIZE: u64 = 1 << GPU_PAGE_SHIFT;
pub const GPU_PAGE_OFFSET: u64 = GPU_PAGE_SIZE - 1;
pub const GPU_PAGE_MASK: u64 = !GPU_PAGE_OFFSET;

/// `gdr_pin_flags_t`.
pub const GDR_PIN_FLAG_DEFAULT: u32 = 0;
pub const GDR_PIN_FLAG_FORCE_PCIE: u32 = 1;

/// `gdr_map_flags_t`.
pub const GDR_MAP_FLAG_DEFAULT: c_int = 0;
pub const GDR_MAP_FLAG_REQ_WC_MAPPING: c_int = 1;
pub const GDR_MAP_FLAG_REQ_CACHE_MAPPING: c_int = 2;
pub const GDR_MAP_FLAG_REQ_DEVICE_MAPPING: c_int = 3;

/// `gdr_attr_t`.
pub const GDR_ATTR_USE_PERSISTENT_MAPPING: c_int = 1;
pub const GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE: c_int = 2;
pub const GDR_ATTR_USING_DMA_BUF_MMAP: c_int = 3;

/// `gdr_mapping_type_t`: how a pinned buffer is currently mapped into the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(u32)]
pub enum MappingType {
    #[default]
    None = 0,
    WriteCombined = 1,
    Caching = 2,
    Device = 3,
}

impl MappingType {
    pub const ALL: [MappingType; 4] =
        [MappingType::None, MappingType::WriteCombined, MappingType::Caching, MappingType::Device];

    /// The numeric value shared with C and with the gdrdrv ABI (`gdr_mr_type_t`).
    pub fn from_raw(v: u32) -> Option<MappingType> {
        Self::ALL.get(usize::try_from(v).ok()?).copied()
    }

    /// The string `gdr_get_mapping_type_string` returns.
    pub fn name(self) -> &'static std::ffi::CStr {
        match self {
            MappingType::None => c"None",
            MappingType::WriteCombined => c"Write Combining",
            MappingType::Caching => c"Caching",
            MappingType::Device => c"Device",
        }
    }
}

/// `gdr_mh_t`: a memory handle passed by value; `h` is the address of the handle record.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GdrMh {
    pub h: c_ulong,
}

/// `gdr_info_v2_t` (48 bytes): defined once for the workspace (libgdsync reads it too).
pub use gpudirect_common::gdr_abi::GdrInfoV2;

/// The legacy 40-byte `struct gdr_info` that the exported `gdr_get_info` symbol fills.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV1 {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub flag_bits: c_uint,
}

/// Bit of the `mapped` bit-field (GCC little-endian layout).
pub const INFO_BIT_MAPPED: c_uint = 0x1;
/// Bit of the `wc_mapping` bit-field.
pub const INFO_BIT_WC: c_uint = 0x2;

/// Sets the two bit-fields the way upstream does: only these bits change, the rest of the unit is kept.
pub fn set_info_bits(bits: &mut c_uint, mapped: bool, wc: bool) {
    *bits &= !(INFO_BIT_MAPPED | INFO_BIT_WC);
    if mapped {
        *bits |= INFO_BIT_MAPPED;
    }
    if wc {
        *bits |= INFO_BIT_WC;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{align_of, offset_of, size_of};

    #[test]
    fn versions_have_upstream_values() {
        assert_eq!(GDR_API_VERSION, 0x0002_0006);
        assert_eq!(MINIMUM_GDRDRV_VERSION, 0x0002_0000);
        assert_eq!(GPU_PAGE_MASK, 0xFFFF_FFFF_FFFF_0000);
    }

    #[test]
    fn info_layouts_match_the_spec() {
        assert_eq!(size_of::<GdrInfoV2>(), 48);
        assert_eq!(align_of::<GdrInfoV2>(), 8);
        assert_eq!(offset_of!(GdrInfoV2, va), 0);
        assert_eq!(offset_of!(GdrInfoV2, mapped_size), 8);
        assert_eq!(offset_of!(GdrInfoV2, page_size), 16);
        assert_eq!(offset_of!(GdrInfoV2, tm_cycles), 24);
        assert_eq!(offset_of!(GdrInfoV2, cycles_per_ms), 32);
        assert_eq!(offset_of!(GdrInfoV2, flag_bits), 36);
        assert_eq!(offset_of!(GdrInfoV2, mapping_type), 40);
        assert_eq!(size_of::<GdrInfoV1>(), 40);
        assert_eq!(offset_of!(GdrInfoV1, flag_bits), 36);
        assert_eq!(size_of::<GdrMh>(), 8);
    }

    #[test]
    fn bitfields_keep_foreign_bits() {
        let mut b = 0xF0;
        set_info_bits(&mut b, true, false);
        assert_eq!(b, 0xF1);
        set_info_bits(&mut b, true, true);
        assert_eq!(b, 0xF3);
        set_info_bits(&mut b, false, false);
        assert_eq!(b, 0xF0);
    }

    #[test]
    fn mapping_type_names_and_values() {
        assert_eq!(MappingType::from_raw(1), Some(MappingType::WriteCombined));
        assert_eq!(MappingType::from_raw(4), None);
        assert_eq!(MappingType::Caching.name().to_str().unwrap(), "Caching");
        assert_eq!(MappingType::WriteCombined.name().to_str().unwrap(), "Write Combining");
    }
}
