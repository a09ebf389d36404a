//! cudasim: a test-only stand-in for NVIDIA's `libcuda.so.1`.
//!
//! It implements the part of the CUDA driver API that gdrcopy, libgdsync, their test programs
//! and our own libraries use (see `docs/cudasim.md`): devices, contexts, device/host memory
//! (from `/dev/gpusim` inside the test VM, host memory elsewhere), copies, pointer attributes,
//! the VMM API, streams executed in order by one worker thread each, events, stream memory
//! operations, dma-buf export (host mode) and `cuGetProcAddress`. Everything else exported
//! returns `CUDA_ERROR_NOT_SUPPORTED`.
//!
//! Built as a cdylib (`libcuda.so`, soname `libcuda.so.1`) for C consumers and as an rlib so
//! that unit tests can call the same `extern "C"` functions directly.

// `x % n != 0` is kept over `is_multiple_of` so that the crate builds with Rust 1.85.
#![allow(clippy::manual_is_multiple_of)]

/// Logs a line to stderr when `CUDASIM_LOG=1`.
macro_rules! log {
    ($($a:tt)*) => {
        if $crate::log_enabled() {
            eprintln!("cudasim[{}]: {}", std::process::id(), format_args!($($a)*));
        }
    };
}
pub(crate) use log;

/// CUDASIM_LOG: 0 (default) silent, 1 failures and refusals, 2 also every successful call.
pub(crate) fn log_level() -> u32 {
    static LEVEL: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| std::env::var("CUDASIM_LOG").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(0))
}

pub(crate) fn log_enabled() -> bool {
    log_level() >= 1
}

pub mod capi;
mod driver;
mod entry;
#[cfg(all(test, target_arch = "x86_64"))]
mod entry_tests;
mod exec;
mod gpusim;
mod procaddr;
mod stream;
pub mod stubs;
mod sys;
#[cfg(test)]
mod test_util;
pub mod types;

pub use capi::*;
pub use procaddr::{cuGetProcAddress, cuGetProcAddress_v2};

#[cfg(test)]
mod tests;
