//! The memop engine: what a descriptor or a provider's peer-op list becomes on a CUDA stream (or
//! on the CPU), with the per-device capabilities, the host-memory registration cache and the
//! registered ranges that peer operations name, and `gds_alloc_mapped_memory`. Safe code over plain values; the C layer copies
//! everything out of application memory first ([`crate::capi::parse`]).

pub mod cpu;
pub mod mapped;
pub mod memmgr;
pub mod memo;
pub mod memops;
pub mod mlx5_info;
pub mod peer;
pub mod post_line;
pub mod ranges;
