//! Driver state: configuration, devices, contexts, the memory range table, streams and events.
//!
//! Everything here is safe Rust except calls into [`crate::sys`] that change the address space,
//! each with its own justification.

use crate::gpusim::{self, Gpusim};
use crate::stream::{Event, Op, Stream};
use crate::sys::{self, Fd};
use crate::types::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
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
const DEFAULT_HOST_MEM: u64 = 16 << 30;

pub fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v == "1")
}

fn env_num<T: std::str::FromStr>(name: &str) -> Option<T> {
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

/// Process-wide handle counter (never reset, so a handle from before a re-initialisation, e.g.
/// in a fork child, can never alias a new object).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(1);
pub const TAG_CTX: u64 = 0x0c7a;
pub const TAG_STREAM: u64 = 0x057e;
pub const TAG_EVENT: u64 = 0x0e7e;
pub const TAG_PHYS: u64 = 0x0a11;

/// Context ids start at 1, as the driver's do, and count up for the life of the process.
static NEXT_CTX_ID: AtomicU64 = AtomicU64::new(1);

fn new_handle(tag: u64) -> u64 {
    (tag << 44) | (NEXT_HANDLE.fetch_add(1, Ordering::Relaxed) << 4)
}

thread_local! {
    /// This thread's context stack (top = current), as context handles.
    static CTX_STACK: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

pub fn with_stack<T>(f: impl FnOnce(&mut Vec<u64>) -> T) -> T {
    CTX_STACK.with(|s| f(&mut s.borrow_mut()))
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
    fn from_env() -> Option<Platform> {
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

    fn coherent(self) -> bool {
        self != Platform::Pcie
    }

    fn cc_major(self) -> i32 {
        if self == Platform::CoherentCc10 { 10 } else { 9 }
    }
}

pub enum Backend {
    Host,
    Gpusim(Gpusim),
}

pub struct Context {
    pub handle: u64,
    /// cuCtxGetId's answer: unique among all contexts of the process, never reused.
    pub id: u64,
    pub device: i32,
    pub flags: u32,
    pub primary: bool,
    default_stream: Mutex<Option<Arc<Stream>>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Device,
    Host,
    Registered,
    Vmm,
}

pub enum Backing {
    None,
    Anon {
        addr: u64,
        len: u64,
    },
    /// A cuMemAlloc allocation: a slot of the region at `region` (Tables::regions).
    Sub {
        region: u64,
    },
    Vmm {
        phys: u64,
        offset: u64,
        len: u64,
    },
}

/// One piece of a host-backend region under `CUDASIM_DMABUF=1`: `[off, off+len)` of the region
/// is the memfd `fd` from its offset 0, so that a dup of `fd` is a "dma-buf" starting at `off`.
pub struct Seg {
    pub off: u64,
    pub len: u64,
    pub fd: Arc<Fd>,
    /// Handed out by cuMemGetHandleForAddressRange and, when last looked, still held outside
    /// cudasim: not split or moved (its fd must keep sharing memory with the device range).
    pub exported: bool,
}

pub enum RegionMem {
    /// Host backend: anonymous memory.
    Anon,
    /// Host backend with dma-buf export: memfds, re-cut at export bounds (see host_export_seg).
    Memfd(Vec<Seg>),
    /// One gpusim allocation, mapped at its GPU VA.
    Gpusim,
}

/// A stretch of device memory that cuMemAlloc sub-allocates from, as CUDA does: a 2 MiB region
/// shared by small allocations (`shared`), or a large allocation's own region.
/// The 64 KiB pages of a freed slot `[off, off + size)` of a region that none of the live
/// `slots` (offset -> length) touches: `(offset, length)` in the region, or `None`.
pub fn released_pages(slots: &BTreeMap<u64, u64>, off: u64, size: u64) -> Option<(u64, u64)> {
    let used = |page: u64| slots.range(..page + GPU_PAGE).next_back().is_some_and(|(&o, &l)| o + l > page);
    let mut first = off & !(GPU_PAGE - 1);
    let mut end = (off + size).div_ceil(GPU_PAGE) * GPU_PAGE;
    if used(first) {
        first += GPU_PAGE;
    }
    if end > first && used(end - GPU_PAGE) {
        end -= GPU_PAGE;
    }
    (end > first).then(|| (first, end - first))
}

pub struct Region {
    pub base: u64,
    pub len: u64,
    pub shared: bool,
    /// Allocated slots: offset -> length (the requested size rounded up to 256 bytes).
    pub slots: BTreeMap<u64, u64>,
    pub mem: RegionMem,
}

impl Region {
    pub fn end(&self) -> u64 {
        self.base + self.len
    }

    /// First fit: the lowest offset with `need` free bytes.
    fn fit(&self, need: u64) -> Option<u64> {
        let mut cur = 0;
        for (&off, &len) in &self.slots {
            if off - cur >= need {
                return Some(cur);
            }
            cur = off + len;
        }
        (self.len - cur >= need).then_some(cur)
    }
}

/// One entry of the range table: device allocation, host allocation, registered host range or
/// VMM mapping.
pub struct Range {
    pub base: u64,
    pub size: u64,
    pub kind: Kind,
    pub ctx: u64,
    pub device: i32,
    pub buffer_id: u64,
    pub sync_memops: bool,
    pub flags: u32,
    /// CU_MEM_ACCESS_FLAGS_* (VMM mappings start with none; everything else is read-write).
    pub access: u32,
    pub backing: Backing,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.base + self.size
    }
    pub fn is_device(&self) -> bool {
        matches!(self.kind, Kind::Device | Kind::Vmm)
    }
}

/// A VMM physical allocation (`CUmemGenericAllocationHandle`).
pub struct Phys {
    pub size: u64,
    pub prop: CUmemAllocationProp,
    /// Host mode: the memfd that holds the memory.
    pub fd: Option<Arc<Fd>>,
    pub maps: u32,
    pub released: bool,
}

// SAFETY: the only raw pointer in CUmemAllocationProp is an opaque Windows metadata pointer
// that cudasim stores but never dereferences.
unsafe impl Send for Phys {}

pub enum ResBacking {
    Host { addr: u64, len: u64 },
    Gpusim { va: u64 },
}

pub struct Reserve {
    pub base: u64,
    pub size: u64,
    pub backing: ResBacking,
}

#[derive(Default)]
pub struct PrimarySlot {
    pub handle: Option<u64>,
    pub refs: u32,
    pub flags: u32,
}

#[derive(Default)]
pub struct Tables {
    pub ctxs: HashMap<u64, Arc<Context>>,
    pub primary: Vec<PrimarySlot>,
    pub ranges: BTreeMap<u64, Range>,
    pub streams: HashMap<u64, Arc<Stream>>,
    pub events: HashMap<u64, Arc<Event>>,
    pub phys: HashMap<u64, Phys>,
    pub reserves: BTreeMap<u64, Reserve>,
    /// cuMemAlloc regions by base address.
    pub regions: BTreeMap<u64, Region>,
    pub host_used: u64,
    pub next_buffer_id: u64,
}

impl Tables {
    /// The range containing `addr`, if any.
    pub fn find(&self, addr: u64) -> Option<&Range> {
        self.ranges.range(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    /// The cuMemAlloc region containing `addr`, if any.
    pub fn region(&self, addr: u64) -> Option<&Region> {
        self.regions.range(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    pub fn find_mut(&mut self, addr: u64) -> Option<&mut Range> {
        self.ranges.range_mut(..=addr).next_back().map(|(_, r)| r).filter(|r| addr < r.end())
    }

    /// Checks that `[addr, addr+len)` lies within one tracked range with the needed access.
    pub fn check(&self, addr: u64, len: u64, write: bool) -> R<&Range> {
        let r = self.find(addr).ok_or_else(|| {
            crate::log!("address {addr:#x} is not in any allocation or registered range");
            err::INVALID_VALUE
        })?;
        let end = addr.checked_add(len).ok_or(err::INVALID_VALUE)?;
        if end > r.end() {
            crate::log!("range {addr:#x}+{len:#x} runs past the end of allocation {:#x}+{:#x}", r.base, r.size);
            return Err(err::INVALID_VALUE);
        }
        let need = if write { CU_MEM_ACCESS_FLAGS_PROT_READWRITE } else { CU_MEM_ACCESS_FLAGS_PROT_READ };
        if r.access & need != need {
            crate::log!("range {addr:#x}+{len:#x} is not accessible (cuMemSetAccess)");
            return Err(err::INVALID_VALUE);
        }
        Ok(r)
    }

    fn overlaps_any(&self, lo: u64, hi: u64) -> bool {
        self.ranges.range(..hi).next_back().is_some_and(|(_, r)| r.end() > lo)
    }

    fn buffer_id(&mut self) -> u64 {
        self.next_buffer_id += 1;
        self.next_buffer_id
    }
}

pub struct Driver {
    pub pid: u32,
    pub cfg: Config,
    pub backend: Backend,
    pub t: Mutex<Tables>,
    all_streams: Mutex<Vec<Weak<Stream>>>,
    /// Serialises cuMemAlloc/cuMemFree region bookkeeping (taken before `t`, never inside it).
    alloc_lock: Mutex<()>,
}

static DRIVER: Mutex<Option<Arc<Driver>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoning is ignored: table updates are single-step inserts/removes.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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

    pub fn gpusim_info(&self) -> Option<gpusim::Info> {
        match &self.backend {
            Backend::Gpusim(g) => g.info().ok(),
            Backend::Host => None,
        }
    }

    /// (total, free) device memory in bytes.
    pub fn mem_info(&self) -> (u64, u64) {
        if let Some(i) = self.gpusim_info() {
            return (i.bar_size, i.free_bytes);
        }
        let used = self.tables().host_used;
        (self.cfg.host_mem, self.cfg.host_mem.saturating_sub(used))
    }

    /// (domain, bus, device) of a device's PCI address.
    pub fn pci(&self, dev: CUdevice) -> (i32, i32, i32) {
        match self.gpusim_info() {
            Some(i) => (i.pci_domain as i32, i.pci_bus as i32 + dev, i.pci_device as i32),
            None => (0, 0x65 + dev, 0),
        }
    }

    pub fn device_attribute(&self, a: i32, dev: CUdevice) -> R<i32> {
        use crate::types::attr::*;
        self.check_device(dev)?;
        if a <= 0 || a >= MAX {
            return Err(err::INVALID_VALUE);
        }
        let (domain, bus, pcidev) = self.pci(dev);
        Ok(match a {
            MAX_THREADS_PER_BLOCK | MAX_BLOCK_DIM_X | MAX_BLOCK_DIM_Y => 1024,
            MAX_BLOCK_DIM_Z => 64,
            MAX_GRID_DIM_X => i32::MAX,
            MAX_GRID_DIM_Y | MAX_GRID_DIM_Z => 65535,
            MAX_SHARED_MEMORY_PER_BLOCK => 48 * 1024,
            TOTAL_CONSTANT_MEMORY => 64 * 1024,
            WARP_SIZE => 32,
            MAX_PITCH => i32::MAX,
            MAX_REGISTERS_PER_BLOCK | MAX_REGISTERS_PER_MULTIPROCESSOR => 65536,
            CLOCK_RATE => 1_755_000,
            TEXTURE_ALIGNMENT => 512,
            GPU_OVERLAP | CAN_MAP_HOST_MEMORY | CONCURRENT_KERNELS | ECC_ENABLED | UNIFIED_ADDRESSING => 1,
            MULTIPROCESSOR_COUNT => 132,
            INTEGRATED => 0,
            COMPUTE_MODE => 0,
            PCI_BUS_ID => bus,
            PCI_DEVICE_ID => pcidev,
            PCI_DOMAIN_ID => domain,
            MEMORY_CLOCK_RATE => 2_619_000,
            GLOBAL_MEMORY_BUS_WIDTH => 5120,
            L2_CACHE_SIZE => 50 << 20,
            MAX_THREADS_PER_MULTIPROCESSOR => 2048,
            ASYNC_ENGINE_COUNT => 3,
            COMPUTE_CAPABILITY_MAJOR => self.cfg.platform.cc_major(),
            COMPUTE_CAPABILITY_MINOR => 0,
            STREAM_PRIORITIES_SUPPORTED => 1,
            MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 228 * 1024,
            MANAGED_MEMORY | CONCURRENT_MANAGED_ACCESS => 0,
            // Coherent platforms reach pageable host memory through the CPU's page tables.
            PAGEABLE_MEMORY_ACCESS => self.cfg.platform.coherent() as i32,
            CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM => 1,
            // CUDA 13 reports the v1 capabilities as 0 (the v1 entry points need a module
            // parameter); the v2 ones below are what consumers must use.
            CAN_USE_STREAM_MEM_OPS_V1 | CAN_USE_64_BIT_STREAM_MEM_OPS_V1 | CAN_USE_STREAM_WAIT_VALUE_NOR_V1 => 0,
            CAN_USE_64_BIT_STREAM_MEM_OPS | CAN_USE_STREAM_WAIT_VALUE_NOR => 1,
            CAN_FLUSH_REMOTE_WRITES => 1,
            HOST_REGISTER_SUPPORTED | READ_ONLY_HOST_REGISTER_SUPPORTED => 1,
            PAGEABLE_MEMORY_ACCESS_USES_HOST_PAGE_TABLES => self.cfg.platform.coherent() as i32,
            VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED | HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED => 1,
            GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED | GPU_DIRECT_RDMA_SUPPORTED => 1,
            GPU_DIRECT_RDMA_FLUSH_WRITES_OPTIONS => 1, // CU_FLUSH_GPU_DIRECT_RDMA_WRITES_OPTION_HOST
            GPU_DIRECT_RDMA_WRITES_ORDERING => 0,
            MEMORY_POOLS_SUPPORTED => 0,
            DMA_BUF_SUPPORTED => self.dmabuf() as i32,
            _ => 0,
        })
    }

    // ----- contexts -------------------------------------------------------------------------

    fn new_context(&self, t: &mut Tables, device: i32, flags: u32, primary: bool) -> Arc<Context> {
        let c = Arc::new(Context {
            handle: new_handle(TAG_CTX),
            id: NEXT_CTX_ID.fetch_add(1, Ordering::Relaxed),
            device,
            flags,
            primary,
            default_stream: Mutex::new(None),
        });
        t.ctxs.insert(c.handle, Arc::clone(&c));
        c
    }

    pub fn context(&self, h: u64) -> R<Arc<Context>> {
        self.tables().ctxs.get(&h).cloned().ok_or(err::INVALID_CONTEXT)
    }

    /// The calling thread's current context.
    pub fn current(&self) -> R<Arc<Context>> {
        let h = with_stack(|s| s.last().copied()).ok_or(err::INVALID_CONTEXT)?;
        self.context(h)
    }

    pub fn primary_retain(&self, dev: CUdevice) -> R<u64> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &t.primary[dev as usize];
        let (h, flags) = (slot.handle, slot.flags);
        let h = match h {
            Some(h) => h,
            None => {
                let c = self.new_context(&mut t, dev, flags, true);
                t.primary[dev as usize].handle = Some(c.handle);
                c.handle
            }
        };
        t.primary[dev as usize].refs += 1;
        Ok(h)
    }

    pub fn primary_release(&self, dev: CUdevice) -> R<()> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &mut t.primary[dev as usize];
        if slot.refs == 0 {
            return Err(err::INVALID_CONTEXT);
        }
        slot.refs -= 1;
        if slot.refs > 0 {
            return Ok(());
        }
        let h = slot.handle.take();
        drop(t);
        if let Some(h) = h {
            self.destroy_context(h);
        }
        Ok(())
    }

    pub fn primary_reset(&self, dev: CUdevice) -> R<()> {
        self.check_device(dev)?;
        let mut t = self.tables();
        let slot = &mut t.primary[dev as usize];
        let h = slot.handle.take();
        slot.refs = 0;
        drop(t);
        if let Some(h) = h {
            self.destroy_context(h);
        }
        Ok(())
    }

    pub fn primary_state(&self, dev: CUdevice) -> R<(u32, bool)> {
        self.check_device(dev)?;
        let t = self.tables();
        let s = &t.primary[dev as usize];
        Ok((s.flags, s.handle.is_some()))
    }

    pub fn primary_set_flags(&self, dev: CUdevice, flags: u32) -> R<()> {
        self.check_device(dev)?;
        if flags & !0x1f != 0 {
            return Err(err::INVALID_VALUE);
        }
        self.tables().primary[dev as usize].flags = flags;
        Ok(())
    }

    pub fn ctx_create(&self, flags: u32, dev: CUdevice) -> R<u64> {
        self.check_device(dev)?;
        if flags & !0x1f != 0 {
            return Err(err::INVALID_VALUE);
        }
        let h = self.new_context(&mut self.tables(), dev, flags, false).handle;
        with_stack(|s| s.push(h));
        Ok(h)
    }

    pub fn ctx_destroy(&self, h: u64) -> R<()> {
        let c = self.context(h)?;
        if c.primary {
            return Err(err::INVALID_CONTEXT);
        }
        with_stack(|s| s.retain(|&x| x != h));
        self.destroy_context(h);
        Ok(())
    }

    /// Tears a context down: its streams are stopped (pending work dropped), its events,
    /// allocations and registrations released.
    fn destroy_context(&self, h: u64) {
        let mut t = self.tables();
        let Some(c) = t.ctxs.remove(&h) else { return };
        let mut streams: Vec<Arc<Stream>> = Vec::new();
        t.streams.retain(|_, s| {
            if s.ctx == h {
                streams.push(Arc::clone(s));
                false
            } else {
                true
            }
        });
        streams.extend(lock(&c.default_stream).take());
        t.events.retain(|_, e| e.ctx != h);
        let doomed: Vec<u64> = t.ranges.values().filter(|r| r.ctx == h).map(|r| r.base).collect();
        let ranges: Vec<Range> = doomed.iter().filter_map(|b| t.ranges.remove(b)).collect();
        drop(t);
        for s in &streams {
            s.abort_and_join();
        }
        for r in ranges {
            self.release_range(r);
        }
    }

    pub fn ctx_synchronize(&self, c: &Context) -> CUresult {
        // Streams being destroyed still finish their work: they are in all_streams only.
        let streams: Vec<Arc<Stream>> =
            lock(&self.all_streams).iter().filter_map(Weak::upgrade).filter(|s| s.ctx == c.handle).collect();
        let mut res = err::SUCCESS;
        for s in streams {
            let e = s.synchronize();
            if res == err::SUCCESS {
                res = e;
            }
        }
        res
    }

    // ----- streams and events ---------------------------------------------------------------

    fn track(&self, s: &Arc<Stream>) {
        let mut all = lock(&self.all_streams);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(s));
    }

    pub fn stream_create(&self, flags: u32, priority: i32) -> R<u64> {
        if flags & !CU_STREAM_NON_BLOCKING != 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let s = Stream::spawn(new_handle(TAG_STREAM), c.handle, flags, priority.clamp(-5, 0), self.cfg.wait_timeout)
            .map_err(|e| {
                crate::log!("cannot start a stream worker thread: {e}");
                err::OUT_OF_MEMORY
            })?;
        self.track(&s);
        let h = s.handle;
        self.tables().streams.insert(h, s);
        Ok(h)
    }

    /// Resolves a `CUstream` value: NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD all mean the
    /// current context's default stream (one worker; see docs/cudasim.md).
    pub fn stream(&self, h: usize) -> R<Arc<Stream>> {
        if h == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD {
            let c = self.current()?;
            let mut d = lock(&c.default_stream);
            if let Some(s) = d.as_ref() {
                return Ok(Arc::clone(s));
            }
            let s = Stream::spawn(new_handle(TAG_STREAM), c.handle, 0, 0, self.cfg.wait_timeout)
                .map_err(|_| err::OUT_OF_MEMORY)?;
            self.track(&s);
            *d = Some(Arc::clone(&s));
            return Ok(s);
        }
        self.tables().streams.get(&(h as u64)).cloned().ok_or(err::INVALID_HANDLE)
    }

    pub fn stream_destroy(&self, h: usize) -> R<()> {
        let s = self.tables().streams.remove(&(h as u64)).ok_or(err::INVALID_HANDLE)?;
        s.close();
        Ok(())
    }

    /// Validates an operation against the range table and queues it, atomically with respect
    /// to memory release (which removes the range under the same lock, then drains streams).
    pub fn submit(&self, s: &Stream, build: impl FnOnce(&Tables) -> R<Op>) -> R<u64> {
        let t = self.tables();
        let op = build(&t)?;
        Ok(s.enqueue(op))
    }

    pub fn event_create(&self, flags: u32) -> R<u64> {
        if flags & !(CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS) != 0 {
            return Err(err::INVALID_VALUE);
        }
        if flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let e = Arc::new(Event::new(new_handle(TAG_EVENT), c.handle, flags));
        let h = e.handle;
        self.tables().events.insert(h, e);
        Ok(h)
    }

    pub fn event(&self, h: usize) -> R<Arc<Event>> {
        self.tables().events.get(&(h as u64)).cloned().ok_or(err::INVALID_HANDLE)
    }

    pub fn event_destroy(&self, h: usize) -> R<()> {
        self.tables().events.remove(&(h as u64)).map(|_| ()).ok_or(err::INVALID_HANDLE)
    }

    /// Waits until no stream has pending work touching `[lo, hi)`.
    fn drain(&self, lo: u64, hi: u64) {
        let streams: Vec<Arc<Stream>> = lock(&self.all_streams).iter().filter_map(Weak::upgrade).collect();
        for s in streams {
            s.wait_untouched(lo, hi);
        }
    }

    // ----- memory ---------------------------------------------------------------------------

    #[allow(clippy::too_many_arguments)]
    fn insert_range(
        &self,
        t: &mut Tables,
        base: u64,
        size: u64,
        kind: Kind,
        ctx: u64,
        device: i32,
        flags: u32,
        backing: Backing,
    ) {
        let buffer_id = t.buffer_id();
        let access = if kind == Kind::Vmm { CU_MEM_ACCESS_FLAGS_PROT_NONE } else { CU_MEM_ACCESS_FLAGS_PROT_READWRITE };
        t.ranges.insert(
            base,
            Range { base, size, kind, ctx, device, buffer_id, sync_memops: false, flags, access, backing },
        );
    }

    /// cuMemAlloc, laid out as CUDA does: allocations below 2 MiB are carved (first fit, 256-byte
    /// granularity) from shared 2 MiB regions, so consecutive small allocations are adjacent and
    /// share 64 KiB GPU pages; larger ones get a 2 MiB-aligned region of their own.
    pub fn mem_alloc(&self, size: u64) -> R<u64> {
        if size == 0 {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let large = size >= REGION_SIZE;
        let slot = round_up(size, if large { GPU_PAGE } else { SUBALLOC_ALIGN }).ok_or(err::OUT_OF_MEMORY)?;
        let _a = lock(&self.alloc_lock);
        if !large {
            let mut t = self.tables();
            let hit = t.regions.values().filter(|r| r.shared).find_map(|r| r.fit(slot).map(|off| (r.base, off)));
            if let Some((rb, off)) = hit {
                t.regions.get_mut(&rb).expect("found above").slots.insert(off, slot);
                let base = rb + off;
                self.insert_range(&mut t, base, size, Kind::Device, c.handle, c.device, 0, Backing::Sub { region: rb });
                return Ok(base);
            }
        }
        let mut region = self.region_create(if large { slot } else { REGION_SIZE }, !large)?;
        region.slots.insert(0, slot);
        let base = region.base;
        let mut t = self.tables();
        t.regions.insert(base, region);
        self.insert_range(&mut t, base, size, Kind::Device, c.handle, c.device, 0, Backing::Sub { region: base });
        Ok(base)
    }

    /// A new, empty region of `len` bytes (a 64 KiB multiple) at a 2 MiB-aligned address.
    fn region_create(&self, len: u64, shared: bool) -> R<Region> {
        let (base, mem) = match &self.backend {
            Backend::Gpusim(g) => {
                let va = match g.alloc_mapped(len, gpusim::ALLOC_ALIGN_2M) {
                    Err(e) if e.raw_os_error() == Some(sys::EINVAL) => {
                        crate::log!("gpusim.ko without GPUSIM_ALLOC_ALIGN_2M: regions only 64 KiB aligned");
                        g.alloc_mapped(len, 0)
                    }
                    r => r,
                }
                .map_err(|e| {
                    crate::log!("gpusim allocation of {len:#x} bytes failed: {e}");
                    if e.raw_os_error() == Some(sys::ENOMEM) { err::OUT_OF_MEMORY } else { err::UNKNOWN }
                })?;
                (va, RegionMem::Gpusim)
            }
            Backend::Host => {
                self.host_reserve(len)?;
                let m = if self.cfg.dmabuf {
                    host_map_memfd(len).map(|(addr, fd)| {
                        (addr, RegionMem::Memfd(vec![Seg { off: 0, len, fd: Arc::new(fd), exported: false }]))
                    })
                } else {
                    host_map_anon(len).map(|addr| (addr, RegionMem::Anon))
                };
                match m {
                    Ok(m) => m,
                    Err(e) => {
                        self.host_unreserve(len);
                        return Err(e);
                    }
                }
            }
        };
        Ok(Region { base, len, shared, slots: BTreeMap::new(), mem })
    }

    /// cuMemFree of one slot: the region goes with its last allocation. Until then, the 64 KiB
    /// GPU pages that no live allocation uses any more are released: gpusim runs the free
    /// callbacks of the pins on them (docs/cudasim.md). A page the freed bytes share with a live
    /// neighbour stays, so freeing one buffer never invalidates a pin of a buffer that lives.
    fn sub_free(&self, rb: u64, base: u64, size: u64) {
        let _a = lock(&self.alloc_lock);
        let mut t = self.tables();
        let Some(reg) = t.regions.get_mut(&rb) else { return };
        reg.slots.remove(&(base - rb));
        if !reg.slots.is_empty() {
            let released = released_pages(&reg.slots, base - rb, size);
            drop(t);
            if let Some((off, len)) = released
                && let Backend::Gpusim(g) = &self.backend
                && let Err(e) = g.invalidate(rb + off, len)
            {
                crate::log!("gpusim invalidation of freed {base:#x}+{size:#x} failed: {e}");
            }
            return;
        }
        let reg = t.regions.remove(&rb).expect("present");
        drop(t);
        // SAFETY: the region is ours, out of the tables, and every allocation in it was freed
        // and drained.
        if let Err(e) = unsafe { sys::unmap(reg.base, reg.len) } {
            crate::log!("munmap({:#x}, {:#x}) failed: {e}", reg.base, reg.len);
        }
        match (&self.backend, reg.mem) {
            (Backend::Gpusim(g), _) => {
                if let Err(e) = g.free(reg.base) {
                    crate::log!("gpusim free of {:#x} failed: {e}", reg.base);
                }
            }
            (Backend::Host, _) => self.host_unreserve(reg.len),
        }
    }

    fn host_reserve(&self, len: u64) -> R<()> {
        let mut t = self.tables();
        if t.host_used.checked_add(len).is_none_or(|u| u > self.cfg.host_mem) {
            crate::log!(
                "out of simulated device memory ({len:#x} bytes asked, CUDASIM_MEM_SIZE={:#x})",
                self.cfg.host_mem
            );
            return Err(err::OUT_OF_MEMORY);
        }
        t.host_used += len;
        Ok(())
    }

    fn host_unreserve(&self, len: u64) {
        let mut t = self.tables();
        t.host_used = t.host_used.saturating_sub(len);
    }

    /// Frees a range by its exact base address if it is of one of the given kinds.
    pub fn free_range(&self, base: u64, kinds: &[Kind], not_found: CUresult) -> R<()> {
        let mut t = self.tables();
        match t.ranges.get(&base) {
            Some(r) if kinds.contains(&r.kind) => {}
            _ => return Err(not_found),
        }
        let r = t.ranges.remove(&base).expect("checked above");
        drop(t);
        self.release_range(r);
        Ok(())
    }

    /// Drains streams off a removed range and releases its memory.
    fn release_range(&self, r: Range) {
        self.drain(r.base, r.end());
        match r.backing {
            Backing::None => {}
            Backing::Anon { addr, len } => {
                // SAFETY: the range was removed from the table and no stream op touches it any
                // more; the mapping was created by us for this host allocation only.
                if let Err(e) = unsafe { sys::unmap(addr, len) } {
                    crate::log!("munmap({addr:#x}, {len:#x}) failed: {e}");
                }
            }
            Backing::Sub { region } => self.sub_free(region, r.base, r.size),
            Backing::Vmm { phys, offset: _, len } => self.vmm_unmap_one(r.base, len, phys),
        }
    }

    /// cuMemAllocHost / cuMemHostAlloc: page-aligned host memory, also a device pointer.
    pub fn host_alloc(&self, size: u64, flags: u32) -> R<u64> {
        if size == 0
            || flags & !(CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED) != 0
        {
            return Err(err::INVALID_VALUE);
        }
        let c = self.current()?;
        let len = round_up(size, sys::page_size()).ok_or(err::OUT_OF_MEMORY)?;
        let addr = sys::mmap_anon(len, sys::PROT_READ | sys::PROT_WRITE, 0).map_err(|e| {
            crate::log!("host allocation of {len:#x} bytes failed: {e}");
            err::OUT_OF_MEMORY
        })?;
        let mut t = self.tables();
        self.insert_range(
            &mut t,
            addr,
            size,
            Kind::Host,
            c.handle,
            c.device,
            flags | CU_MEMHOSTALLOC_DEVICEMAP,
            Backing::Anon { addr, len },
        );
        Ok(addr)
    }

    /// cuMemHostRegister: records the range; the memory itself is used in place.
    pub fn host_register(&self, p: u64, size: u64, flags: u32) -> R<()> {
        if p == 0 || size == 0 || flags & !0xf != 0 {
            return Err(err::INVALID_VALUE);
        }
        let end = p.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let c = self.current()?;
        if !sys::is_mapped(p, size) {
            crate::log!("cuMemHostRegister: {p:#x}+{size:#x} is not mapped memory");
            return Err(err::INVALID_VALUE);
        }
        let mut t = self.tables();
        if t.overlaps_any(p, end) {
            return Err(err::HOST_MEMORY_ALREADY_REGISTERED);
        }
        self.insert_range(
            &mut t,
            p,
            size,
            Kind::Registered,
            c.handle,
            c.device,
            flags | CU_MEMHOSTREGISTER_DEVICEMAP,
            Backing::None,
        );
        Ok(())
    }

    /// cuMemGetHandleForAddressRange (dma-buf fd).
    pub fn dmabuf_fd(&self, ptr: u64, size: u64, handle_type: u32, flags: u64) -> R<i32> {
        if !self.dmabuf() {
            crate::log!("dma-buf export needs gpusim, or CUDASIM_DMABUF=1 in host memory mode");
            return Err(err::NOT_SUPPORTED);
        }
        if handle_type != CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD
            || flags & !CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE != 0
        {
            return Err(err::INVALID_VALUE);
        }
        let ps = sys::page_size();
        if size == 0 || ptr % ps != 0 || size % ps != 0 {
            return Err(err::INVALID_VALUE);
        }
        if let Backend::Gpusim(g) = &self.backend {
            return self.gpusim_dmabuf_fd(g, ptr, size, flags);
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        // A split or merge below copies memory of the region, also outside [ptr, end): let no
        // queued stream operation write the region meanwhile.
        let (lo, hi) = self.tables().region(ptr).map_or((ptr, end), |reg| (reg.base, reg.end()));
        self.drain(lo, hi.max(end));
        let mut t = self.tables();
        let fd = if let Some(r) = t.find(ptr).filter(|r| r.kind == Kind::Vmm) {
            let (fd, maplen) = match (&r.backing, r.base == ptr) {
                (Backing::Vmm { phys, offset: 0, len }, true) => match t.phys.get(phys).and_then(|p| p.fd.clone()) {
                    Some(fd) => (fd, *len),
                    None => return Err(err::INVALID_VALUE),
                },
                _ => {
                    crate::log!("dma-buf export of {ptr:#x}: only VMM mappings from their base are supported");
                    return Err(err::INVALID_VALUE);
                }
            };
            if size > maplen {
                return Err(err::INVALID_VALUE);
            }
            fd
        } else {
            let rb = match t.region(ptr) {
                Some(reg) if end <= reg.end() => reg.base,
                _ => {
                    crate::log!("dma-buf export of {ptr:#x}+{size:#x}: not inside one cuMemAlloc region");
                    return Err(err::INVALID_VALUE);
                }
            };
            let reg = t.regions.get_mut(&rb).expect("found above");
            let reg_len = reg.len;
            let RegionMem::Memfd(segs) = &mut reg.mem else { return Err(err::INVALID_VALUE) };
            host_export_seg(segs, (rb, reg_len), ptr, size)?
        };
        fd.dup_raw().map_err(|e| {
            crate::log!("dup of the allocation's memfd failed: {e}");
            err::OPERATING_SYSTEM
        })
    }

    /// On gpusim the kernel exports a real dma-buf of the BAR pages (kmod/gpusim), as NVIDIA's
    /// driver does; like it on a discrete x86 GPU, the PCIe mapping-type flag is refused.
    fn gpusim_dmabuf_fd(&self, g: &Gpusim, ptr: u64, size: u64, flags: u64) -> R<i32> {
        if flags & CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE != 0 {
            crate::log!("dma-buf export: the PCIe mapping type needs a coherent (Grace) platform");
            return Err(err::NOT_SUPPORTED);
        }
        let t = self.tables();
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        // Any range inside one region (it may start or end in a neighbour's bytes or a free
        // slot, as CUDA's sub-allocated memory does) or inside one VMM mapping.
        let ok = t.region(ptr).is_some_and(|reg| end <= reg.end())
            || t.find(ptr).is_some_and(|r| r.kind == Kind::Vmm && end <= r.end());
        drop(t);
        if !ok {
            crate::log!("dma-buf export of {ptr:#x}+{size:#x}: not inside one device allocation region");
            return Err(err::INVALID_VALUE);
        }
        g.export_dmabuf(ptr, size).map_err(|e| {
            crate::log!("gpusim dma-buf export of {ptr:#x}+{size:#x} failed: {e}");
            match e.raw_os_error() {
                Some(sys::EINVAL) => err::INVALID_VALUE,
                Some(sys::ENOMEM) | Some(sys::EMFILE) => err::OUT_OF_MEMORY,
                Some(sys::ENOTTY) => err::NOT_SUPPORTED, // a gpusim.ko without dma-buf export
                _ => err::OPERATING_SYSTEM,
            }
        })
    }

    // ----- virtual memory management --------------------------------------------------------

    pub fn vmm_create(&self, size: u64, prop: &CUmemAllocationProp) -> R<u64> {
        if prop.type_ != CU_MEM_ALLOCATION_TYPE_PINNED || prop.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
            crate::log!("cuMemCreate: only pinned device allocations are simulated");
            return Err(if prop.type_ == CU_MEM_ALLOCATION_TYPE_PINNED {
                err::NOT_SUPPORTED
            } else {
                err::INVALID_VALUE
            });
        }
        self.check_device(prop.location.id)?;
        if prop.requested_handle_types & !CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR != 0 {
            return Err(err::NOT_SUPPORTED);
        }
        if size == 0 || size % GPU_PAGE != 0 {
            return Err(err::INVALID_VALUE);
        }
        let fd = match self.backend {
            Backend::Host => {
                self.host_reserve(size)?;
                match sys::memfd(c"cudasim-vmm", size) {
                    Ok(fd) => Some(Arc::new(fd)),
                    Err(e) => {
                        self.host_unreserve(size);
                        crate::log!("memfd for cuMemCreate failed: {e}");
                        return Err(err::OUT_OF_MEMORY);
                    }
                }
            }
            Backend::Gpusim(_) => None,
        };
        let h = new_handle(TAG_PHYS);
        self.tables().phys.insert(h, Phys { size, prop: *prop, fd, maps: 0, released: false });
        Ok(h)
    }

    pub fn vmm_release(&self, h: u64) -> R<()> {
        let mut t = self.tables();
        let p = t.phys.get_mut(&h).filter(|p| !p.released).ok_or(err::INVALID_VALUE)?;
        p.released = true;
        if p.maps == 0 {
            let p = t.phys.remove(&h).expect("present");
            drop(t);
            self.phys_free(p);
        }
        Ok(())
    }

    fn phys_free(&self, p: Phys) {
        if p.fd.is_some() {
            self.host_unreserve(p.size);
        }
    }

    pub fn vmm_reserve(&self, size: u64, align: u64, hint: u64, flags: u64) -> R<u64> {
        if size == 0 || size % GPU_PAGE != 0 || flags != 0 || (align != 0 && !align.is_power_of_two()) {
            return Err(err::INVALID_VALUE);
        }
        let align = align.max(GPU_PAGE);
        let (base, backing) = match &self.backend {
            Backend::Host => {
                let len = size.checked_add(align).ok_or(err::OUT_OF_MEMORY)?;
                let mut got = None;
                if hint != 0 && hint % align == 0 {
                    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
                    let r = unsafe {
                        sys::mmap_raw(
                            hint,
                            size,
                            sys::PROT_NONE,
                            sys::MAP_PRIVATE | sys::MAP_ANONYMOUS | sys::MAP_NORESERVE | sys::MAP_FIXED_NOREPLACE,
                            -1,
                            0,
                        )
                    };
                    match r {
                        Ok(a) if a == hint => got = Some((hint, ResBacking::Host { addr: hint, len: size })),
                        // SAFETY: `a` is the mapping just created, referenced by nothing.
                        Ok(a) => drop(unsafe { sys::unmap(a, size) }),
                        Err(_) => {}
                    }
                }
                match got {
                    Some(g) => g,
                    None => {
                        let raw =
                            sys::mmap_anon(len, sys::PROT_NONE, sys::MAP_NORESERVE).map_err(|_| err::OUT_OF_MEMORY)?;
                        let base = round_up(raw, align).expect("within the mapping");
                        trim(raw, len, base, size);
                        (base, ResBacking::Host { addr: base, len: size })
                    }
                }
            }
            Backend::Gpusim(g) => {
                // The reservation is backed by a gpusim allocation so that its addresses are
                // real GPU VAs (what gdrdrv pins); see docs/cudasim.md for the consequence.
                if align > GPU_PAGE {
                    crate::log!("cuMemAddressReserve: alignment {align:#x} > 64 KiB is not simulated with gpusim");
                    return Err(err::NOT_SUPPORTED);
                }
                let va = g.alloc(size).map_err(|e| {
                    crate::log!("gpusim reservation of {size:#x} bytes failed: {e}");
                    err::OUT_OF_MEMORY
                })?;
                (va, ResBacking::Gpusim { va })
            }
        };
        self.tables().reserves.insert(base, Reserve { base, size, backing });
        Ok(base)
    }

    pub fn vmm_free_reservation(&self, ptr: u64, size: u64) -> R<()> {
        let mut t = self.tables();
        match t.reserves.get(&ptr) {
            Some(r) if r.size == size => {}
            _ => return Err(err::INVALID_VALUE),
        }
        if t.overlaps_any(ptr, ptr + size) {
            crate::log!("cuMemAddressFree: {ptr:#x}+{size:#x} still has mappings");
            return Err(err::INVALID_VALUE);
        }
        let r = t.reserves.remove(&ptr).expect("checked");
        drop(t);
        match r.backing {
            // SAFETY: the reservation is ours and nothing is mapped inside it any more.
            ResBacking::Host { addr, len } => drop(unsafe { sys::unmap(addr, len) }),
            ResBacking::Gpusim { va } => {
                if let Backend::Gpusim(g) = &self.backend {
                    let _ = g.free(va);
                }
            }
        }
        Ok(())
    }

    pub fn vmm_map(&self, ptr: u64, size: u64, offset: u64, h: u64, flags: u64) -> R<()> {
        if flags != 0 || size == 0 || ptr % GPU_PAGE != 0 || size % GPU_PAGE != 0 || offset % GPU_PAGE != 0 {
            return Err(err::INVALID_VALUE);
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        let inside = t.reserves.range(..=ptr).next_back().is_some_and(|(_, r)| end <= r.base + r.size);
        if !inside {
            crate::log!("cuMemMap: {ptr:#x}+{size:#x} is not inside a reservation");
            return Err(err::INVALID_VALUE);
        }
        if t.overlaps_any(ptr, end) {
            return Err(err::ALREADY_MAPPED);
        }
        let p = t.phys.get(&h).filter(|p| !p.released).ok_or(err::INVALID_HANDLE)?;
        if offset.checked_add(size).is_none_or(|e| e > p.size) {
            return Err(err::INVALID_VALUE);
        }
        let device = p.prop.location.id;
        match (&self.backend, &p.fd) {
            (Backend::Host, Some(fd)) => {
                // SAFETY: [ptr, end) lies in our PROT_NONE reservation with no mapping inside
                // (checked above), so replacing it affects nothing else.
                unsafe { sys::mmap_raw(ptr, size, sys::PROT_NONE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, offset) }
                    .map_err(|e| {
                        crate::log!("cuMemMap: mmap failed: {e}");
                        err::OUT_OF_MEMORY
                    })?;
            }
            (Backend::Gpusim(g), _) => {
                if p.maps > 0 || offset != 0 {
                    crate::log!("cuMemMap: with gpusim an allocation handle can be mapped once, at offset 0");
                    return Err(err::NOT_SUPPORTED);
                }
                g.map(ptr, size).map_err(|e| {
                    crate::log!("cuMemMap: gpusim mmap failed: {e}");
                    err::OUT_OF_MEMORY
                })?;
                // SAFETY: the mapping was just created by us; access starts as none, as CUDA's.
                let _ = unsafe { sys::protect(ptr, size, sys::PROT_NONE) };
            }
            (Backend::Host, None) => return Err(err::INVALID_HANDLE),
        }
        t.phys.get_mut(&h).expect("present").maps += 1;
        self.insert_range(&mut t, ptr, size, Kind::Vmm, 0, device, 0, Backing::Vmm { phys: h, offset, len: size });
        Ok(())
    }

    pub fn vmm_unmap(&self, ptr: u64, size: u64) -> R<()> {
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        let bases: Vec<u64> = t.ranges.range(ptr..end).map(|(b, _)| *b).collect();
        let straddles = t.find(ptr).is_some_and(|r| r.base < ptr) || t.find(end - 1).is_some_and(|r| r.end() > end);
        if bases.is_empty() || straddles || bases.iter().any(|b| t.ranges[b].kind != Kind::Vmm) {
            return Err(err::INVALID_VALUE);
        }
        let ranges: Vec<Range> = bases.iter().filter_map(|b| t.ranges.remove(b)).collect();
        drop(t);
        for r in ranges {
            self.release_range(r);
        }
        Ok(())
    }

    /// Unmaps one VMM mapping whose range was already removed and drained.
    fn vmm_unmap_one(&self, base: u64, len: u64, phys: u64) {
        let res = if self.is_gpusim() {
            // SAFETY: the mapping is ours and drained; the reservation keeps its GPU VA.
            unsafe { sys::unmap(base, len) }
        } else {
            // SAFETY: restore the PROT_NONE reservation over our own mapping.
            unsafe {
                sys::mmap_raw(
                    base,
                    len,
                    sys::PROT_NONE,
                    sys::MAP_PRIVATE | sys::MAP_ANONYMOUS | sys::MAP_NORESERVE | sys::MAP_FIXED,
                    -1,
                    0,
                )
            }
            .map(|_| ())
        };
        if let Err(e) = res {
            crate::log!("unmapping VMM range {base:#x}+{len:#x} failed: {e}");
        }
        let mut t = self.tables();
        if let Some(p) = t.phys.get_mut(&phys) {
            p.maps -= 1;
            if p.maps == 0 && p.released {
                let p = t.phys.remove(&phys).expect("present");
                drop(t);
                self.phys_free(p);
            }
        }
    }

    pub fn vmm_set_access(&self, ptr: u64, size: u64, descs: &[CUmemAccessDesc]) -> R<()> {
        if descs.is_empty() || size == 0 {
            return Err(err::INVALID_VALUE);
        }
        let mut access = CU_MEM_ACCESS_FLAGS_PROT_NONE;
        for d in descs {
            if d.location.type_ != CU_MEM_LOCATION_TYPE_DEVICE {
                return Err(err::INVALID_VALUE);
            }
            self.check_device(d.location.id)?;
            if ![CU_MEM_ACCESS_FLAGS_PROT_NONE, CU_MEM_ACCESS_FLAGS_PROT_READ, CU_MEM_ACCESS_FLAGS_PROT_READWRITE]
                .contains(&d.flags)
            {
                return Err(err::INVALID_VALUE);
            }
            access |= d.flags;
        }
        let end = ptr.checked_add(size).ok_or(err::INVALID_VALUE)?;
        let mut t = self.tables();
        // The range must be covered by whole VMM mappings, without holes.
        let mut cur = ptr;
        for (_, r) in t.ranges.range(..end) {
            if r.end() <= ptr {
                continue;
            }
            if r.kind != Kind::Vmm || r.base != cur {
                return Err(err::INVALID_VALUE);
            }
            cur = r.end();
        }
        if cur != end {
            return Err(err::INVALID_VALUE);
        }
        let prot = match access {
            CU_MEM_ACCESS_FLAGS_PROT_NONE => sys::PROT_NONE,
            CU_MEM_ACCESS_FLAGS_PROT_READ => sys::PROT_READ,
            _ => sys::PROT_READ | sys::PROT_WRITE,
        };
        // SAFETY: [ptr, end) consists of our own VMM mappings (checked above).
        unsafe { sys::protect(ptr, size, prot) }.map_err(|e| {
            crate::log!("cuMemSetAccess: mprotect failed: {e}");
            err::INVALID_VALUE
        })?;
        let bases: Vec<u64> = t.ranges.range(ptr..end).map(|(b, _)| *b).collect();
        for b in bases {
            t.ranges.get_mut(&b).expect("present").access = access;
        }
        Ok(())
    }
}

/// Trims a larger reservation `[raw, raw+len)` down to `[base, base+size)`.
fn trim(raw: u64, len: u64, base: u64, size: u64) {
    // SAFETY: the head and tail lie inside the mapping we just made and nothing uses them.
    unsafe {
        if base > raw {
            let _ = sys::unmap(raw, base - raw);
        }
        if raw + len > base + size {
            let _ = sys::unmap(base + size, raw + len - (base + size));
        }
    }
}

/// Host-mode device memory: anonymous, 2 MiB aligned.
fn host_map_anon(len: u64) -> R<u64> {
    let raw = sys::mmap_anon(len + REGION_SIZE, sys::PROT_READ | sys::PROT_WRITE, 0).map_err(|e| {
        crate::log!("mmap of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    let base = round_up(raw, REGION_SIZE).expect("within the mapping");
    trim(raw, len + REGION_SIZE, base, len);
    Ok(base)
}

/// Host-mode device memory backed by a memfd (so that it can be exported as a "dma-buf"), 2 MiB
/// aligned.
fn host_map_memfd(len: u64) -> R<(u64, Fd)> {
    let fd = sys::memfd(c"cudasim-device", len).map_err(|e| {
        crate::log!("memfd of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    let raw = sys::mmap_anon(len + REGION_SIZE, sys::PROT_NONE, sys::MAP_NORESERVE).map_err(|_| err::OUT_OF_MEMORY)?;
    let base = round_up(raw, REGION_SIZE).expect("within the mapping");
    // SAFETY: [base, base+len) lies inside the PROT_NONE reservation just made.
    let r = unsafe {
        sys::mmap_raw(base, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, 0)
    };
    if let Err(e) = r {
        // SAFETY: our own reservation, unused.
        let _ = unsafe { sys::unmap(raw, len + REGION_SIZE) };
        crate::log!("mmap of the memfd failed: {e}");
        return Err(err::OUT_OF_MEMORY);
    }
    trim(raw, len + REGION_SIZE, base, len);
    Ok((base, fd))
}

/// The memfd a host-memory dma-buf export of `[ptr, ptr+size)` hands out: offset 0 of the file is
/// `ptr`, and the region's own mapping of the range is that file, so device memory and every
/// mapping of the dma-buf share pages. `region` is (base, length).
///
/// CUDA exports any page range, overlapping earlier exports or not. Here a file's offset 0 must
/// be the export's start, so the region's memfd pieces are re-cut to fit: a piece nobody holds
/// any more (no descriptor and no mapping of it outside cudasim, `export_held`) may be split or
/// absorbed like one never exported, and an export from the start of a held piece may grow it over
/// the pieces behind it. What no memfd layout can give is two held exports that overlap with
/// different starts: a page lives at one offset of one file. That export is refused (on gpusim,
/// kernel dma-bufs cover any range).
fn host_export_seg(segs: &mut Vec<Seg>, region: (u64, u64), ptr: u64, size: u64) -> R<Arc<Fd>> {
    let rb = region.0;
    let (off, end) = (ptr - rb, ptr - rb + size);
    // An export nobody holds any more pins nothing.
    for s in segs.iter_mut().filter(|s| s.exported && s.off < end && off < s.off + s.len) {
        s.exported = export_held(&s.fd, region);
    }
    let mut i = segs.iter().position(|s| s.off <= off && off < s.off + s.len).ok_or(err::INVALID_VALUE)?;
    if segs[i].off != off {
        if segs[i].exported {
            crate::log!(
                "dma-buf export of {ptr:#x}: starts inside the exported range {:#x}+{:#x}, which is still held; \
                 host-memory dma-bufs (memfds) cannot overlap with different starts (use gpusim)",
                rb + segs[i].off,
                segs[i].len
            );
            return Err(err::INVALID_VALUE);
        }
        let tail = segs[i].off + segs[i].len - off;
        let fd = host_split(ptr, tail)?;
        segs[i].len = off - segs[i].off;
        i += 1;
        segs.insert(i, Seg { off, len: tail, fd: Arc::new(fd), exported: false });
    }
    // Runs past its piece: absorb the pieces behind it (a held one cannot be moved).
    while segs[i].off + segs[i].len < end {
        let j = i + 1;
        if segs[j].exported {
            crate::log!(
                "dma-buf export of {ptr:#x}+{size:#x}: runs into the exported range {:#x}+{:#x}, which is still held; \
                 host-memory dma-bufs (memfds) cannot overlap with different starts (use gpusim)",
                rb + segs[j].off,
                segs[j].len
            );
            return Err(err::INVALID_VALUE);
        }
        let (joff, jlen) = (segs[j].off, segs[j].len);
        if joff + jlen > end {
            let fd = host_split(rb + end, joff + jlen - end)?;
            segs[j].len = end - joff;
            segs.insert(j + 1, Seg { off: end, len: joff + jlen - end, fd: Arc::new(fd), exported: false });
        }
        let jlen = segs[j].len;
        host_move(rb + joff, jlen, &segs[i].fd, joff - off)?;
        segs[i].len += jlen;
        segs.remove(j);
    }
    // An export that is not held also splits at its end, so the rest of the region stays
    // exportable from any start while this one is held.
    let (soff, slen) = (segs[i].off, segs[i].len);
    if !segs[i].exported && end < soff + slen {
        let tail = soff + slen - end;
        let fd = host_split(rb + end, tail)?;
        segs[i].len = size;
        segs.insert(i + 1, Seg { off: end, len: tail, fd: Arc::new(fd), exported: false });
    }
    let s = &mut segs[i];
    s.exported = true;
    Ok(Arc::clone(&s.fd))
}

/// Whether the memfd `fd` of an exported piece is still held outside cudasim in this process: a
/// descriptor other than cudasim's own, or a mapping outside the region's own addresses (`region`
/// is base, length). A dma-buf passed to another process is not seen (a limit of host memory
/// mode; on gpusim the kernel keeps the dma-buf). When /proc cannot be read, it counts as held.
fn export_held(fd: &Fd, region: (u64, u64)) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(me) = std::fs::metadata(format!("/proc/self/fd/{}", fd.0)) else { return true };
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return true };
    for e in dir.flatten() {
        if e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) == Some(fd.0) {
            continue;
        }
        if std::fs::metadata(e.path()).is_ok_and(|m| m.dev() == me.dev() && m.ino() == me.ino()) {
            return true;
        }
    }
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else { return true };
    let ino = me.ino().to_string();
    maps.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 6 || f[4] != ino || !f[5].starts_with("/memfd:cudasim-device") {
            return false;
        }
        let Some((a, b)) = f[0].split_once('-') else { return true };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { return true };
        a < region.0 || b > region.0 + region.1
    })
}

/// Moves `[addr, addr+len)` (host-page aligned, our own shared mapping) into a new memfd mapped
/// at the same addresses, keeping the contents.
fn host_split(addr: u64, len: u64) -> R<Fd> {
    let fd = sys::memfd(c"cudasim-device", len).map_err(|e| {
        crate::log!("memfd of {len:#x} bytes failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    host_move(addr, len, &fd, 0)?;
    Ok(fd)
}

/// Moves `[addr, addr+len)` (host-page aligned, our own shared mapping of a piece nobody else
/// holds) to offset `file_off` of the memfd `fd`, mapped at the same addresses, keeping the
/// contents; the file grows to hold it (never shrinks: other mappings of it stay valid).
fn host_move(addr: u64, len: u64, fd: &Fd, file_off: u64) -> R<()> {
    let need = file_off + len;
    let have = std::fs::metadata(format!("/proc/self/fd/{}", fd.0)).map(|m| m.len()).unwrap_or(0);
    if have < need {
        sys::set_len(fd, need).map_err(|e| {
            crate::log!("growing a memfd to {need:#x} bytes failed: {e}");
            err::OUT_OF_MEMORY
        })?;
    }
    // SAFETY: a fresh shared mapping of the memfd at a kernel-chosen address.
    let tmp = unsafe { sys::mmap_raw(0, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED, fd.0, file_off) }
        .map_err(|_| err::OUT_OF_MEMORY)?;
    // SAFETY: [addr, addr+len) is mapped readable device memory of ours (a region piece) and
    // [tmp, tmp+len) the fresh mapping above; they do not overlap.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, tmp as *mut u8, len as usize) };
    // SAFETY: our temporary mapping, referenced by nothing.
    let _ = unsafe { sys::unmap(tmp, len) };
    // SAFETY: [addr, addr+len) is our own region mapping of a piece no one else holds; replacing
    // it with the same contents from `fd` changes nothing anyone else sees.
    unsafe {
        sys::mmap_raw(addr, len, sys::PROT_READ | sys::PROT_WRITE, sys::MAP_SHARED | sys::MAP_FIXED, fd.0, file_off)
    }
    .map_err(|e| {
        crate::log!("remapping {addr:#x}+{len:#x} onto a memfd failed: {e}");
        err::OUT_OF_MEMORY
    })?;
    Ok(())
}
