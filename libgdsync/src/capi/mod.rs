//! The C ABI: every exported `gds_*` function, with upstream's names and prototypes, kept thin:
//! argument checks, then a call into [`crate::engine`] or [`crate::verbs`]. One file per
//! installed header: `core` (`gdsync/core.h`), `mlx5` (`gdsync/mlx5.h`) and `tools`
//! (`gdsync/tools.h`, with the API 2.1 stream helpers it declares under
//! `GDS_ENABLE_LEGACY_API_2_1`); below them `post`, the stream submission they share.
//!
//! Every export is defined through [`gpudirect_common::export!`] with the library hooks of
//! [`hooks::Gds`]: a panic is logged and becomes `EIO` (NULL with `errno` for `gds_create_qp`), and a
//! forked child is refused before any body runs. Five exports are the macro's unguarded form,
//! because their common case is a leaf that cannot panic: the two value prepares, the value
//! posts (`gds_stream_post_poll_dword`, `gds_stream_post_poke_dword`) and
//! `gds_stream_post_descriptors`; everything else they do runs in an out-of-line twin under
//! `gpudirect_common::guarded!` with the export's name. Each function states its own pointer
//! contract in one line (they differ). Application memory is read by [`parse`], once, into the
//! engine's safe types.

mod hooks;

pub mod parse;

mod core;
mod mlx5;
mod post;
mod tools;

pub use self::core::*;
pub use self::mlx5::*;
pub use self::tools::*;
