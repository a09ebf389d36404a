//! nvmesim: a software NVMe controller for tests.
//!
//! A thread plays the controller over a BAR0-shaped memory region (CAP, VS, CC, CSTS, AQA, ASQ,
//! ACQ, doorbells from 0x1000 with CAP.DSTRD), processing admin commands (Identify, Set/Get
//! Features Number of Queues, Create/Delete I/O SQ/CQ, Get Log Page, Abort) and NVM I/O (Read,
//! Write, Flush, Write Zeroes) with PRP1, PRP2 and chained PRP lists over a namespace held in
//! memory. **Bus addresses are virtual addresses of the test process**: the host side passes
//! pointers as PRPs and queue bases. Tests can inject statuses, complete out of order and stall
//! the controller. The namespace starts with the VM harness's image pattern
//! (tests/vm/nvme/image.py: the 64-bit word at byte offset `o` is `0xA5 << 56 | o`).
//!
//! Used by libnvm's tests (through `nvm_raw_ctrl_init` on [`SimController::bar`]) and, through
//! the small C API in [`capi`], by C consumers.

pub mod capi;
pub mod capi_pq;
mod engine;
mod mem;

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Bytes of the register region (BAR0): registers plus doorbells.
pub const BAR_SIZE: usize = 0x4000;

/// The image pattern of an unwritten namespace: the word at byte offset `o`.
pub const PATTERN_TAG: u64 = 0xA5 << 56;

/// The byte at offset `off` of an unwritten namespace.
pub fn pattern_byte(off: u64) -> u8 {
    let word = PATTERN_TAG | (off & !7);
    word.to_le_bytes()[(off & 7) as usize]
}

/// Bus address → CPU address of `len` bytes, for hosts whose bus addresses are not their
/// virtual addresses (e.g. GPU memory reached through a CPU mapping, or an IOVA table); `None`
/// means nothing is mapped there (the command fails with Data Transfer Error).
#[derive(Clone)]
pub struct Translate(pub Arc<dyn Fn(u64, usize) -> Option<u64> + Send + Sync>);

impl std::fmt::Debug for Translate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Translate(..)")
    }
}

/// Controller parameters (the defaults model QEMU 7.2's controller, smaller and faster).
#[derive(Debug, Clone)]
pub struct Config {
    /// CAP.MQES (0-based maximum entries of an I/O queue).
    pub mqes: u16,
    /// CAP.DSTRD.
    pub dstrd: u8,
    /// CAP.TO in 500 ms units.
    pub timeout_units: u8,
    /// CAP.MPSMIN / CAP.MPSMAX.
    pub mpsmin: u8,
    pub mpsmax: u8,
    /// CAP.CQR.
    pub cqr: bool,
    /// Identify MDTS (2^mdts minimum pages; 0 = no limit).
    pub mdts: u8,
    /// I/O queue pairs the controller supports (Number of Queues ceiling).
    pub max_ioqpairs: u16,
    /// log2 of the LBA size.
    pub lba_shift: u8,
    /// Namespace size in blocks.
    pub n_blocks: u64,
    /// Identify strings (space padded by the controller).
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// Delay between CC.EN and CSTS.RDY changes.
    pub ready_delay: Duration,
    /// Never raise CSTS.RDY after CC.EN = 1 (a dead controller).
    pub never_ready: bool,
    /// Report fatal status (CSTS.CFS) when enabled.
    pub fatal_on_enable: bool,
    /// Bus-to-CPU address translation; `None`: bus addresses are virtual addresses.
    pub translate: Option<Translate>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            mqes: 2047,
            dstrd: 0,
            timeout_units: 2,
            mpsmin: 0,
            mpsmax: 4,
            cqr: true,
            mdts: 5,
            max_ioqpairs: 64,
            lba_shift: 9,
            n_blocks: 16384,
            serial: "nvmesim0001".into(),
            model: "nvmesim NVMe Ctrl".into(),
            firmware: "0.1".into(),
            ready_delay: Duration::ZERO,
            never_ready: false,
            fatal_on_enable: false,
            translate: None,
        }
    }
}

