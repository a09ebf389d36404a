//! The driver instance of this process: its configuration, backend and tables, made by cuInit.

use super::config::{Config, DEFAULT_HOST_MEM, Platform, R, driver_version, env_flag, env_num};
use super::tables::{PrimarySlot, Tables, lock};
use crate::gpusim::{self, Gpusim};
use crate::stream::Stream;
use crate::sys;
use crate::types::*;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

pub enum Backend {
    Host,
    Gpusim(Gpusim),
}

pub struct Driver {
    pub pid: u32,
    pub cfg: Config,
    pub backend: Backend,
    pub t: Mutex<Tables>,
    pub(super) all_streams: Mutex<Vec<Weak<Stream>>>,
    /// Serialises cuMemAlloc/cuMemFree region bookkeeping (taken before `t`, never inside it).
    pub(super) alloc_lock: Mutex<()>,
}

static DRIVER: Mutex<Option<Arc<Driver>>> = Mutex::new(None);

/// cuInit.
pub fn init(flags: u32) -> R<()> {
    if flags != 0 {
        return Err(err::INVALID_VALUE);
    }
    let mut g = lock(&DRIVER);
    if g.as_ref().is_some_and(|d| d.pid == sys::pid()) {
        return Ok(());
    }
    let cfg = Config {
        device_count: env_num("CUDASIM_DEVICE_COUNT").unwrap_or(1),
        dmabuf: env_flag("CUDASIM_DMABUF"),
        host_mem: env_num("CUDASIM_MEM_SIZE").unwrap_or(DEFAULT_HOST_MEM),
        wait_timeout: env_num::<u64>("CUDASIM_WAIT_TIMEOUT_MS").filter(|&v| v > 0).map(Duration::from_millis),
        platform: Platform::from_env().ok_or(err::INVALID_VALUE)?,
    };
    if cfg.device_count <= 0 {
        crate::log!("CUDASIM_DEVICE_COUNT={}: no device", cfg.device_count);
        return Err(err::NO_DEVICE);
    }
    let want = std::env::var("CUDASIM_BACKEND").unwrap_or_else(|_| "auto".into());
    let have_dev = std::path::Path::new("/dev/gpusim").exists();
    let backend = match want.as_str() {
        "host" => Backend::Host,
        "auto" if !have_dev => Backend::Host,
        "auto" | "gpusim" => match Gpusim::open().and_then(|g| g.info().map(|_| g)) {
            Ok(g) => Backend::Gpusim(g),
            Err(e) => {
                crate::log!("cannot use {}: {e}", gpusim::DEVICE_PATH.to_string_lossy());
                return Err(if have_dev { err::OPERATING_SYSTEM } else { err::NO_DEVICE });
            }
        },
        other => {
            crate::log!("CUDASIM_BACKEND={other:?}: expected host, gpusim or auto");
            return Err(err::INVALID_VALUE);
        }
    };
    crate::log!(
        "initialised: {} device(s), {} memory, driver version {}",
        cfg.device_count,
        if matches!(backend, Backend::Host) { "host" } else { "gpusim" },
        driver_version()
    );
    let mut tables = Tables::default();
    tables.primary.resize_with(cfg.device_count as usize, PrimarySlot::default);
    *g = Some(Arc::new(Driver {
        pid: sys::pid(),
        cfg,
        backend,
        t: Mutex::new(tables),
        all_streams: Mutex::new(Vec::new()),
        alloc_lock: Mutex::new(()),
    }));
    Ok(())
}

/// The initialised driver of this process (a fork child must call cuInit again).
pub fn get() -> R<Arc<Driver>> {
    let g = lock(&DRIVER);
    match g.as_ref() {
        Some(d) if d.pid == sys::pid() => Ok(Arc::clone(d)),
        _ => Err(err::NOT_INITIALIZED),
    }
}

impl Driver {
    pub fn tables(&self) -> MutexGuard<'_, Tables> {
        lock(&self.t)
    }

    pub fn is_gpusim(&self) -> bool {
        matches!(self.backend, Backend::Gpusim(_))
    }

    /// Whether dma-buf export works (CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED): always on gpusim,
    /// which exports kernel dma-bufs as the real driver does on an H100 (whatever the driver
    /// version: the 13.3 requirement is gdrcopy's, for mmap); in host memory mode only over
    /// memfd-backed memory, i.e. with CUDASIM_DMABUF=1.
    pub fn dmabuf(&self) -> bool {
        self.is_gpusim() || self.cfg.dmabuf
    }

    pub fn check_device(&self, dev: CUdevice) -> R<()> {
        if dev >= 0 && dev < self.cfg.device_count { Ok(()) } else { Err(err::INVALID_DEVICE) }
    }
}
