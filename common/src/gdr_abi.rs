//! Layouts of gdrapi.h that more than one crate reads: libgdrapi fills them, libgdsync (which
//! loads libgdrapi at run time) reads them. One definition for the workspace.

#![forbid(unsafe_code)]

use std::ffi::c_uint;

/// `gdr_info_v2_t` (48 bytes). `mapped` and `wc_mapping` are bits 0 and 1 of `flag_bits`, the
/// 4-byte unit at 36; the legacy `gdr_get_info` fills the first 40 bytes only.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrInfoV2 {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub flag_bits: c_uint,
    pub mapping_type: u32,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn gdr_info_v2_layout() {
        assert_eq!(size_of::<GdrInfoV2>(), 48);
        assert_eq!(offset_of!(GdrInfoV2, page_size), 16);
        assert_eq!(offset_of!(GdrInfoV2, tm_cycles), 24);
        assert_eq!(offset_of!(GdrInfoV2, cycles_per_ms), 32);
        assert_eq!(offset_of!(GdrInfoV2, flag_bits), 36);
        assert_eq!(offset_of!(GdrInfoV2, mapping_type), 40);
    }
}