/// Which commands an injected status applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// Admin (queue 0) or I/O commands.
    pub admin: bool,
    /// Opcode, or `None` for any.
    pub opcode: Option<u8>,
}

/// A status to report instead of executing matching commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Injection {
    pub matches: Match,
    pub sct: u8,
    pub sc: u8,
    pub dnr: bool,
    /// How many matching commands get it.
    pub count: u32,
}

/// Counters the tests read.
#[derive(Debug, Default)]
pub struct Stats {
    pub admin_commands: AtomicU64,
    pub io_commands: AtomicU64,
    pub resets: AtomicU64,
    /// Completions the controller could not post because the CQ was full (it waits).
    pub cq_full_waits: AtomicU64,
    /// Doorbell writes with an index beyond the queue.
    pub bad_doorbells: AtomicU64,
    /// Completions dropped because their CQ slot translated to nothing.
    pub lost_completions: AtomicU64,
}

pub(crate) struct Shared {
    pub(crate) cfg: Config,
    /// The register region, as 32-bit cells (the host writes them through a raw pointer).
    pub(crate) bar: Box<[AtomicU32]>,
    pub(crate) storage: Mutex<Vec<u8>>,
    pub(crate) injections: Mutex<Vec<Injection>>,
    pub(crate) stop: AtomicBool,
    pub(crate) stalled: AtomicBool,
    pub(crate) out_of_order: AtomicBool,
    pub(crate) stats: Stats,
}

/// A running simulated controller; stops its thread when dropped.
pub struct SimController {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SimController {
    /// Starts a controller with `cfg`.
    pub fn start(cfg: Config) -> SimController {
        let bytes = (cfg.n_blocks << cfg.lba_shift) as usize;
        let mut storage = vec![0u8; bytes];
        for (i, w) in storage.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&(PATTERN_TAG | (i as u64 * 8)).to_le_bytes());
        }
        let bar: Box<[AtomicU32]> = (0..BAR_SIZE / 4).map(|_| AtomicU32::new(0)).collect();
        let shared = Arc::new(Shared {
            cfg,
            bar,
            storage: Mutex::new(storage),
            injections: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            out_of_order: AtomicBool::new(false),
            stats: Stats::default(),
        });
        engine::init_registers(&shared);
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("nvmesim".into())
            .spawn(move || engine::run(&s))
            .expect("spawning the controller thread");
        SimController { shared, thread: Some(thread) }
    }

    /// The register region (BAR0), [`BAR_SIZE`] bytes, 4 KiB aligned is not guaranteed but
    /// 4-byte alignment is.
    pub fn bar(&self) -> *mut std::ffi::c_void {
        self.shared.bar.as_ptr() as *mut std::ffi::c_void
    }

    /// Bytes of the register region.
    pub fn bar_len(&self) -> usize {
        BAR_SIZE
    }

    pub fn config(&self) -> &Config {
        &self.shared.cfg
    }

    /// The namespace's contents (lock held while the guard lives; the controller waits).
    pub fn storage(&self) -> MutexGuard<'_, Vec<u8>> {
        self.shared.storage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a status injection.
    pub fn inject(&self, inj: Injection) {
        self.shared.injections.lock().unwrap_or_else(|p| p.into_inner()).push(inj);
    }

    /// Stops (true) or resumes fetching commands; a stalled controller leaves them in the SQs.
    pub fn set_stalled(&self, stalled: bool) {
        self.shared.stalled.store(stalled, Ordering::SeqCst);
    }

    /// Completes each batch of fetched commands in reverse order.
    pub fn set_out_of_order(&self, ooo: bool) {
        self.shared.out_of_order.store(ooo, Ordering::SeqCst);
    }

    pub fn stats(&self) -> &Stats {
        &self.shared.stats
    }

    /// Reads a register (for tests checking what the host programmed).
    pub fn reg32(&self, off: usize) -> u32 {
        self.shared.bar[off / 4].load(Ordering::SeqCst)
    }
}

impl Drop for SimController {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
