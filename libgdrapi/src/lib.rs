//! libgdrapi: a drop-in replacement for NVIDIA gdrcopy 2.6's user library.
//!
//! Layers, top to bottom (nothing reaches up):
//! - [`capi`]: the `gdr_*` C ABI (the cdylib `libgdrapi.so.2` and `libgdrapi.a`): pointer
//!   checks, one call, errno;
//! - `fastcopy`: the public copy calls' fast path;
//! - `handles`: the C handles, their registry and the protocol that keeps lock-free copies off
//!   unmapped memory (`handles::control` runs the control calls);
//! - [`safe`]: the Rust API ([`Gdr`], [`PinnedBuffer`], [`Mapping`]);
//! - [`core`]: instances, pins, mappings, copies and fences;
//! - `backend`: gdrdrv ioctls or CUDA dma-buf export; `copy`: the copy engines; `cpu_mapping`:
//!   mmap/munmap; `conditions`: the process-wide facts that keep copies off the fast path. These
//!   are private: the C ABI and the safe API are the only ways in (the copy
//!   benchmark reaches the engines through the `bench-internals` feature).

#[macro_use]
mod log;

pub mod abi;
pub(crate) mod backend;
pub mod capi;
mod conditions;
#[cfg(feature = "bench-internals")]
pub mod copy;
#[cfg(not(feature = "bench-internals"))]
pub(crate) mod copy;
pub(crate) mod core;
pub(crate) mod cpu_mapping;
mod fastcopy;
mod handles;
pub mod safe;

pub use abi::MappingType;
pub use backend::PinFacts;
pub use gpudirect_common::{Errno, Result};
pub use safe::{Attribute, Gdr, Mapping, PinnedBuffer};
