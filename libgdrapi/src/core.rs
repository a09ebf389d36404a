//! The library core: instances, pinned buffers, CPU mappings and copies, independent of the C ABI.
//!
//! Thread safety (upstream is not thread-safe; we are): an instance's pin list is behind a mutex;
//! each pin's mapping state is behind a read-write lock that copies hold for reading while they
//! touch the mapping ([`copy`], the Rust API's path), so an unmap or unpin in another thread waits
//! for in-flight copies instead of pulling the mapping out from under them. The C ABI's copies
//! take no lock: they announce themselves instead, and unmapping parks what they may still use
//! (`handles/`). The core knows nothing of that: whoever unmaps or unpins passes a disposer that
//! takes the range away, and the core says only whether the range must go ([`Leave`]).

use std::sync::{Arc, Mutex, RwLock};

use gpudirect_common::{Errno, Result};

use crate::abi::{self, GdrInfoV1, MappingType};
use crate::backend::{self, Backend, PinBackend, PinFacts, PinRequest};
use crate::conditions::{self, Why, count_mapping};
use crate::copy::{self, MappingKind};
use crate::cpu_mapping::{self, CpuMapping, HostPage};

/// What the core knows about a CPU mapping it is taking away: whether the range must leave the
/// address space, or whether the kernel already took the memory out of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Leave {
    /// Nothing removes the range but the caller: an unmap, or an unpin of a dma-buf mapping.
    Remove,
    /// The kernel (gdrdrv) zapped the mapping on unpin and left the range, whose later accesses
    /// fault as upstream's do: it may stay.
    MayStay,
}

/// Takes a CPU mapping away, given what [`Leave`] says: unmaps it, leaves it, or parks it where a
/// copy may still be using it (the C API's disposer, `handles::control`). Called under the pin's
/// write lock, at the point where the mapping stops being the pin's.
pub(crate) trait Dispose: FnOnce(CpuMapping, Leave) -> Result<()> {}
impl<F: FnOnce(CpuMapping, Leave) -> Result<()>> Dispose for F {}

/// The disposer of callers that no lock-free copy can race (the Rust API): unmaps a range that
/// must leave, leaves one that may stay.
pub(crate) fn unmap_now(m: CpuMapping, leave: Leave) -> Result<()> {
    match leave {
        Leave::Remove => cpu_mapping::unmap(m.addr, m.len),
        Leave::MayStay => Ok(()),
    }
}

/// A library instance (`gdr_t`).
#[derive(Debug)]
pub struct Instance {
    backend: Backend,
    page: HostPage,
    pins: Mutex<Vec<Arc<Pin>>>,
}

/// A pinned buffer (`gdr_mh_t`).
#[derive(Debug)]
pub struct Pin {
    backend: PinBackend,
    state: RwLock<PinState>,
}

#[derive(Debug, Default)]
struct PinState {
    mapping: Option<(CpuMapping, MappingType)>,
    unpinned: bool,
}

impl Pin {
    /// The kernel handle (gdrdrv backend), for the C handle record.
    pub fn kernel_handle(&self) -> Option<u64> {
        match self.backend {
            PinBackend::Gdrdrv { handle } => Some(handle),
            PinBackend::DmaBuf { .. } => None,
        }
    }

    /// The current CPU mapping, if any.
    pub fn mapping(&self) -> Option<(CpuMapping, MappingType)> {
        self.read_state().mapping
    }

    /// A pin of no buffer, for tests of the tables that hold pins.
    #[cfg(test)]
    pub(crate) fn detached() -> Arc<Pin> {
        Arc::new(Pin { backend: PinBackend::Gdrdrv { handle: 0 }, state: RwLock::default() })
    }

    fn read_state(&self) -> std::sync::RwLockReadGuard<'_, PinState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_state(&self) -> std::sync::RwLockWriteGuard<'_, PinState> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Which way a copy goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    ToMapping,
    FromMapping,
}

fn kind_of(t: MappingType) -> MappingKind {
    match t {
        MappingType::Caching => MappingKind::Cached,
        MappingType::Device => MappingKind::Device,
        MappingType::WriteCombined | MappingType::None => MappingKind::WriteCombined,
    }
}

/// Copies between a mapped pinned buffer and host memory (`gdr_copy_{to,from}_mapping`).
///
/// `mapped` is the device-side address, `host` the other one. The device range must lie inside the
/// handle's current mapping (upstream does not check and faults instead).
///
/// # Safety
/// `host` must be valid for `len` bytes of reads (ToMapping) or writes (FromMapping) and must not
/// overlap the mapping.
pub unsafe fn copy(pin: &Pin, dir: Direction, mapped: usize, host: usize, len: usize) -> Result<()> {
    let state = pin.read_state();
    let Some((m, t)) = state.mapping else {
        gdr_err!("mh is not mapped");
        return Err(Errno::EINVAL);
    };
    // SAFETY: `m` cannot be unmapped while we hold the read lock; the host range is the caller's.
    unsafe { copy_within(m, t, dir, mapped, host, len) }
}

