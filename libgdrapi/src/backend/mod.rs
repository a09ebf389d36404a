//! The two ways of reaching GPU memory from the CPU, chosen once per instance at open time.

pub mod dmabuf;
pub mod gdrdrv;
pub mod gdrdrv_abi;

use gpudirect_common::{Errno, Result};

use crate::abi::MappingType;
use dmabuf::{DmaBuf, DmaBufPin};
use gdrdrv::Gdrdrv;

/// What the caller asks to pin.
#[derive(Clone, Copy, Debug, Default)]
pub struct PinRequest {
    pub addr: u64,
    pub size: u64,
    pub flags: u32,
    pub p2p_token: u64,
    pub va_space: u32,
}

/// What is known about a pinned range (the fields of `gdr_info_v2_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PinFacts {
    pub va: u64,
    pub mapped_size: u64,
    pub page_size: u32,
    pub tm_cycles: u64,
    pub cycles_per_ms: u32,
    pub mapping_type: MappingType,
}

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
