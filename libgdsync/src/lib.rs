//! libgdsync (GPUDirect Async) in Rust: a drop-in replacement for `libgdsync.so.2` exporting the
//! `gds_*` C ABI of API 2.2 (plus the five API 2.1 stream helpers).
//!
//! The tree, top to bottom (a module only uses modules below it; docs/gdsync.md has the picture):
//! * [`capi`]: the C surface: every exported function, thin: argument checks, then a call down.
//!   [`capi::parse`] reads the application's descriptors and requests into safe values, once.
//! * [`verbs`]: the QP/CQ half: the provider seam on top ([`verbs::Provider`], dispatch by
//!   `GDS_PROVIDER`), the two providers ([`verbs::proxy`], [`verbs::mlx5`]) under it, and below
//!   both the pieces they share: MOFED's exp-verbs layouts ([`verbs::exp`]), registered host pages
//!   ([`verbs::area`]), the `poll_cq` hook ([`verbs::hook`]) and libibverbs itself ([`verbs::ibv`]).
//! * [`engine`]: the memop engine: descriptors and peer-op lists to CUDA stream memory operations
//!   ([`engine::memops`]), their CPU execution ([`engine::cpu`]), device capabilities
//!   ([`engine::peer`]), the host-memory registration cache ([`engine::memmgr`]), the registered
//!   ranges peer ops name ([`engine::ranges`]), mapped memory ([`engine::mapped`]) and the
//!   `gdsync/mlx5.h` info helpers.
//! * [`cuda`]: the only code calling libcuda ([`cuda`] itself) and libgdrapi ([`cuda::gdr`]).
//! * [`abi`], [`env`], `log`: C types, environment settings, the logger.
//!
//! Only the C ABI is this crate's interface: the modules are `pub(crate)`. The
//! `integration-tests` feature opens the few a Rust integration test needs (libgdsync/tests).

#[macro_use]
mod log;

pub mod abi;
pub mod capi;

#[cfg(feature = "integration-tests")]
pub mod cuda;
#[cfg(not(feature = "integration-tests"))]
pub(crate) mod cuda;

#[cfg(feature = "integration-tests")]
pub mod engine;
#[cfg(not(feature = "integration-tests"))]
pub(crate) mod engine;

pub(crate) mod env;
pub(crate) mod fork;
pub(crate) mod sync;
pub(crate) mod verbs;
