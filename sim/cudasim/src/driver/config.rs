//! The driver's configuration (`CUDASIM_*` environment) and the simulated device's geometry:
//! the facts every other part of the driver reads and none of them changes.

use crate::types::*;
use std::time::Duration;

pub type R<T> = Result<T, CUresult>;

/// Device page size and allocation granularity: 64 KiB, as NVIDIA GPUs.
pub const GPU_PAGE: u64 = 0x10000;
/// cuMemAlloc alignment and size granularity of small allocations (CUDA documents at least 256).
pub const SUBALLOC_ALIGN: u64 = 256;
/// Size and alignment of the regions small allocations are carved from; allocations of at least
/// this size get a region of their own (2 MiB aligned, size rounded up to 64 KiB).
pub const REGION_SIZE: u64 = 2 << 20;
pub const DEFAULT_DRIVER_VERSION: i32 = 13000;
pub(super) const DEFAULT_HOST_MEM: u64 = 16 << 30;

pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

pub(super) fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
    let v = std::env::var(name).ok()?;
    match v.trim().parse() {
        Ok(n) => Some(n),
        Err(_) => {
            crate::log!("ignoring {name}={v:?}: not a number");
            None
        }
    }
}

pub fn driver_version() -> i32 {
    env_num("CUDASIM_DRIVER_VERSION").unwrap_or(DEFAULT_DRIVER_VERSION)
}

pub fn round_up(v: u64, a: u64) -> Option<u64> {
    v.checked_add(a - 1).map(|x| x & !(a - 1))
}

pub struct Config {
    pub device_count: i32,
    pub dmabuf: bool,
    pub host_mem: u64,
    pub wait_timeout: Option<Duration>,
    pub platform: Platform,
}

/// The machine the simulated GPUs sit in (`CUDASIM_PLATFORM`): decides the attributes that make
/// gdrcopy and its consumers take their coherent-platform and FORCE_PCIE paths.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Platform {
    /// `pcie` (default): a discrete compute-capability-9.0 GPU behind PCIe, not cache-coherent
    /// with the CPU (attribute 100, pageable access through host page tables, reads 0).
    Pcie,
    /// `coherent`: Grace Hopper-like, compute capability 9.0, CPU and GPU coherent (100 = 1).
    Coherent,
    /// `coherent-cc10`: Grace Blackwell-like, compute capability 10.0, coherent: the platform
    /// where pins with FORCE_PCIE (BAR1 mappings) apply.
    CoherentCc10,
}

impl Platform {
    pub(super) fn from_env() -> Option<Platform> {
        match std::env::var("CUDASIM_PLATFORM").as_deref() {
            Err(_) | Ok("") | Ok("pcie") => Some(Platform::Pcie),
            Ok("coherent") => Some(Platform::Coherent),
            Ok("coherent-cc10") => Some(Platform::CoherentCc10),
            Ok(other) => {
                crate::log!("CUDASIM_PLATFORM={other:?}: expected pcie, coherent or coherent-cc10");
                None
            }
        }
    }

    pub(super) fn coherent(self) -> bool {
        self != Platform::Pcie
    }

    pub(super) fn cc_major(self) -> i32 {
        if self == Platform::CoherentCc10 { 10 } else { 9 }
    }
}
