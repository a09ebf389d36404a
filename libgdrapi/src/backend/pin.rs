//! What both backends take and give for one pin: the request and the facts of a pinned range.
//! Below both backends and their dispatcher (`mod.rs`), so a backend never imports the latter.

#![forbid(unsafe_code)]

use crate::abi::MappingType;

/// What the caller asks to pin.
#[derive(Clone, Copy, Debug, Default)]
pub struct PinRequest {
    pub addr: u64,
    pub size: u64,
    pub flags: u32,
    pub p2p_token: u64,
    pub va_space: u32,
}

/// What is known about a pinned range (the fields of `gdr_info_v2_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinFacts {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub mapping_type: MappingType,
}
