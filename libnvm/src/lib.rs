//! libnvm: a drop-in replacement for the user-space NVMe driver library of ssd-gpu-dma
//! (`libnvm.so`, headers `nvm_*.h`), with a safe Rust API on the same core.
//!
//! Layers, top to bottom (every import points down):
//! - [`capi`]: the `nvm_*` C ABI, handle tables and the boundary guard;
//! - [`safe`]: the Rust API;
//! - [`admin`]: admin queue pair, RPC and admin commands;
//! - [`dma`]: DMA windows; [`ctrl`]: controllers, reset;
//! - [`queue`]: queue descriptors and ring arithmetic;
//! - [`mmio`]: volatile register and ring access; [`kernel`]: syscalls and module ioctls;
//! - [`status`], [`regs`], [`abi`]: error values, register layout, C layouts (leaves).

#[macro_use]
mod log;

pub mod abi;
pub mod admin;
pub mod capi;
pub mod ctrl;
pub mod dma;
pub mod kernel;
pub mod mmio;
pub mod queue;
pub mod regs;
pub mod safe;
pub mod status;

pub use gpudirect_common::Errno;
pub use safe::{AdminQueue, Controller, DmaWindow, IoQueuePair};
pub use status::{Error, Result, Status};
