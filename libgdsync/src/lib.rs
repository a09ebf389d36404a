//! libgdsync (GPUDirect Async) in Rust: a drop-in replacement for `libgdsync.so.2` exporting the
//! `gds_*` C ABI of API 2.2 (plus the five API 2.1 stream helpers).
//!
//! Layout: [`capi`] is the C boundary; [`memops`] translates descriptors into CUDA stream memory
//! operations; [`cpu`] executes them on the CPU; [`peer`] detects device capabilities; [`memmgr`]
//! registers host/I/O memory; [`ranges`] + [`provider`] are the seam the verbs providers plug into;
//! [`driver`] and [`gdr`] are the only modules calling libcuda and libgdrapi (both loaded at run time).

#[macro_use]
pub mod log;

pub mod abi;
pub mod capi;
pub mod cpu;
pub mod driver;
pub mod env;
pub mod gdr;
pub mod mapped;
pub mod memmgr;
pub mod memops;
pub mod mlx5;
pub mod mlx5dv;
pub mod mlx5prov;
pub mod peer;
pub mod provider;
pub mod proxy;
pub mod ranges;
pub mod verbs;

#[cfg(test)]
mod testcuda;
