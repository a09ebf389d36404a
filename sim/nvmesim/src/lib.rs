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
mod state;

use state::Shared;
pub use state::{BAR_SIZE, Config, Injection, Match, PATTERN_TAG, Stats, Translate, pattern_byte};

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

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
