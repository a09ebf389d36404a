//! Pieces shared by libgdrapi, libgdsync and the tools.
//!
//! - [`errno`]: the one error type (an errno value) and the helper that turns a failed syscall into it;
//! - [`log`]: an environment-configured logger that writes one line per event to stderr;
//! - [`boundary`]: [`export!`] for every exported C function (the panic guard, its failure value
//!   by return type, the library's logging hook) and [`guarded!`] for an unguarded export's twin;
//! - [`dl`] and [`cuda`]: the one place that loads libcuda at run time (dlopen + cuGetProcAddress);
//! - [`gdr_abi`]: gdrapi.h layouts read by more than one crate (`gdr_info_v2_t`);
//! - [`tls`]: per-thread blocks reached in two instructions (initial-exec TLS), for hot paths.

pub mod boundary;
pub mod cuda;
pub mod dl;
pub mod errno;
pub mod gdr_abi;
pub mod log;
pub mod tls;

pub use errno::{Errno, Result};
