//! libgdsync: GPUDirect Async in Rust (work in progress, see issue 5).
