//! Thread scaling: copies from several threads, each through its own mapping and pinned to its
//! own CPU.

use std::time::{Duration, Instant};

use gdrapi::copy::Direction;

use crate::cuda::{Cuda, device_memory};
use crate::gdrlib::{BarMapping, GdrLib};
use crate::heap::Heap;
use crate::method::Method;
use crate::report::human;
use crate::timing::Timing;

/// The CPUs this process may run on, lowest first (`sched_getaffinity`); empty if unknown.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the call fills it for this process.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a writable cpu_set_t of the size passed.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: CPU_ISSET reads the set filled above.
    (0..libc::CPU_SETSIZE as usize).filter(|&c| unsafe { libc::CPU_ISSET(c, &set) }).collect()
}

/// Pins the calling thread to `cpu`; false where the kernel refuses.
fn pin_to(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET adds one CPU below CPU_SETSIZE.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 names the calling thread.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0 }
}

/// Calls per second of `n` threads, each copying `len` bytes through its own mapping for `dur`,
/// thread `i` pinned to `cpus[i]` (so that no two share a CPU when there are enough, and the
/// scheduler moves none of them mid-run); unpinned where `cpus` is empty.
#[allow(clippy::too_many_arguments)]
fn run_threads(
    maps: &[BarMapping],
    cpus: &[usize],
    n: usize,
    public: bool,
    dir: Direction,
    len: usize,
    dur: Duration,
) -> f64 {
    let barrier = std::sync::Barrier::new(n);
    let total: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = maps[..n]
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let (m, barrier, cpu) = (*m, &barrier, cpus.get(i % cpus.len().max(1)).copied());
                s.spawn(move || {
                    if let Some(c) = cpu {
                        pin_to(c);
                    }
                    let host = Heap::new(len + 64);
                    let method = if public {
                        Method::Public { label: String::new(), m, dev_off: 0, host_off: 0 }
                    } else {
                        Method::Dispatch { dev_off: 0, host_off: 0 }
                    };
                    // Warm-up: this thread's first copy (its announcement line, the mapping's
                    // pages) and the CPU's clock, before the barrier.
                    let warm = Instant::now();
                    while warm.elapsed() < dur / 4 {
                        // SAFETY: the mapping and host buffer hold len + 64 bytes.
                        unsafe { method.run(dir, m.bar, host.p, len, 256) };
                    }
                    barrier.wait();
                    let start = Instant::now();
                    let mut calls = 0u64;
                    while start.elapsed() < dur {
                        // SAFETY: as above.
                        unsafe { method.run(dir, m.bar, host.p, len, 256) };
                        calls += 256;
                    }
                    calls as f64 / start.elapsed().as_secs_f64()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("copy thread") as u64).sum()
    });
    total as f64
}

/// Rounds of the whole thread-count sweep per cell: each cell is the median of its rounds, so one
/// disturbed run (a neighbour on the host, a frequency change) moves no figure by itself.
const SCALING_ROUNDS: usize = 3;

/// Copies from several threads, each through its own mapping and pinned to its own CPU: total
/// calls/s and the speed-up over one thread, for our public call and for the dispatcher alone (the
/// engines' own scaling).
pub(crate) fn scaling(ours: &GdrLib, cuda: &Cuda, threads: &[usize], t: &Timing) {
    let most = threads.iter().copied().max().unwrap_or(1);
    let maps: Result<Vec<BarMapping>, String> =
        (0..most).map(|_| device_memory(cuda, 1 << 16).and_then(|d| ours.pin_map(d, 1 << 16))).collect();
    let maps = match maps {
        Ok(m) => m,
        Err(e) => return println!("\n### thread scaling: skipped ({e})"),
    };
    let cpus = allowed_cpus();
    let dur = t.cell_budget * 2;
    println!("\n### thread scaling: each thread copies through its own mapping\n");
    match cpus.len() {
        0 => println!("threads not pinned (sched_getaffinity failed)"),
        c if c < most => println!("{c} CPUs allowed for {most} threads: some threads share a CPU (pinned round-robin)"),
        _ => println!(
            "one CPU per thread: CPUs {}",
            cpus[..most].iter().map(|c| c.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
    println!(
        "cell: million calls/s, all threads together (speed-up over 1 thread); median of {SCALING_ROUNDS} rounds of \
         the sweep, {dur:?} per run after a warm-up\n"
    );
    print!("| copy | method |");
    for n in threads {
        print!(" {n} thr |");
    }
    println!();
    println!("|---|---|{}", "---:|".repeat(threads.len()));
    for (dir, len) in [
        (Direction::FromDevice, 8),
        (Direction::ToDevice, 8),
        (Direction::FromDevice, 4096),
        (Direction::ToDevice, 4096),
    ] {
        for public in [true, false] {
            let name = if dir == Direction::ToDevice { "store" } else { "load" };
            print!("| {} {name} | {} |", human(len), if public { "public gdr_copy" } else { "dispatcher" });
            let mut runs = vec![Vec::with_capacity(SCALING_ROUNDS); threads.len()];
            for _ in 0..SCALING_ROUNDS {
                for (k, &n) in threads.iter().enumerate() {
                    runs[k].push(run_threads(&maps, &cpus, n, public, dir, len, dur) / 1e6);
                }
            }
            let medians: Vec<f64> = runs
                .iter_mut()
                .map(|r| {
                    r.sort_by(f64::total_cmp);
                    r[r.len() / 2]
                })
                .collect();
            let base = medians[0] / threads[0].max(1) as f64;
            for r in medians {
                print!(" {r:.1} (x{:.2}) |", r / base);
            }
            println!();
        }
    }
}