/// The copy itself, once the caller has made sure mapping `m` stays mapped for the call: the range
/// check, the engines for the mapping type, and the one fence per call.
///
/// # Safety
/// `m` is a live mapping of type `t` that is not unmapped before this returns; `host` is valid for
/// `len` bytes in the copy's direction and does not overlap the mapping.
#[inline(always)]
pub(crate) unsafe fn copy_within(
    m: CpuMapping,
    t: MappingType,
    dir: Direction,
    mapped: usize,
    host: usize,
    len: usize,
) -> Result<()> {
    if len == 0 {
        return Ok(());
    }
    if !m.contains(mapped, len) {
        return Err(outside(m, mapped, len));
    }
    // SAFETY: the device range lies inside the live mapping (checked above); the rest is the
    // caller's promise.
    unsafe { copy_checked(t, dir, mapped, host, len) };
    Ok(())
}

/// [`copy_within`] after its checks: engines and fence. Panic-free (the C copy path relies on it).
///
/// # Safety
/// As [`copy_within`], and `[mapped, mapped + len)` lies inside `m`.
#[inline(always)]
pub(crate) unsafe fn copy_checked(t: MappingType, dir: Direction, mapped: usize, host: usize, len: usize) {
    let kind = kind_of(t);
    // SAFETY: the device range lies inside a live mapping (the caller's promise, checked by it);
    // the host range is the caller's promise.
    unsafe {
        match dir {
            Direction::ToMapping => copy::copy_to_mapping(kind, mapped as *mut u8, host as *const u8, len),
            Direction::FromMapping => copy::copy_from_mapping(kind, host as *mut u8, mapped as *const u8, len),
        }
    }
    if conditions::holds(Why::MixedTypes) {
        copy::full_fence();
    } else if t == MappingType::WriteCombined {
        copy::store_fence();
    }
}

#[cold]
fn outside(m: CpuMapping, mapped: usize, len: usize) -> Errno {
    gdr_err!("copy of {len} bytes at {mapped:#x} goes outside the mapping [{:#x}, +{:#x})", m.addr, m.len);
    Errno::EINVAL
}

impl Instance {
    /// Opens an instance on the first usable backend (`gdr_open`).
    pub fn open() -> Result<Instance> {
        Self::open_at(backend::gdrdrv::DEVICE_PATH)
    }

    /// As [`Instance::open`] with another gdrdrv device node (tests).
    pub fn open_at(device_path: &str) -> Result<Instance> {
        let backend = backend::select(device_path)?;
        gdr_dbg!("copy engines: {}", copy::detect());
        Ok(Instance { backend, page: HostPage::get(), pins: Mutex::new(Vec::new()) })
    }

    pub fn page(&self) -> HostPage {
        self.page
    }

    /// The gdrdrv file descriptor, or -1 with the dma-buf backend.
    pub fn raw_fd(&self) -> i32 {
        match &self.backend {
            Backend::Gdrdrv(d) => d.raw_fd(),
            Backend::DmaBuf(_) => -1,
        }
    }

    pub fn uses_dma_buf(&self) -> bool {
        matches!(self.backend, Backend::DmaBuf(_))
    }

    /// The driver version recorded at open (0 with the dma-buf backend).
    pub fn recorded_driver_version(&self) -> u32 {
        match &self.backend {
            Backend::Gdrdrv(d) => d.version(),
            Backend::DmaBuf(_) => 0,
        }
    }

