//! The controller's configuration and the state its thread shares with the handle: a leaf both
//! the engine and the public handle in lib.rs use.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
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
