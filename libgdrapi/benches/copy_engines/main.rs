//! Copy-engine benchmark: every engine this CPU can run, the dispatcher (`gdr_copy_*`'s path:
//! copy + fence) and plain `memcpy` as the baseline, both directions, 1 B .. 16 MiB.
//!
//! Memory kinds, each used as the "device" side:
//! - ordinary cacheable memory (always);
//! - `cuMemHostAlloc(..., CU_MEMHOSTALLOC_WRITECOMBINED)` memory when `libcuda.so.1` loads and a
//!   device is present (`--no-cuda` skips it);
//! - a GPU BAR mapping of `cuMemAlloc` memory made by **our own** `libgdrapi.so` (loaded with
//!   dlopen, as a C consumer would), where our public `gdr_copy_to_mapping`/`gdr_copy_from_mapping`
//!   are timed through the exported C functions next to the dispatcher and the engines on the same
//!   mapping; with `--gdrapi PATH` another libgdrapi (upstream's) pins and maps the same device
//!   memory and its public calls are timed too. That needs `/dev/gdrdrv` or a working dma-buf
//!   backend; without them the BAR tables are reported as skipped.
//!
//! Output: markdown tables, one per memory kind and direction; each cell is the median GB/s, the
//! p10-p90 spread over the samples, and the ratio to `memcpy` measured in the same run. After each
//! BAR table, one summary line per size: nanoseconds per call of our public call, the dispatcher
//! and the other library, and the ratios public/dispatcher and public/other; paired differences
//! (alternating blocks, `--pairs N` of them) with the median's 95% confidence interval for
//! public-dispatcher, public-other, misaligned-aligned public (with its time ratio) and the
//! misaligned public calls of both libraries; then one `bar` line per direction with the largest
//! paired public-dispatcher differences (inlined and behind a C call) and misaligned/aligned
//! public time ratio of the run, each with its size. `--threads 1,2,4,8`
//! adds a scaling table: each thread copies through its own mapping.
//!
//! Run: `cargo bench -p gdrapi --features bench-internals --bench copy_engines [-- --quick]
//! [-- --gdrapi /path/libgdrapi.so] [-- --threads 1,2,4,8]`.

mod cuda;
mod dl;
mod gdrlib;
mod heap;
mod method;
mod opts;
mod report;
mod scaling;
mod timing;

use std::time::{Duration, Instant};

use gdrapi::copy::{self, Direction};

use crate::cuda::{CU_MEMHOSTALLOC_WRITECOMBINED, cuda_init, device_memory};
use crate::gdrlib::{BarMapping, GdrLib, linked_mapping, our_library};
use crate::heap::Heap;
use crate::method::Method;
use crate::opts::{parse_opts, sizes};
use crate::report::{MIS_DEV, MIS_HOST, MISALIGNED_OTHER, MISALIGNED_PUBLIC, summary, table};
use crate::scaling::scaling;
use crate::timing::{PairedOn, Timing};

// ------------------------------------------------------------------------------------------------
// Report header
// ------------------------------------------------------------------------------------------------

/// UTC date from the Unix clock (days-to-civil conversion; std has no calendar).
fn utc_now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = ((secs / 86400) as i64, secs % 86400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02} UTC", rem / 3600, rem % 3600 / 60)
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string())
}

