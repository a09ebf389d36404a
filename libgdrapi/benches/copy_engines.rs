//! Copy-engine benchmark: every engine this CPU can run, the dispatcher (`gdr_copy_*`'s path:
//! copy + fence) and plain `memcpy` as the baseline, both directions, 1 B .. 16 MiB.
//!
//! Memory kinds, each used as the "device" side:
//! - ordinary cacheable memory (always);
//! - `cuMemHostAlloc(..., CU_MEMHOSTALLOC_WRITECOMBINED)` memory when `libcuda.so.1` loads and a
//!   device is present (`--no-cuda` skips it);
//! - a GPU BAR mapping made by another libgdrapi given with `--gdrapi PATH` (pin + map of
//!   `cuMemAlloc` memory), where its `gdr_copy_to_mapping`/`gdr_copy_from_mapping` are timed on
//!   the same buffers. That needs `/dev/gdrdrv` or a working dma-buf backend; without them the
//!   comparison is reported as skipped.
//!
//! Output: markdown tables, one per memory kind and direction; each cell is the median GB/s, the
//! p10-p90 spread over the samples, and the ratio to `memcpy` measured in the same run.
//!
//! Run: `cargo bench -p gdrapi --bench copy_engines [-- --quick] [-- --gdrapi /path/libgdrapi.so]`.

use gdrapi::copy::{self, Direction, Engine, MappingKind};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulong, c_void};
use std::hint::black_box;
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------------

struct Opts {
    quick: bool,
    cuda: bool,
    gdrapi: Option<String>,
    max_size: usize,
}

fn usage() -> ! {
    eprintln!(
        "usage: copy_engines [--quick] [--no-cuda] [--max-size BYTES] [--gdrapi PATH/libgdrapi.so]\n\
         \x20 --quick      fewer sizes and samples (a few seconds)\n\
         \x20 --no-cuda    skip the cuMemHostAlloc write-combined memory\n\
         \x20 --max-size   largest copy (default 16 MiB)\n\
         \x20 --gdrapi     another libgdrapi to time on a real BAR mapping (needs gdrdrv or dma-buf)"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let mut o = Opts { quick: false, cuda: true, gdrapi: None, max_size: 16 << 20 };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-cuda" => o.cuda = false,
            "--gdrapi" => o.gdrapi = Some(args.next().unwrap_or_else(|| usage())),
            "--max-size" => o.max_size = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            // `cargo bench` passes `--bench`; a filter-less run ignores it.
            "--bench" => {}
            "-h" | "--help" => usage(),
            _ => {
                eprintln!("unknown argument {a}");
                usage()
            }
        }
    }
    o
}

fn sizes(o: &Opts) -> Vec<usize> {
    let mut v: Vec<usize> = if o.quick {
        (0..=24).step_by(2).map(|s| 1usize << s).collect()
    } else {
        (0..=24).map(|s| 1usize << s).collect()
    };
    let odd: &[usize] = if o.quick { &[63, 4097] } else { &[3, 63, 100, 1000, 4097, 65537, 1_000_003] };
    v.extend_from_slice(odd);
    v.retain(|&s| s <= o.max_size);
    v.sort_unstable();
    v.dedup();
    v
}

// ------------------------------------------------------------------------------------------------
// dlopen (glibc has it in libc proper since 2.34; std links libc)
// ------------------------------------------------------------------------------------------------

const RTLD_NOW: c_int = 2;

