//! The C ABI: every exported `gds_*` function, with upstream's names and prototypes, kept thin:
//! argument checks, then a call into [`crate::engine`] or [`crate::verbs`]. One file per
//! installed header: `core` (`gdsync/core.h`), `mlx5` (`gdsync/mlx5.h`) and `tools`
//! (`gdsync/tools.h`, with the API 2.1 stream helpers it declares under
//! `GDS_ENABLE_LEGACY_API_2_1`); below them `post`, the stream submission they share.
//!
//! Each function body runs inside [`ffi!`] (panic guard + errno conversion through
//! `gpudirect_common::boundary::errno_call`). Application memory is read by [`parse`], once,
//! into the engine's safe types.

/// Runs `$body` (a block evaluating to `Result<()>`) behind the panic guard and returns 0 or the
/// error number, as every `int`-returning gds function does.
macro_rules! ffi {
    ($name:expr, $body:block) => {
        gpudirect_common::boundary::errno_call(
            |m| gds_err!($name, "internal error (panic): {m}"),
            || -> gpudirect_common::Result<()> {
                crate::fork::check($name)?;
                $body
            },
        )
    };
}

pub mod parse;

mod core;
mod mlx5;
mod post;
mod tools;

pub use self::core::*;
pub use self::mlx5::*;
pub use self::tools::*;