fn main() {
    let o = parse_opts();
    let sizes = sizes(&o);
    let max = *sizes.last().unwrap_or(&1);
    let timing = if o.quick {
        Timing { sample: Duration::from_micros(200), samples: 5, cell_budget: Duration::from_millis(20), pairs: 10 }
    } else {
        Timing { sample: Duration::from_micros(2500), samples: 15, cell_budget: Duration::from_millis(150), pairs: 30 }
    };
    let timing = Timing { pairs: o.pairs.unwrap_or(timing.pairs), ..timing };
    let started = Instant::now();
    let engines = copy::engines();

    println!("# copy-engine benchmark\n");
    println!("- date: {}", utc_now());
    println!("- cpu: {} ({} logical CPUs)", cpu_model(), std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!("- selection: {}", copy::detect());
    println!(
        "- method: single thread, device buffer page aligned (plus two misaligned dispatcher columns), \
         {} samples of >= {:?} each, copy + SFENCE per call for engines and dispatcher, none for memcpy; \
         summaries: {} alternating block pairs per paired difference",
        timing.samples, timing.sample, timing.pairs
    );

    let cuda = if o.cuda {
        match cuda_init() {
            Ok(c) => {
                println!("- CUDA: {}", c.desc);
                Some(c)
            }
            Err(e) => {
                println!("- CUDA write-combined memory: skipped ({e})");
                None
            }
        }
    } else {
        println!("- CUDA write-combined memory: skipped (--no-cuda)");
        None
    };
    // The BAR: device memory pinned and mapped by our library (dispatcher, engines and our public
    // calls use that mapping) and, with --gdrapi, by the other library too.
    let bar_len = max + 4096;
    let ours = match (our_library(&o), &cuda) {
        (None, _) => Err("our libgdrapi.so was not found next to the benchmark (--ours PATH)".to_string()),
        (_, None) => Err("no CUDA device memory to pin (libcuda unavailable or --no-cuda)".to_string()),
        (Some(path), Some(c)) => GdrLib::open(&path).and_then(|lib| {
            let dptr = device_memory(c, bar_len)?;
            let m = lib.pin_map(dptr, bar_len)?;
            Ok((lib, dptr, m))
        }),
    };
    // The same public functions, statically linked into this benchmark (no dlopen, no PLT/GOT, no
    // TLS descriptors): tells what the shared-library boundary itself costs.
    let linked = match (&ours, &cuda) {
        (Ok((_, dptr, _)), Some(_)) => linked_mapping(*dptr, bar_len),
        _ => Err("no device memory".into()),
    };
    let other = match (&ours, o.gdrapi.as_deref()) {
        (_, None) => None,
        (Err(e), Some(_)) => Some(Err(format!("needs our mapping first: {e}"))),
        (Ok((_, dptr, _)), Some(path)) => {
            Some(GdrLib::open(path).and_then(|lib| Ok((lib.pin_map(*dptr, bar_len)?, lib.path, lib.version))))
        }
    };
    match &ours {
        Ok((lib, _, m)) => {
            println!("- our libgdrapi: {} (version {}), BAR mapping at {:p}", lib.path, lib.version, m.bar)
        }
        Err(e) => println!("- our libgdrapi: BAR tables skipped: {e}"),
    }
    match &other {
        Some(Ok((m, path, version))) => {
            println!("- other libgdrapi: {path} (version {version}), same device memory mapped at {:p}", m.bar)
        }
        Some(Err(e)) => println!("- other libgdrapi: comparison skipped: {e}"),
        None => println!("- other libgdrapi: not requested (--gdrapi PATH)"),
    }
    // A comparison asked for that cannot run fails the run: timings without it would read as a
    // comparison (on the GPU machine upstream's gdr_open returned NULL and a verdict followed).
    if matches!(other, Some(Err(_))) {
        eprintln!("copy_engines: the --gdrapi comparison cannot run (see the line above)");
        std::process::exit(1);
    }

    let slack = 4096;
    let host = Heap::new(max + slack + o.host_offset.next_multiple_of(64));
    // SAFETY: inside the allocation (sized with the offset above).
    let host_p = unsafe { host.p.add(o.host_offset) };
    let mut memories: Vec<(String, *mut u8, bool)> = Vec::new();
    let ordinary = Heap::new(max + slack);
    memories.push(("ordinary memory".into(), ordinary.p, false));
    let mut wc_ptr = std::ptr::null_mut();
    if let Some(c) = &cuda {
        // SAFETY: valid out-pointer; size as requested.
        let r = unsafe { (c.host_alloc)(&mut wc_ptr, max + slack, CU_MEMHOSTALLOC_WRITECOMBINED) };
        if r == 0 && !wc_ptr.is_null() {
            // SAFETY: the allocation is max + slack bytes; fault it in before timing.
            unsafe { std::ptr::write_bytes(wc_ptr.cast::<u8>(), 0x5a, max + slack) };
            memories.push(("cuMemHostAlloc WRITECOMBINED memory".into(), wc_ptr.cast(), false));
        } else {
            println!("- cuMemHostAlloc(WRITECOMBINED) failed: CUresult {r}");
            wc_ptr = std::ptr::null_mut();
        }
    }
    if let Ok((lib, _, m)) = &ours {
        memories.push((format!("GPU BAR mapped by {}", lib.path), m.bar, true));
    }

    if o.bar_only {
        memories.retain(|(_, _, is_bar)| *is_bar);
    }
    for (mem, dev, is_bar) in &memories {
        for dir in [Direction::ToDevice, Direction::FromDevice] {
            let mut methods = vec![
                Method::Memcpy,
                Method::Dispatch { dev_off: 0, host_off: 0 },
                Method::Dispatch { dev_off: MIS_DEV, host_off: MIS_HOST },
                // Same device misalignment, host misaligned alike: after the device head the
                // middle's host accesses are aligned, which separates the cost of the device side
                // from that of split host stores.
                Method::Dispatch { dev_off: MIS_DEV, host_off: MIS_DEV },
                Method::DispatchCalled,
            ];
            methods.extend(engines.iter().filter(|e| e.dir == dir).map(|e| Method::Engine(*e)));
            if *is_bar {
                let public = |label: String, m: &BarMapping| Method::Public { label, m: *m, dev_off: 0, host_off: 0 };
                // The misaligned public call, as users make it (the dispatcher's misaligned offsets).
                let misaligned = |label: String, m: &BarMapping| Method::Public {
                    label,
                    m: *m,
                    dev_off: MIS_DEV,
                    host_off: MIS_HOST,
                };
                if let Ok((lib, _, m)) = &ours {
                    methods.push(public(format!("public gdr_copy (ours {})", lib.version), m));
                    methods.push(misaligned(format!("{MISALIGNED_PUBLIC} (ours {})", lib.version), m));
                }
                if let Ok(m) = &linked {
                    methods.push(public("public gdr_copy (ours, linked)".into(), m));
                }
                if let Some(Ok((m, _, version))) = &other {
                    methods.push(public(format!("other gdr_copy ({version})"), m));
                    methods.push(misaligned(format!("{MISALIGNED_OTHER} ({version})"), m));
                }
            }
            let what = match dir {
                Direction::ToDevice => "host -> device (stores to the mapping)",
                Direction::FromDevice => "device -> host (loads from the mapping)",
            };
            let rows = table(&format!("{mem}: {what}"), &methods, dir, *dev, host_p, &sizes, &timing);
            let short = if dir == Direction::ToDevice { "stores" } else { "loads" };
            summary(short, &methods, &rows, &PairedOn { dir, dev: *dev, host: host_p, t: &timing });
        }
    }
    if !o.threads.is_empty() {
        match (&ours, &cuda) {
            (Ok((lib, _, _)), Some(c)) => scaling(lib, c, &o.threads, &timing),
            _ => println!("\n### thread scaling: skipped (no BAR mapping through our library)"),
        }
    }
    if let Some(c) = cuda.as_ref().filter(|_| !wc_ptr.is_null()) {
        // SAFETY: allocated by cuMemHostAlloc above, no longer used.
        unsafe { (c.free_host)(wc_ptr) };
    }
    println!("\ntotal time: {:.1} s", started.elapsed().as_secs_f64());
}
