//! The copy/unmap race (issue 10): copies in several threads while other threads unmap, unpin,
//! re-pin and close, and (where the backend has them) GPU frees fire invalidation callbacks.
//!
//! What must hold: every copy returns 0 or EINVAL, none faults, and none touches a virtual range
//! after the library let it go. Right after `gdr_unmap` the range must be either free or parked
//! (anonymous memory the library still holds because a copy may be using it, see
//! src/parking.rs), never still the device mapping; the thread then checks the ranges parked
//! earlier, and each range it finds free gets a canary: anonymous memory mapped at that very
//! address (`MAP_FIXED_NOREPLACE`, which also proves the range really was free) and filled with
//! [`CANARY`]. A late store would change a canary; a late load would bring a canary byte back,
//! which copies into the GPU never write ([`STORE_BYTE`]) and the GPU memory never holds
//! ([`GPU_BYTE`]). A run must see both kinds (ranges freed at once and parked ones).
//!
//! Copiers read the shared table without any lock, so they use stale and mixed (handle, address)
//! pairs all the time, exactly what the library must survive.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use super::{GdrMh, GdrT, Rng, capi};

pub const CANARY: u8 = 0xCC;
pub const STORE_BYTE: u8 = 0xA5;
pub const GPU_BYTE: u8 = 0x5A;
const BUF: usize = 256 << 10;
const ENTRIES: usize = 6;

/// GPU memory for the test: the backend under test provides it.
pub trait Gpu: Sync {
    /// Allocates `len` bytes filled with [`GPU_BYTE`]; returns the device address.
    fn alloc(&self, len: usize) -> u64;
    /// Frees an allocation (while it may still be pinned: that fires the free callback).
    fn free(&self, va: u64);
}

/// Sets the stop flag when a thread ends, also by a panic, so one failed assertion ends the run
/// instead of leaving the other threads looping.
struct StopOnExit<'a>(&'a AtomicBool);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// One published buffer: copiers read these three words without synchronisation.
#[derive(Default)]
struct Entry {
    h: AtomicU64,
    va: AtomicUsize,
    len: AtomicUsize,
}

#[derive(Debug, Default)]
pub struct Stats {
    pub copies_ok: u64,
    pub copies_einval: u64,
    pub unmaps: u64,
    pub parked: u64,
    pub remaps: u64,
    pub closes: u64,
    pub invalidations: u64,
}

struct Canary {
    addr: usize,
    len: usize,
}

/// A canary at `[addr, addr + len)` if that range is free, else `None`.
fn map_canary(addr: usize, len: usize) -> Option<Canary> {
    // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping: it fails instead.
    let p = unsafe {
        libc::mmap(
            addr as *mut c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        assert_eq!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EEXIST), "canary mmap");
        return None;
    }
    assert_eq!(p as usize, addr, "kernel without MAP_FIXED_NOREPLACE placed the canary elsewhere");
    // SAFETY: our fresh private mapping of len bytes.
    unsafe { std::ptr::write_bytes(p.cast::<u8>(), CANARY, len) };
    Some(Canary { addr, len })
}

/// The `/proc/self/maps` lines that overlap `[addr, addr + len)`.
pub fn mappings_over(addr: usize, len: usize) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter(|l| {
            let range = l.split_whitespace().next().unwrap_or("");
            let (a, b) = range.split_once('-').unwrap_or(("0", "0"));
            let (a, b) = (usize::from_str_radix(a, 16).unwrap(), usize::from_str_radix(b, 16).unwrap());
            a < addr + len && addr < b
        })
        .map(str::to_owned)
        .collect()
}

/// Whether every line is private anonymous read-write memory (inode 0, no path): a parked range.
pub fn all_anonymous(lines: &[String]) -> bool {
    lines.iter().all(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 5 && f[1] == "rw-p" && f[4] == "0"
    })
}

fn check_and_drop_canary(c: Canary) {
    // SAFETY: our own mapping from map_canary, still mapped.
    let bytes = unsafe { std::slice::from_raw_parts(c.addr as *const u8, c.len) };
    let bad = bytes.iter().position(|&b| b != CANARY);
    assert!(bad.is_none(), "a copy wrote into {:#x} after it was unmapped (byte {:?})", c.addr, bad);
    // SAFETY: unmapping our own canary mapping.
    unsafe { libc::munmap(c.addr as *mut c_void, c.len) };
}

fn open() -> GdrT {
    let g = capi::gdr_open();
    assert!(!g.is_null(), "gdr_open");
    g
}

/// Pins and maps `va`; publishes the handle into `e`.
fn publish(g: GdrT, va: u64, e: &Entry) {
    let mut mh = GdrMh { h: 0 };
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_pin_buffer(g, va as _, BUF, 0, 0, &mut mh) }, 0, "pin");
    let mut p = std::ptr::null_mut();
    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
    assert_eq!(unsafe { capi::gdr_map(g, mh, &mut p, BUF) }, 0, "map");
    e.va.store(p as usize, Ordering::Relaxed);
    e.len.store(BUF, Ordering::Relaxed);
    e.h.store(mh.h, Ordering::Release);
}