unsafe extern "C" {
    fn dlopen(filename: *const c_char, flag: c_int) -> *mut c_void;
    fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    fn dlerror() -> *const c_char;
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated thread-local string valid until the next dl call.
    let p = unsafe { dlerror() };
    if p.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-NULL, NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

struct Lib(*mut c_void);

impl Lib {
    fn open(name: &str) -> Result<Lib, String> {
        let c = CString::new(name).map_err(|_| "NUL in path".to_string())?;
        // SAFETY: c is a valid C string; dlopen has no other preconditions.
        let h = unsafe { dlopen(c.as_ptr(), RTLD_NOW) };
        if h.is_null() { Err(dl_error()) } else { Ok(Lib(h)) }
    }

    /// Resolves `name` as a function pointer of type `F`.
    ///
    /// # Safety
    /// `F` must be an `extern "C"` function pointer type matching the symbol's real signature.
    unsafe fn sym<F: Copy>(&self, name: &str) -> Result<F, String> {
        assert_eq!(size_of::<F>(), size_of::<*mut c_void>());
        let c = CString::new(name).unwrap();
        // SAFETY: self.0 is a live handle from dlopen (never closed); c is a valid C string.
        let p = unsafe { dlsym(self.0, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{name}: {}", dl_error()));
        }
        // SAFETY: same size (asserted); the caller vouches that F is the symbol's type.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) })
    }
}

// ------------------------------------------------------------------------------------------------
// CUDA driver API (only what the benchmark needs)
// ------------------------------------------------------------------------------------------------

type CuResult = c_int;
const CU_MEMHOSTALLOC_WRITECOMBINED: c_uint = 0x4;

struct Cuda {
    mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> CuResult,
    mem_free: unsafe extern "C" fn(u64) -> CuResult,
    host_alloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> CuResult,
    free_host: unsafe extern "C" fn(*mut c_void) -> CuResult,
    desc: String,
}

fn cuda_check(what: &str, r: CuResult) -> Result<(), String> {
    if r == 0 { Ok(()) } else { Err(format!("{what} returned CUresult {r}")) }
}

fn cuda_init() -> Result<Cuda, String> {
    let lib = Lib::open("libcuda.so.1").map_err(|e| format!("libcuda.so.1 not loadable: {e}"))?;
    // SAFETY: every `sym` type below is the CUDA driver API prototype of that symbol, and every
    // driver call gets valid out-pointers to locals.
    unsafe {
        let init: unsafe extern "C" fn(c_uint) -> CuResult = lib.sym("cuInit")?;
        let version: unsafe extern "C" fn(*mut c_int) -> CuResult = lib.sym("cuDriverGetVersion")?;
        let dev_get: unsafe extern "C" fn(*mut c_int, c_int) -> CuResult = lib.sym("cuDeviceGet")?;
        let dev_name: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> CuResult = lib.sym("cuDeviceGetName")?;
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> CuResult = lib.sym("cuDevicePrimaryCtxRetain")?;
        let set_current: unsafe extern "C" fn(*mut c_void) -> CuResult = lib.sym("cuCtxSetCurrent")?;
        let cuda = Cuda {
            mem_alloc: lib.sym("cuMemAlloc_v2")?,
            mem_free: lib.sym("cuMemFree_v2")?,
            host_alloc: lib.sym("cuMemHostAlloc")?,
            free_host: lib.sym("cuMemFreeHost")?,
            desc: String::new(),
        };
        cuda_check("cuInit", init(0))?;
        let mut v = 0;
        cuda_check("cuDriverGetVersion", version(&mut v))?;
        let mut dev = 0;
        cuda_check("cuDeviceGet(0)", dev_get(&mut dev, 0))?;
        let mut name = [0 as c_char; 128];
        cuda_check("cuDeviceGetName", dev_name(name.as_mut_ptr(), name.len() as c_int, dev))?;
        let mut ctx = std::ptr::null_mut();
        cuda_check("cuDevicePrimaryCtxRetain", retain(&mut ctx, dev))?;
        cuda_check("cuCtxSetCurrent", set_current(ctx))?;
        let name = CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned();
        Ok(Cuda { desc: format!("{name}, CUDA driver {}.{}", v / 1000, v % 1000 / 10), ..cuda })
    }
}

// ------------------------------------------------------------------------------------------------
// Another libgdrapi, used through its public C ABI
// ------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy)]
struct GdrMh {
    h: c_ulong,
}

type GdrT = *mut c_void;

struct OtherGdr {
    path: String,
    copy_to: unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int,
    copy_from: unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int,
    mh: GdrMh,
    bar: *mut u8,
    version: String,
}

/// dlopens `path`, pins and maps `len` bytes of fresh `cuMemAlloc` memory through it.
fn other_gdr(path: &str, cuda: Option<&Cuda>, len: usize) -> Result<OtherGdr, String> {
    let lib = Lib::open(path)?;
    // SAFETY: every `sym` type below is the gdrapi.h 2.x prototype of that symbol; the calls get
    // valid out-pointers, and the pinned range lies inside the cuMemAlloc allocation.
    unsafe {
        let runtime_version: unsafe extern "C" fn(*mut c_int, *mut c_int) = lib.sym("gdr_runtime_get_version")?;
        let open: unsafe extern "C" fn() -> GdrT = lib.sym("gdr_open")?;
        let pin: unsafe extern "C" fn(GdrT, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int =
            lib.sym("gdr_pin_buffer")?;
        let map: unsafe extern "C" fn(GdrT, GdrMh, *mut *mut c_void, usize) -> c_int = lib.sym("gdr_map")?;
        let copy_to = lib.sym("gdr_copy_to_mapping")?;
        let copy_from = lib.sym("gdr_copy_from_mapping")?;
        let (mut maj, mut min) = (0, 0);
        runtime_version(&mut maj, &mut min);
        let version = format!("{maj}.{min}");
        let g = open();
        if g.is_null() {
            return Err(format!(
                "gdr_open() returned NULL (libgdrapi {version}): no /dev/gdrdrv and no usable dma-buf \
                 backend (that needs a CUDA >= 13.3 driver); set GDRCOPY_ENABLE_LOGGING=1 for the reason"
            ));
        }
        let cuda = cuda.ok_or("no CUDA device memory to pin (libcuda unavailable or --no-cuda)")?;
        const GPU_PAGE: u64 = 64 << 10;
        let mut d: u64 = 0;
        cuda_check("cuMemAlloc", (cuda.mem_alloc)(&mut d, len + GPU_PAGE as usize))?;
        let aligned = (d + GPU_PAGE - 1) & !(GPU_PAGE - 1);
        let mut mh = GdrMh { h: 0 };
        let r = pin(g, aligned as c_ulong, len, 0, 0, &mut mh);
        if r != 0 {
            (cuda.mem_free)(d);
            return Err(format!("gdr_pin_buffer returned {r}"));
        }
        let mut va = std::ptr::null_mut();
        let r = map(g, mh, &mut va, len);
        if r != 0 {
            return Err(format!("gdr_map returned {r}"));
        }
        // The library stays loaded (Lib never dlcloses); the handle, mapping and device memory
        // live until the process exits.
        Ok(OtherGdr { path: path.into(), copy_to, copy_from, mh, bar: va.cast(), version })
    }
}

// ------------------------------------------------------------------------------------------------
// Buffers
// ------------------------------------------------------------------------------------------------

/// Ordinary page-aligned heap memory, freed on drop.
struct Heap {
    p: *mut u8,
    layout: std::alloc::Layout,
}

impl Heap {
    fn new(len: usize) -> Heap {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).unwrap();
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc(layout) };
        assert!(!p.is_null(), "out of memory");
        // SAFETY: p is valid for layout.size() bytes; touch every page so first-touch faults are
        // not timed.
        unsafe { std::ptr::write_bytes(p, 0x5a, layout.size()) };
        Heap { p, layout }
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.p, self.layout) }
    }
}

