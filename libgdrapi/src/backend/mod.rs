//! The two ways of reaching GPU memory from the CPU, chosen once per instance at open time.

pub mod dmabuf;
pub mod gdrdrv;
pub mod gdrdrv_abi;
pub mod pin;

use gpudirect_common::{Errno, Result};

use dmabuf::{DmaBuf, DmaBufPin};
use gdrdrv::Gdrdrv;
pub use pin::{PinFacts, PinRequest};

/// The backend an instance uses.
#[derive(Debug)]
pub enum Backend {
    Gdrdrv(Gdrdrv),
    DmaBuf(DmaBuf),
}

/// Backend state of one pinned buffer.
#[derive(Debug)]
pub enum PinBackend {
    /// The kernel handle gdrdrv returned.
    Gdrdrv { handle: u64 },
    /// The dma-buf and what the pin recorded.
    DmaBuf { pin: DmaBufPin, facts: PinFacts },
}

/// Upstream's selection (spec §4.1): gdrdrv unless `GDRCOPY_USE_DMABUF_MMAP` is exactly "1",
/// then dma-buf as the fallback.
pub fn select(device_path: &str) -> Result<Backend> {
    let forced = std::env::var_os("GDRCOPY_USE_DMABUF_MMAP").is_some_and(|v| v == "1");
    if !forced {
        match Gdrdrv::open(device_path) {
            Ok(d) => {
                gdr_info!("Using gdrdrv backend");
                return Ok(Backend::Gdrdrv(d));
            }
            Err(_) => gdr_info!("gdrdrv is not installed or loaded; detecting if CUDA driver supports dmabuf mmap."),
        }
    }
    match DmaBuf::open() {
        Ok(b) => {
            gdr_info!("Using dma-buf backend");
            Ok(Backend::DmaBuf(b))
        }
        Err(e) => {
            gdr_err!(
                "Error: gdrcopy requires gdrdrv or CUDA driver with dmabuf mmap support (at least one is required)"
            );
            Err(if e == Errno::ENOENT { Errno::ENODEV } else { e })
        }
    }
}