    fn pins(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Pin>>> {
        self.pins.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pins GPU memory (`gdr_pin_buffer[_v2]`).
    pub fn pin(&self, req: &PinRequest) -> Result<Arc<Pin>> {
        if req.addr.checked_add(req.size).is_none() {
            gdr_err!("pin range {:#x}+{:#x} overflows", req.addr, req.size);
            return Err(Errno::EINVAL);
        }
        let backend = match &self.backend {
            Backend::Gdrdrv(d) => PinBackend::Gdrdrv { handle: d.pin(req)? },
            Backend::DmaBuf(b) => {
                let (pin, facts) = b.pin(req, self.page)?;
                PinBackend::DmaBuf { pin, facts }
            }
        };
        let pin = Arc::new(Pin { backend, state: RwLock::new(PinState::default()) });
        self.pins().push(pin.clone());
        Ok(pin)
    }

    /// Whether `pin` belongs to this instance and is still pinned.
    pub fn owns(&self, pin: &Arc<Pin>) -> bool {
        self.pins().iter().any(|p| Arc::ptr_eq(p, pin))
    }

    fn take(&self, pin: &Arc<Pin>) -> Result<()> {
        let mut pins = self.pins();
        let i = pins.iter().position(|p| Arc::ptr_eq(p, pin)).ok_or(Errno::EINVAL)?;
        pins.remove(i);
        Ok(())
    }

    /// Unpins (`gdr_unpin_buffer`); a live mapping goes to `dispose`. The pin is forgotten even if
    /// the driver reports an error.
    pub(crate) fn unpin(&self, pin: &Arc<Pin>, dispose: impl Dispose) -> Result<()> {
        self.take(pin)?;
        let mut state = pin.write_state();
        state.unpinned = true;
        // The kernel (gdrdrv) zaps a live mapping on unpin and leaves the range (later accesses
        // fault, as upstream's do); dma-buf mappings we remove ourselves. The disposer parks a
        // mapping a copy may still be using either way, so that copy never faults. Either way it
        // no longer counts as a live mapping of its type.
        if let Some((m, t)) = state.mapping.take() {
            count_mapping(t, -1);
            let leave = if matches!(pin.backend, PinBackend::DmaBuf { .. }) { Leave::Remove } else { Leave::MayStay };
            let _ = dispose(m, leave);
        }
        match (&self.backend, &pin.backend) {
            (Backend::Gdrdrv(d), PinBackend::Gdrdrv { handle }) => d.unpin(*handle),
            // Dropping the last Arc of the pin closes the dma-buf fd.
            _ => Ok(()),
        }
    }

    /// Maps a pinned buffer into the CPU (`gdr_map[_v2]`). `reuse` may hold a range at which this
    /// pin's memory may be placed (the C API's parked range of this pin); if it has the new mapping's length the mapping is
    /// placed on it and it is taken; otherwise, or if mapping fails, it is left there, still
    /// anonymous, for the caller to put back.
    pub(crate) fn map(
        &self,
        pin: &Arc<Pin>,
        size: usize,
        flags: i32,
        reuse: &mut Option<CpuMapping>,
    ) -> Result<CpuMapping> {
        let mut state = pin.write_state();
        if state.unpinned {
            return Err(Errno::EINVAL);
        }
        if state.mapping.is_some() {
            gdr_err!("mh is mapped already");
            return Err(Errno::EAGAIN);
        }
        let requested = match flags {
            abi::GDR_MAP_FLAG_DEFAULT => MappingType::None,
            abi::GDR_MAP_FLAG_REQ_WC_MAPPING => MappingType::WriteCombined,
            abi::GDR_MAP_FLAG_REQ_CACHE_MAPPING => MappingType::Caching,
            abi::GDR_MAP_FLAG_REQ_DEVICE_MAPPING => MappingType::Device,
            _ => {
                gdr_err!("invalid map flags {flags}");
                return Err(Errno::EINVAL);
            }
        };
        let len = self.page.round_up(size).ok_or(Errno::EINVAL)?;
        let at = reuse.filter(|r| r.len == len).map(|r| r.addr);
        let (m, t) = match (&self.backend, &pin.backend) {
            (Backend::Gdrdrv(d), PinBackend::Gdrdrv { handle }) => {
                let m = d.map(*handle, len, requested, self.page, at)?;
                let t = match d.info(*handle) {
                    Ok(f) if f.mapping_type == MappingType::None => Err(Errno::EAGAIN),
                    Ok(f) if requested != MappingType::None && f.mapping_type != requested => {
                        gdr_err!("got mapping type {:?} instead of {:?}", f.mapping_type, requested);
                        Err(Errno::EINVAL)
                    }
                    Ok(f) => Ok(f.mapping_type),
                    Err(e) => Err(e),
                };
                match t {
                    Ok(t) => (m, t),
                    Err(e) => {
                        cpu_mapping::undo_map(m, at);
                        return Err(e);
                    }
                }
            }
            (Backend::DmaBuf(b), PinBackend::DmaBuf { pin: dp, facts }) => {
                // A real exporter's dma-buf covers exactly the pinned range, so the kernel refuses
                // a longer mmap; say so ourselves rather than rely on every exporter checking.
                if len as u64 > facts.mapped_size {
                    gdr_err!("map of {len:#x} bytes exceeds the pinned range of {:#x} bytes", facts.mapped_size);
                    return Err(Errno::EINVAL);
                }
                (b.map(dp, len, requested, at)?, dp.mapping_type)
            }
            _ => return Err(Errno::EINVAL),
        };
        if at.is_some() {
            *reuse = None;
        }
        state.mapping = Some((m, t));
        count_mapping(t, 1);
        Ok(m)
    }

    /// Unmaps (`gdr_unmap`); `dispose` takes the range away. We require the address and rounded
    /// length of the live mapping (upstream unmaps whatever range it is given).
    pub(crate) fn unmap(&self, pin: &Arc<Pin>, va: usize, size: usize, dispose: impl Dispose) -> Result<()> {
        let mut state = pin.write_state();
        let Some((m, t)) = state.mapping else {
            gdr_err!("mh is not mapped yet");
            return Err(Errno::EINVAL);
        };
        if va != m.addr || self.page.round_up(size) != Some(m.len) {
            gdr_err!("unmap of [{va:#x}, +{size:#x}) does not match the mapping [{:#x}, +{:#x})", m.addr, m.len);
            return Err(Errno::EINVAL);
        }
        dispose(m, Leave::Remove)?;
        state.mapping = None;
        count_mapping(t, -1);
        Ok(())
    }

    /// `gdr_get_info_v2`.
    pub fn info(&self, pin: &Pin) -> Result<PinFacts> {
        match (&self.backend, &pin.backend) {
            (Backend::Gdrdrv(d), PinBackend::Gdrdrv { handle }) => d.info(*handle),
            (Backend::DmaBuf(_), PinBackend::DmaBuf { facts, .. }) => {
                let mapping_type = pin.read_state().mapping.map_or(MappingType::None, |(_, t)| t);
                Ok(PinFacts { mapping_type, ..*facts })
            }
            _ => Err(Errno::EINVAL),
        }
    }

    /// The legacy `gdr_get_info` (40-byte struct); gdrdrv only (EBADF otherwise, as upstream).
    pub fn info_v1(&self, pin: &Pin, out: &mut GdrInfoV1) -> Result<()> {
        match (&self.backend, &pin.backend) {
            (Backend::Gdrdrv(d), PinBackend::Gdrdrv { handle }) => d.info_v1(*handle, out),
            _ => Err(Errno::EBADF),
        }
    }

    /// `gdr_get_callback_flag`: whether the GPU memory was freed while pinned.
    pub fn callback_flag(&self, pin: &Pin) -> Result<bool> {
        match (&self.backend, &pin.backend) {
            (Backend::Gdrdrv(d), PinBackend::Gdrdrv { handle }) => d.callback_flag(*handle),
            _ => Ok(false),
        }
    }

    /// `gdr_get_attribute`.
    pub fn attribute(&self, attr: i32) -> Result<i32> {
        let driver_attr = match attr {
            abi::GDR_ATTR_USING_DMA_BUF_MMAP => return Ok(i32::from(self.uses_dma_buf())),
            abi::GDR_ATTR_USE_PERSISTENT_MAPPING => backend::gdrdrv_abi::ATTR_USE_PERSISTENT_MAPPING,
            abi::GDR_ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE => backend::gdrdrv_abi::ATTR_SUPPORT_PIN_FLAG_FORCE_PCIE,
            _ => {
                gdr_dbg!("undefined attribute {attr}");
                return Err(Errno::EINVAL);
            }
        };
        match &self.backend {
            Backend::Gdrdrv(d) => Ok(d.attribute(driver_attr)? as i32),
            Backend::DmaBuf(_) => Ok(1),
        }
    }

    /// `gdr_driver_get_version` as (major, minor). Upstream asserts in the dma-buf backend; we
    /// return EBADF like its other fd-less call.
    pub fn driver_version(&self) -> Result<(i32, i32)> {
        match &self.backend {
            Backend::Gdrdrv(d) => {
                let v = d.driver_version()?;
                Ok(((v >> 16) as i32, (v & 0xffff) as i32))
            }
            Backend::DmaBuf(_) => Err(Errno::EBADF),
        }
    }

    /// Unpins everything, most recent first, each mapping going to `dispose`; stops at the first
    /// failure.
    pub(crate) fn unpin_all(&self, dispose: impl Fn(CpuMapping, Leave) -> Result<()>) -> Result<()> {
        loop {
            let Some(pin) = self.pins().last().cloned() else { return Ok(()) };
            self.unpin(&pin, &dispose)?;
        }
    }

    /// Pins still registered, oldest first.
    pub fn live_pins(&self) -> Vec<Arc<Pin>> {
        self.pins().clone()
    }
}

/// `gdr_runtime_get_version`.
pub fn runtime_version() -> (i32, i32) {
    (abi::GDR_API_MAJOR_VERSION, abi::GDR_API_MINOR_VERSION)
}