/// Runs the race for `duration` with `copiers` copy threads. `free_callbacks`: the backend fires
/// invalidation callbacks on free (gdrdrv in non-persistent mode); a third thread then frees
/// pinned-and-mapped buffers that no copier uses, and checks the callback flag.
pub fn copy_unmap_race(gpu: &dyn Gpu, copiers: usize, duration: Duration, free_callbacks: bool) -> Stats {
    let table: Vec<Entry> = (0..ENTRIES).map(|_| Entry::default()).collect();
    let gpu_bufs: Vec<u64> = (0..ENTRIES).map(|_| gpu.alloc(BUF)).collect();
    let g = AtomicUsize::new(open() as usize);
    for (e, &va) in table.iter().zip(&gpu_bufs) {
        publish(g.load(Ordering::Relaxed) as GdrT, va, e);
    }
    let stop = AtomicBool::new(false);
    // Held from an unmap until its canary is in place, and around everything the free-callback
    // thread maps (its gdr_map, and the allocation's own mappings): otherwise one of those may
    // legitimately land on the range just freed.
    let va_lock = Mutex::new(());
    let (ok, einval) = (AtomicU64::new(0), AtomicU64::new(0));
    let stats = Mutex::new(Stats::default());
    let deadline = Instant::now() + duration;
    // Every thread maps memory while it starts (its signal stack; the copiers' BUF-sized buffers
    // come from mmap too), and such a mapping may land on a range the control thread just freed:
    // nobody starts working until all have started.
    let started = Barrier::new(copiers + 1 + usize::from(free_callbacks));

    std::thread::scope(|s| {
        for t in 0..copiers {
            let (table, stop, ok, einval, started) = (&table, &stop, &ok, &einval, &started);
            s.spawn(move || {
                let _stop = StopOnExit(stop);
                let mut rng = Rng::new(0x9e37_79b9 ^ t as u64);
                let src = vec![STORE_BYTE; BUF];
                let mut dst = vec![0u8; BUF];
                started.wait();
                while !stop.load(Ordering::Relaxed) {
                    let e = &table[rng.below(ENTRIES)];
                    let h = GdrMh { h: e.h.load(Ordering::Acquire) };
                    let (va, len) = (e.va.load(Ordering::Relaxed), e.len.load(Ordering::Relaxed).max(1));
                    // Half the copies are one aligned access of 1-8 bytes (the fast path's inline
                    // case, src/fastcopy.rs), the rest any size at any offset.
                    let (off, n) = if rng.next() & 1 == 0 {
                        let n = 1usize << rng.below(4);
                        (rng.below(len) & !(n - 1), n)
                    } else {
                        let off = rng.below(len);
                        (off, 1 + rng.below((len - off).min(8192)))
                    };
                    let dev = (va + off) as *mut c_void;
                    let rc = if rng.next() & 1 == 0 {
                        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                        unsafe { capi::gdr_copy_to_mapping(h, dev, src.as_ptr().cast(), n) }
                    } else {
                        dst[..n].fill(0);
                        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                        let rc = unsafe { capi::gdr_copy_from_mapping(h, dst.as_mut_ptr().cast(), dev, n) };
                        if rc == 0 {
                            assert!(
                                !dst[..n].contains(&CANARY),
                                "a copy read from {dev:p} after it was unmapped (canary byte came back)"
                            );
                        }
                        rc
                    };
                    match rc {
                        0 => ok.fetch_add(1, Ordering::Relaxed),
                        libc::EINVAL => einval.fetch_add(1, Ordering::Relaxed),
                        other => panic!("copy returned {other}, expected 0 or EINVAL"),
                    };
                }
            });
        }

        // Control: unmap (canary at the freed range), then map the same pin again or unpin, re-pin
        // and map; sometimes close all.
        {
            let (table, stop, stats, g, gpu_bufs, va_lock, started) =
                (&table, &stop, &stats, &g, &gpu_bufs, &va_lock, &started);
            s.spawn(move || {
                let _stop = StopOnExit(stop);
                let mut rng = Rng::new(77);
                let mut canaries: Vec<Canary> = Vec::with_capacity(16);
                let mut parked: Vec<(usize, usize)> = Vec::new();
                started.wait();
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    let gg = g.load(Ordering::Relaxed) as GdrT;
                    if rng.below(16) == 0 {
                        // Close with everything pinned and mapped: close must retract every
                        // mapping before anything is unmapped.
                        assert_eq!(capi::gdr_close(gg), 0, "close");
                        // The dma-buf backend unmaps on close; gdrdrv leaves the (zapped) VMAs to
                        // the application, as upstream.
                        let ng = open();
                        for (i, e) in table.iter().enumerate() {
                            publish(ng, gpu_bufs[i], e);
                        }
                        g.store(ng as usize, Ordering::Relaxed);
                        stats.lock().unwrap().closes += 1;
                        continue;
                    }
                    let i = rng.below(ENTRIES);
                    let e = &table[i];
                    let mh = GdrMh { h: e.h.load(Ordering::Relaxed) };
                    let (va, len) = (e.va.load(Ordering::Relaxed), e.len.load(Ordering::Relaxed));
                    let held = va_lock.lock().unwrap();
                    assert_eq!(capi::gdr_unmap(gg, mh, va as *mut c_void, len), 0, "unmap");
                    if let Some(c) = map_canary(va, len) {
                        canaries.push(c);
                    } else {
                        let over = mappings_over(va, len);
                        assert!(
                            all_anonymous(&over),
                            "after gdr_unmap the range {va:#x}+{len:#x} is neither free nor parked: {over:?}"
                        );
                        parked.push((va, len));
                        stats.lock().unwrap().parked += 1;
                    }
                    // Ranges parked earlier that the library has let go since get canaries too
                    // (one still taken is still parked, or went to a later mapping: both fine).
                    parked.retain(|&(a, l)| map_canary(a, l).map(|c| canaries.push(c)).is_none());
                    if rng.below(2) == 0 {
                        // Map the same pin again (it may take its parked range back), under the
                        // lock like every other mapping made while canaries go up.
                        let mut p = std::ptr::null_mut();
                        // SAFETY: pointers to live locals of this test.
                        assert_eq!(unsafe { capi::gdr_map(gg, mh, &mut p, BUF) }, 0, "remap");
                        e.va.store(p as usize, Ordering::Relaxed);
                        drop(held);
                        stats.lock().unwrap().remaps += 1;
                    } else {
                        drop(held);
                        assert_eq!(capi::gdr_unpin_buffer(gg, mh), 0, "unpin");
                        publish(gg, gpu_bufs[i], e);
                    }
                    stats.lock().unwrap().unmaps += 1;
                    while canaries.len() > 8 {
                        check_and_drop_canary(canaries.remove(0));
                    }
                }
                stop.store(true, Ordering::Relaxed);
                // Copiers stop within one copy; then every canary must still be intact.
                std::thread::sleep(Duration::from_millis(20));
                for c in canaries {
                    check_and_drop_canary(c);
                }
            });
        }

        // Free callbacks on buffers no copier touches.
        if free_callbacks {
            let (stop, stats, g, va_lock, started) = (&stop, &stats, &g, &va_lock, &started);
            s.spawn(move || {
                let _stop = StopOnExit(stop);
                started.wait();
                while !stop.load(Ordering::Relaxed) {
                    // Everything here that may map memory (the allocation's GPU view and fill
                    // buffer, the library's own allocations while pinning, gdr_map) under the lock.
                    let held = va_lock.lock().unwrap();
                    let va = gpu.alloc(BUF);
                    let gg = g.load(Ordering::Relaxed) as GdrT;
                    let mut mh = GdrMh { h: 0 };
                    // The instance may be closed under us by the control thread: then EINVAL.
                    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                    if unsafe { capi::gdr_pin_buffer(gg, va as _, BUF, 0, 0, &mut mh) } != 0 {
                        drop(held);
                        gpu.free(va);
                        continue;
                    }
                    let mut p = std::ptr::null_mut();
                    // SAFETY: pointers to live locals of this test.
                    let mapped = unsafe { capi::gdr_map(gg, mh, &mut p, BUF) } == 0;
                    drop(held);
                    gpu.free(va);
                    let mut flag = -1;
                    // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
                    if unsafe { capi::gdr_get_callback_flag(gg, mh, &mut flag) } == 0 {
                        assert_eq!(flag, 1, "the free callback did not mark the handle");
                        stats.lock().unwrap().invalidations += 1;
                    }
                    if mapped {
                        let _ = capi::gdr_unmap(gg, mh, p, BUF);
                    }
                    let _ = capi::gdr_unpin_buffer(gg, mh);
                }
            });
        }
    });

    assert_eq!(capi::gdr_close(g.load(Ordering::Relaxed) as GdrT), 0);
    for va in gpu_bufs {
        gpu.free(va);
    }
    let mut st = stats.into_inner().unwrap();
    st.copies_ok = ok.load(Ordering::Relaxed);
    st.copies_einval = einval.load(Ordering::Relaxed);
    println!("copy/unmap race: {st:?}");
    assert!(st.copies_ok > 0, "no copy succeeded: the race was not exercised");
    assert!(st.copies_einval > 0, "no copy met a retracted mapping: the race was not exercised");
    assert!(st.unmaps > 0 && st.closes > 0, "the control thread did not unmap and close");
    assert!(st.parked > 0, "no unmap met a copy in flight (nothing parked): the race was not exercised");
    assert!(st.parked < st.unmaps, "every unmap was parked: the unmap-at-once path was not exercised");
    assert!(st.remaps > 0, "no handle was mapped again");
    // The copiers have exited. Their lines are given back by thread-exit destructors, which may
    // run a moment after the scope saw the threads finish; every control call then releases what
    // is no longer named.
    let deadline = Instant::now() + Duration::from_secs(10);
    while capi::parked_mappings() != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(capi::gdr_close(open()), 0);
    }
    assert_eq!(capi::parked_mappings(), 0, "parked ranges left after every copier exited");
    if free_callbacks {
        assert!(st.invalidations > 0, "no free callback was observed");
    }
    st
}
