//! The simulated driver behind the C API (`capi.rs`): configuration, devices, contexts, the
//! memory range table, streams and events, the VMM API and dma-buf export.
//!
//! Everything here is safe Rust except calls into [`crate::sys`] that change the address space,
//! each with its own justification.
//!
//! One concept per file, each importing only what lies below it:
//! - `config`: the `CUDASIM_*` configuration and the device geometry (page and region sizes);
//! - `region`: cuMemAlloc's regions, their slots and host-mode memfd pieces;
//! - `tables`: the objects handed out (contexts, ranges, VMM handles, reservations) and lookups;
//! - `hostmap`: host-mode mappings at 2 MiB-aligned addresses;
//! - `state`: the driver instance of the process ([`Driver`], cuInit);
//! - `device`, `context`, `streams`, `memory`, `vmm`, `dmabuf`: the operations of each concept,
//!   as `impl Driver` blocks. Releasing memory ties them together: a context's teardown and
//!   cuMemUnmap release ranges through `memory`, which drains `streams` and unmaps through `vmm`.

mod config;
mod context;
mod device;
mod dmabuf;
mod hostmap;
mod memory;
mod region;
mod state;
mod streams;
mod tables;
mod vmm;

pub use config::{GPU_PAGE, R, driver_version};
pub use context::with_stack;
pub use state::{Driver, get, init};
pub use tables::{Backing, Kind, Range, Tables};

// Tests beside the pieces they test, as siblings (they drive the C API, which builds on this
// module): see `crate::test_util` for their shared helpers.
#[cfg(test)]
mod context_tests;
#[cfg(test)]
mod device_tests;
#[cfg(test)]
mod dmabuf_tests;
#[cfg(test)]
mod memory_tests;
#[cfg(test)]
mod region_tests;
#[cfg(test)]
mod streams_tests;
#[cfg(test)]
mod vmm_tests;