// ------------------------------------------------------------------------------------------------
// Methods and timing
// ------------------------------------------------------------------------------------------------

#[derive(Clone)]
enum Method {
    Memcpy,
    /// The dispatcher for WC plus the caller's store fence, with extra device/host offsets.
    Dispatch {
        dev_off: usize,
        host_off: usize,
    },
    Engine(Engine),
    Other(std::rc::Rc<OtherGdr>),
}

impl Method {
    fn name(&self) -> String {
        match self {
            Method::Memcpy => "memcpy".into(),
            Method::Dispatch { dev_off: 0, host_off: 0 } => "dispatch".into(),
            Method::Dispatch { dev_off, host_off } => format!("dispatch dev+{dev_off} host+{host_off}"),
            Method::Engine(e) => format!("{}{}", e.name, if e.selected { "*" } else { "" }),
            Method::Other(o) => format!("other gdr_copy ({})", o.version),
        }
    }

    fn usable(&self, len: usize) -> bool {
        match self {
            Method::Engine(e) => len.is_multiple_of(e.width),
            _ => true,
        }
    }

    /// One call, as a library user would make it (copy, then the fence `gdr_copy_*` issues).
    ///
    /// # Safety
    /// `dev` and `host` are valid for `len` + 64 bytes, disjoint, and page aligned.
    #[inline(never)]
    unsafe fn call(&self, dir: Direction, dev: *mut u8, host: *mut u8, len: usize) {
        let (dev, host) = (black_box(dev), black_box(host));
        // SAFETY: forwarded contract; engines are only called with `usable` lengths on page-aligned
        // device pointers; the offsets of Dispatch stay inside the 64 bytes of slack.
        unsafe {
            match (self, dir) {
                (Method::Memcpy, Direction::ToDevice) => std::ptr::copy_nonoverlapping(host, dev, len),
                (Method::Memcpy, Direction::FromDevice) => std::ptr::copy_nonoverlapping(dev, host, len),
                (Method::Dispatch { dev_off, host_off }, Direction::ToDevice) => {
                    copy::copy_to_mapping(MappingKind::WriteCombined, dev.add(*dev_off), host.add(*host_off), len);
                    copy::store_fence();
                }
                (Method::Dispatch { dev_off, host_off }, Direction::FromDevice) => {
                    copy::copy_from_mapping(MappingKind::WriteCombined, host.add(*host_off), dev.add(*dev_off), len);
                    copy::store_fence();
                }
                (Method::Engine(e), Direction::ToDevice) => {
                    (e.f)(dev, host, len);
                    copy::store_fence();
                }
                (Method::Engine(e), Direction::FromDevice) => {
                    (e.f)(host, dev, len);
                    copy::store_fence();
                }
                (Method::Other(o), Direction::ToDevice) => {
                    (o.copy_to)(o.mh, dev.cast(), host.cast(), len);
                }
                (Method::Other(o), Direction::FromDevice) => {
                    (o.copy_from)(o.mh, host.cast(), dev.cast(), len);
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Stat {
    med: f64,
    p10: f64,
    p90: f64,
}

struct Timing {
    sample: Duration,
    samples: usize,
    cell_budget: Duration,
}

/// GB/s samples of `m` at `len`: each sample repeats the call enough times to last `t.sample`.
fn measure(m: &Method, dir: Direction, dev: *mut u8, host: *mut u8, len: usize, t: &Timing) -> Stat {
    let once = || {
        let s = Instant::now();
        // SAFETY: the caller passes buffers sized for the largest length + slack.
        unsafe { m.call(dir, dev, host, len) };
        s.elapsed()
    };
    once(); // warm-up: page in, fill caches/TLB, resolve lazily bound symbols
    let single = once().max(Duration::from_nanos(20));
    let iters = (t.sample.as_nanos() / single.as_nanos()).clamp(1, 1 << 24) as usize;
    let per_sample = single * iters as u32;
    let samples = if per_sample * t.samples as u32 > t.cell_budget {
        (t.cell_budget.as_nanos() / per_sample.as_nanos().max(1)).clamp(3, t.samples as u128) as usize
    } else {
        t.samples
    };
    let mut gbs: Vec<f64> = (0..samples)
        .map(|_| {
            let s = Instant::now();
            for _ in 0..iters {
                // SAFETY: as in `once`.
                unsafe { m.call(dir, dev, host, len) };
            }
            (len * iters) as f64 / s.elapsed().as_nanos().max(1) as f64
        })
        .collect();
    gbs.sort_by(f64::total_cmp);
    let pick = |q: f64| gbs[((gbs.len() - 1) as f64 * q).round() as usize];
    Stat { med: pick(0.5), p10: pick(0.1), p90: pick(0.9) }
}

fn human(n: usize) -> String {
    if n >= 1 << 20 && n.is_multiple_of(1 << 20) {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n.is_multiple_of(1 << 10) {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

fn table(title: &str, methods: &[Method], dir: Direction, dev: *mut u8, host: *mut u8, sizes: &[usize], t: &Timing) {
    println!("\n### {title}\n");
    println!("cell: median GB/s (p10-p90) and ratio to memcpy's median; * = selected by the dispatcher\n");
    print!("| size |");
    for m in methods {
        print!(" {} |", m.name());
    }
    println!();
    print!("|---:|");
    for _ in methods {
        print!("---:|");
    }
    println!();
    for &len in sizes {
        print!("| {} |", human(len));
        let mut base = None;
        for m in methods {
            if !m.usable(len) {
                print!(" - |");
                continue;
            }
            let s = measure(m, dir, dev, host, len, t);
            if matches!(m, Method::Memcpy) {
                base = Some(s.med);
            }
            let ratio = base.map(|b| format!(" x{:.2}", s.med / b)).unwrap_or_default();
            print!(" {:.2} ({:.2}-{:.2}){} |", s.med, s.p10, s.p90, ratio);
        }
        println!();
    }
}

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
        Timing { sample: Duration::from_micros(200), samples: 5, cell_budget: Duration::from_millis(20) }
    } else {
        Timing { sample: Duration::from_micros(2500), samples: 15, cell_budget: Duration::from_millis(150) }
    };
    let started = Instant::now();
    let engines = copy::engines();

    println!("# copy-engine benchmark\n");
    println!("- date: {}", utc_now());
    println!("- cpu: {} ({} logical CPUs)", cpu_model(), std::thread::available_parallelism().map_or(0, |n| n.get()));
    println!("- selection: {}", copy::detect());
    println!(
        "- method: single thread, device buffer page aligned (plus one misaligned dispatcher column), \
         {} samples of >= {:?} each, copy + SFENCE per call for engines and dispatcher, none for memcpy",
        timing.samples, timing.sample
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
    let other = o.gdrapi.as_deref().map(|p| other_gdr(p, cuda.as_ref(), max + 4096));
    match &other {
        Some(Ok(g)) => println!("- other libgdrapi: {} (version {}), BAR mapping at {:p}", g.path, g.version, g.bar),
        Some(Err(e)) => println!("- other libgdrapi: comparison skipped: {e}"),
        None => println!("- other libgdrapi: not requested (--gdrapi PATH)"),
    }

    let slack = 4096;
    let host = Heap::new(max + slack);
    let mut memories: Vec<(String, *mut u8, Option<std::rc::Rc<OtherGdr>>)> = Vec::new();
    let ordinary = Heap::new(max + slack);
    memories.push(("ordinary memory".into(), ordinary.p, None));
    let mut wc_ptr = std::ptr::null_mut();
    if let Some(c) = &cuda {
        // SAFETY: valid out-pointer; size as requested.
        let r = unsafe { (c.host_alloc)(&mut wc_ptr, max + slack, CU_MEMHOSTALLOC_WRITECOMBINED) };
        if r == 0 && !wc_ptr.is_null() {
            // SAFETY: the allocation is max + slack bytes; fault it in before timing.
            unsafe { std::ptr::write_bytes(wc_ptr.cast::<u8>(), 0x5a, max + slack) };
            memories.push(("cuMemHostAlloc WRITECOMBINED memory".into(), wc_ptr.cast(), None));
        } else {
            println!("- cuMemHostAlloc(WRITECOMBINED) failed: CUresult {r}");
            wc_ptr = std::ptr::null_mut();
        }
    }
    if let Some(Ok(g)) = other {
        let g = std::rc::Rc::new(g);
        memories.push((format!("GPU BAR mapped by {}", g.path), g.bar, Some(g.clone())));
    }

    for (mem, dev, other) in &memories {
        for dir in [Direction::ToDevice, Direction::FromDevice] {
            let mut methods = vec![
                Method::Memcpy,
                Method::Dispatch { dev_off: 0, host_off: 0 },
                Method::Dispatch { dev_off: 7, host_off: 3 },
            ];
            methods.extend(engines.iter().filter(|e| e.dir == dir).map(|e| Method::Engine(*e)));
            if let Some(g) = other {
                methods.push(Method::Other(g.clone()));
            }
            let what = match dir {
                Direction::ToDevice => "host -> device (stores to the mapping)",
                Direction::FromDevice => "device -> host (loads from the mapping)",
            };
            table(&format!("{mem}: {what}"), &methods, dir, *dev, host.p, &sizes, &timing);
        }
    }
    if let Some(c) = cuda.as_ref().filter(|_| !wc_ptr.is_null()) {
        // SAFETY: allocated by cuMemHostAlloc above, no longer used.
        unsafe { (c.free_host)(wc_ptr) };
    }
    println!("\ntotal time: {:.1} s", started.elapsed().as_secs_f64());
}
