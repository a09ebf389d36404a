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

use gdrapi::copy::{self, Direction, Engine, MappingKind};
use std::ffi::{CStr, CString, c_char, c_int, c_uint, c_ulong, c_void};
use std::time::{Duration, Instant};

// ------------------------------------------------------------------------------------------------
// Options
// ------------------------------------------------------------------------------------------------

struct Opts {
    quick: bool,
    cuda: bool,
    gdrapi: Option<String>,
    ours: Option<String>,
    threads: Vec<usize>,
    bar_only: bool,
    host_offset: usize,
    max_size: usize,
    pairs: Option<usize>,
}

fn usage() -> ! {
    eprintln!(
        "usage: copy_engines [--quick] [--no-cuda] [--max-size BYTES] [--ours PATH] [--gdrapi PATH] [--threads N,..] [--bar-only]\n\
         \x20 --quick      fewer sizes and samples (a few seconds)\n\
         \x20 --no-cuda    skip libcuda (no write-combined memory, no BAR mapping)\n\
         \x20 --max-size   largest copy (default 16 MiB)\n\
         \x20 --ours       our libgdrapi.so (default: the one built next to this benchmark)\n\
         \x20 --gdrapi     another libgdrapi to time on the same device memory (needs gdrdrv or dma-buf)\n\
         \x20 --threads    thread counts for the scaling table, e.g. 1,2,4,8\n\
         \x20 --bar-only   only the BAR tables (and the scaling table)\n\
         \x20 --host-offset  bytes between a page boundary and the host buffer (default 0)\n\
         \x20 --pairs N  block pairs per paired difference in the summaries (default 30; 10 with --quick)"
    );
    std::process::exit(2)
}

fn parse_opts() -> Opts {
    let mut o = Opts {
        quick: false,
        cuda: true,
        gdrapi: None,
        ours: None,
        threads: Vec::new(),
        bar_only: false,
        host_offset: 0,
        max_size: 16 << 20,
        pairs: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-cuda" => o.cuda = false,
            "--bar-only" => o.bar_only = true,
            "--host-offset" => o.host_offset = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            "--gdrapi" => o.gdrapi = Some(args.next().unwrap_or_else(|| usage())),
            "--ours" => o.ours = Some(args.next().unwrap_or_else(|| usage())),
            "--threads" => {
                let list = args.next().unwrap_or_else(|| usage());
                o.threads = list.split(',').map(|t| t.parse().unwrap_or_else(|_| usage())).collect();
            }
            "--pairs" => {
                o.pairs = Some(args.next().and_then(|s| s.parse().ok()).filter(|&n| n >= 2).unwrap_or_else(|| usage()))
            }
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
// A libgdrapi (ours or another), used through its public C ABI
// ------------------------------------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy)]
struct GdrMh {
    h: c_ulong,
}

type GdrT = *mut c_void;
type CopyFn = unsafe extern "C" fn(GdrMh, *mut c_void, *const c_void, usize) -> c_int;

/// A dlopened libgdrapi with one open instance.
struct GdrLib {
    path: String,
    version: String,
    g: GdrT,
    pin: unsafe extern "C" fn(GdrT, c_ulong, usize, u64, u32, *mut GdrMh) -> c_int,
    map: unsafe extern "C" fn(GdrT, GdrMh, *mut *mut c_void, usize) -> c_int,
    copy_to: CopyFn,
    copy_from: CopyFn,
}

/// A pinned and mapped range, through one library. Lives until the process exits.
#[derive(Clone, Copy)]
struct BarMapping {
    copy_to: CopyFn,
    copy_from: CopyFn,
    mh: GdrMh,
    bar: *mut u8,
}

// SAFETY: the mapping is plain shared memory plus function pointers of a thread-safe library.
unsafe impl Send for BarMapping {}

impl GdrLib {
    /// dlopens `path` and opens an instance.
    fn open(path: &str) -> Result<GdrLib, String> {
        let lib = Lib::open(path)?;
        // SAFETY: every `sym` type below is the gdrapi.h 2.x prototype of that symbol; the calls get
        // valid out-pointers. The library stays loaded (Lib never dlcloses).
        unsafe {
            let runtime_version: unsafe extern "C" fn(*mut c_int, *mut c_int) = lib.sym("gdr_runtime_get_version")?;
            let open: unsafe extern "C" fn() -> GdrT = lib.sym("gdr_open")?;
            let (mut maj, mut min) = (0, 0);
            runtime_version(&mut maj, &mut min);
            let version = format!("{maj}.{min}");
            let g = open();
            if g.is_null() {
                return Err(format!(
                    "gdr_open() of {path} returned NULL (libgdrapi {version}): no /dev/gdrdrv and no usable \
                     dma-buf backend (that needs a CUDA >= 13.3 driver); set GDRCOPY_ENABLE_LOGGING=1 for the reason"
                ));
            }
            Ok(GdrLib {
                path: path.into(),
                version,
                g,
                pin: lib.sym("gdr_pin_buffer")?,
                map: lib.sym("gdr_map")?,
                copy_to: lib.sym("gdr_copy_to_mapping")?,
                copy_from: lib.sym("gdr_copy_from_mapping")?,
            })
        }
    }

    /// Pins and maps `[dptr, dptr + len)` (64 KiB aligned device memory).
    fn pin_map(&self, dptr: u64, len: usize) -> Result<BarMapping, String> {
        let mut mh = GdrMh { h: 0 };
        // SAFETY: valid out-pointers; the range lies inside the caller's cuMemAlloc allocation.
        let r = unsafe { (self.pin)(self.g, dptr as c_ulong, len, 0, 0, &mut mh) };
        if r != 0 {
            return Err(format!("gdr_pin_buffer of {} returned {r}", self.path));
        }
        let mut va = std::ptr::null_mut();
        // SAFETY: as above.
        let r = unsafe { (self.map)(self.g, mh, &mut va, len) };
        if r != 0 {
            return Err(format!("gdr_map of {} returned {r}", self.path));
        }
        Ok(BarMapping { copy_to: self.copy_to, copy_from: self.copy_from, mh, bar: va.cast() })
    }
}

const GPU_PAGE: u64 = 64 << 10;

/// Device memory of at least `len` bytes, 64 KiB aligned; never freed (lives with the process).
fn device_memory(cuda: &Cuda, len: usize) -> Result<u64, String> {
    let mut d: u64 = 0;
    // SAFETY: valid out-pointer.
    cuda_check("cuMemAlloc", unsafe { (cuda.mem_alloc)(&mut d, len + GPU_PAGE as usize) })?;
    Ok((d + GPU_PAGE - 1) & !(GPU_PAGE - 1))
}

/// Pins and maps through our statically linked C functions (see `linked` in `main`).
fn linked_mapping(dptr: u64, len: usize) -> Result<BarMapping, String> {
    use gdrapi::capi;
    // SAFETY: the gdrapi.h contract: valid out-pointers, a range inside a device allocation.
    unsafe {
        let g = capi::gdr_open();
        if g.is_null() {
            return Err("gdr_open (linked) returned NULL".into());
        }
        let mut mh = gdrapi::abi::GdrMh { h: 0 };
        let r = capi::gdr_pin_buffer(g, dptr as c_ulong, len, 0, 0, &mut mh);
        if r != 0 {
            return Err(format!("gdr_pin_buffer (linked) returned {r}"));
        }
        let mut va = std::ptr::null_mut();
        let r = capi::gdr_map(g, mh, &mut va, len);
        if r != 0 {
            return Err(format!("gdr_map (linked) returned {r}"));
        }
        let to: CopyFn = std::mem::transmute::<
            unsafe extern "C" fn(gdrapi::abi::GdrMh, *mut c_void, *const c_void, usize) -> c_int,
            CopyFn,
        >(capi::gdr_copy_to_mapping as _);
        let from: CopyFn = std::mem::transmute::<
            unsafe extern "C" fn(gdrapi::abi::GdrMh, *mut c_void, *const c_void, usize) -> c_int,
            CopyFn,
        >(capi::gdr_copy_from_mapping as _);
        Ok(BarMapping { copy_to: to, copy_from: from, mh: GdrMh { h: mh.h }, bar: va.cast() })
    }
}

/// Our own cdylib: `--ours`, else `libgdrapi.so` in the profile directory of this benchmark.
fn our_library(o: &Opts) -> Option<String> {
    if let Some(p) = &o.ours {
        return Some(p.clone());
    }
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libgdrapi.so");
    lib.exists().then(|| lib.to_string_lossy().into_owned())
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
    /// The dispatcher and its fence behind a C call shaped like `gdr_copy_*` (four arguments,
    /// through a function pointer): the call boundary a C caller pays, without the public call's
    /// checks, so public minus this is what the library's own layer costs.
    DispatchCalled,
    /// A library's public `gdr_copy_*` on its own mapping of the same device memory, with extra
    /// device/host offsets (0, 0 but for the misaligned column of ours).
    Public {
        label: String,
        m: BarMapping,
        dev_off: usize,
        host_off: usize,
    },
}

impl Method {
    fn name(&self) -> String {
        match self {
            Method::Memcpy => "memcpy".into(),
            Method::Dispatch { dev_off: 0, host_off: 0 } => "dispatch".into(),
            Method::Dispatch { dev_off, host_off } => format!("dispatch dev+{dev_off} host+{host_off}"),
            Method::Engine(e) => format!("{}{}", e.name, if e.selected { "*" } else { "" }),
            Method::DispatchCalled => "dispatch (C call)".into(),
            Method::Public { label, .. } => label.clone(),
        }
    }

    fn usable(&self, len: usize) -> bool {
        match self {
            Method::Engine(e) => len.is_multiple_of(e.width),
            _ => true,
        }
    }

    /// `iters` calls, as a library user makes them in a loop (copy, then the fence `gdr_copy_*`
    /// issues). The method is chosen once, outside the loop, so each loop holds nothing but its
    /// own copy: the dispatcher inlined, the engines and C-call columns one call each, like a C
    /// consumer's loop around `gdr_copy_*` (public_copy_floor.c has the same shape). Pointers and
    /// length pass through [`opaque`] every iteration, so no check can be hoisted out of a loop.
    ///
    /// # Safety
    /// `dev` and `host` are valid for `len` + 64 bytes, disjoint, and page aligned.
    #[inline(never)]
    unsafe fn run(&self, dir: Direction, dev: *mut u8, host: *mut u8, len: usize, iters: usize) {
        // Every unsafe block below: the forwarded contract; engines are only called with `usable`
        // lengths on page-aligned device pointers; the offsets of Dispatch stay inside the 64
        // bytes of slack.
        match (self, dir) {
            (Method::Memcpy, Direction::ToDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { std::ptr::copy_nonoverlapping(opaque(host), opaque(dev), opaque(len)) };
                }
            }
            (Method::Memcpy, Direction::FromDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { std::ptr::copy_nonoverlapping(opaque(dev), opaque(host), opaque(len)) };
                }
            }
            (Method::Dispatch { dev_off, host_off }, Direction::ToDevice) => {
                // SAFETY: as said at the top of `run`.
                let (dev, host) = unsafe { (dev.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe {
                        copy::copy_to_mapping(MappingKind::WriteCombined, opaque(dev), opaque(host), opaque(len))
                    };
                    copy::store_fence();
                }
            }
            (Method::Dispatch { dev_off, host_off }, Direction::FromDevice) => {
                // SAFETY: as said at the top of `run`.
                let (dev, host) = unsafe { (dev.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe {
                        copy::copy_from_mapping(MappingKind::WriteCombined, opaque(host), opaque(dev), opaque(len))
                    };
                    copy::store_fence();
                }
            }
            (Method::Engine(e), Direction::ToDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (e.f)(opaque(dev), opaque(host), opaque(len)) };
                    copy::store_fence();
                }
            }
            (Method::Engine(e), Direction::FromDevice) => {
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (e.f)(opaque(host), opaque(dev), opaque(len)) };
                    copy::store_fence();
                }
            }
            (Method::DispatchCalled, Direction::ToDevice) => {
                let f = dispatch_called().0;
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { f(GdrMh { h: 0 }, opaque(dev).cast(), opaque(host).cast(), opaque(len)) };
                }
            }
            (Method::DispatchCalled, Direction::FromDevice) => {
                let f = dispatch_called().1;
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { f(GdrMh { h: 0 }, opaque(host).cast(), opaque(dev).cast(), opaque(len)) };
                }
            }
            // `dev` is our mapping; the library copies at the same offset of its own mapping.
            (Method::Public { m, dev_off, host_off, .. }, Direction::ToDevice) => {
                // SAFETY: as said at the top of `run`.
                let (bar, host) = unsafe { (m.bar.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (m.copy_to)(m.mh, opaque(bar).cast(), opaque(host).cast(), opaque(len)) };
                }
            }
            (Method::Public { m, dev_off, host_off, .. }, Direction::FromDevice) => {
                // SAFETY: as said at the top of `run`.
                let (bar, host) = unsafe { (m.bar.add(*dev_off), host.add(*host_off)) };
                for _ in 0..iters {
                    // SAFETY: as said at the top of `run`.
                    unsafe { (m.copy_from)(m.mh, opaque(host).cast(), opaque(bar).cast(), opaque(len)) };
                }
            }
        }
    }
}

/// `x`, unknown to the optimiser, in a register (`black_box` would go through the stack): each
/// iteration of a timing loop then works on a value the compiler cannot prove loop-invariant.
#[inline(always)]
fn opaque<T: OpaqueWord>(x: T) -> T {
    x.opaque()
}

/// Values [`opaque`] takes: one machine word.
trait OpaqueWord: Copy {
    fn opaque(self) -> Self;
}

impl OpaqueWord for usize {
    #[inline(always)]
    fn opaque(self) -> usize {
        let mut x = self;
        // SAFETY: an empty template: the register is declared read and written, nothing else.
        unsafe { std::arch::asm!("/* {0} */", inout(reg) x, options(nomem, nostack, preserves_flags)) };
        x
    }
}

impl<T> OpaqueWord for *mut T {
    #[inline(always)]
    fn opaque(self) -> *mut T {
        (self as usize).opaque() as *mut T
    }
}

impl<T> OpaqueWord for *const T {
    #[inline(always)]
    fn opaque(self) -> *const T {
        (self as usize).opaque() as *const T
    }
}

/// The dispatcher behind [`CopyFn`]s.
static DISPATCH_CALLED: (CopyFn, CopyFn) = (dispatch_to_called, dispatch_from_called);

/// [`DISPATCH_CALLED`], loaded so that the compiler cannot see the functions: every call is then
/// indirect, through a pointer read from memory, as the public columns' calls are.
#[inline(always)]
fn dispatch_called() -> (CopyFn, CopyFn) {
    // SAFETY: a valid, aligned static.
    unsafe { std::ptr::read_volatile(&DISPATCH_CALLED) }
}

/// The dispatcher for WC plus the store fence, called as `gdr_copy_to_mapping` is.
///
/// # Safety
/// As `Method::run`.
#[inline(never)]
unsafe extern "C" fn dispatch_to_called(_h: GdrMh, dev: *mut c_void, host: *const c_void, n: usize) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { copy::copy_to_mapping(MappingKind::WriteCombined, dev.cast(), host.cast(), n) };
    copy::store_fence();
    0
}

/// The dispatcher for WC plus the store fence, called as `gdr_copy_from_mapping` is.
///
/// # Safety
/// As `Method::run`.
#[inline(never)]
unsafe extern "C" fn dispatch_from_called(_h: GdrMh, host: *mut c_void, dev: *const c_void, n: usize) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { copy::copy_from_mapping(MappingKind::WriteCombined, host.cast(), dev.cast(), n) };
    copy::store_fence();
    0
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
    /// Block pairs per paired difference ([`paired`]).
    pairs: usize,
}

/// GB/s samples of `m` at `len`: each sample repeats the call enough times to last `t.sample`.
fn measure(m: &Method, dir: Direction, dev: *mut u8, host: *mut u8, len: usize, t: &Timing) -> Stat {
    let once = || {
        let s = Instant::now();
        // SAFETY: the caller passes buffers sized for the largest length + slack.
        unsafe { m.run(dir, dev, host, len, 1) };
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
            // SAFETY: as in `once`.
            unsafe { m.run(dir, dev, host, len, iters) };
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

/// Prints one table; returns each size's median GB/s per method (None where not usable).
fn table(
    title: &str,
    methods: &[Method],
    dir: Direction,
    dev: *mut u8,
    host: *mut u8,
    sizes: &[usize],
    t: &Timing,
) -> Vec<(usize, Vec<Option<f64>>)> {
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
    let mut rows = Vec::new();
    for &len in sizes {
        print!("| {} |", human(len));
        let mut base = None;
        let mut row = Vec::new();
        for m in methods {
            if !m.usable(len) {
                print!(" - |");
                row.push(None);
                continue;
            }
            let s = measure(m, dir, dev, host, len, t);
            if matches!(m, Method::Memcpy) {
                base = Some(s.med);
            }
            let ratio = base.map(|b| format!(" x{:.2}", s.med / b)).unwrap_or_default();
            print!(" {:.2} ({:.2}-{:.2}){} |", s.med, s.p10, s.p90, ratio);
            row.push(Some(s.med));
        }
        println!();
        rows.push((len, row));
    }
    rows
}

/// The per-call time difference `a - b` in ns, measured in alternating blocks of equal length
/// (a, b, b, a, a, b, ...: each pair's order swapped from the last), so that a machine whose speed
/// drifts between the table's cells (a shared VM) shifts both sides of each pair alike and a drift
/// within a pair favours neither side: median and p10-p90 of the per-pair differences, and the
/// median's 95% confidence interval ([`Difference`]).
fn paired(a: &Method, b: &Method, len: usize, on: &PairedOn<'_>) -> Difference {
    let (dir, dev, host, t) = (on.dir, on.dev, on.host, on.t);
    let block = |m: &Method, iters: usize| {
        let s = Instant::now();
        // SAFETY: the caller passes buffers sized for the largest length + slack.
        unsafe { m.run(dir, dev, host, len, iters) };
        s.elapsed().as_nanos() as f64 / iters as f64
    };
    block(a, 16);
    block(b, 16);
    let once = block(a, 64).max(1.0);
    let iters = ((t.sample.as_nanos() as f64 / 4.0 / once) as usize).clamp(16, 1 << 22);
    let (mut d, mut r): (Vec<f64>, Vec<f64>) = (0..t.pairs)
        .map(|i| {
            let (ta, tb) = if i % 2 == 0 {
                let ta = block(a, iters);
                (ta, block(b, iters))
            } else {
                let tb = block(b, iters);
                (block(a, iters), tb)
            };
            (ta - tb, ta / tb.max(f64::MIN_POSITIVE))
        })
        .unzip();
    d.sort_by(f64::total_cmp);
    r.sort_by(f64::total_cmp);
    let pick = |q: f64| d[((d.len() - 1) as f64 * q).round() as usize];
    let (lo, hi) = median_ci_ranks(d.len());
    Difference { med: pick(0.5), p10: pick(0.1), p90: pick(0.9), ci: (d[lo], d[hi]), ratio: r[r.len() / 2] }
}

/// A paired difference (ns per call): median, p10-p90 spread, and the median's 95% confidence
/// interval, so that "within about 1 ns" can be told from noise where single blocks vary by tens
/// of nanoseconds (stores that flush non-temporal lines of cached memory: raise `--pairs`).
struct Difference {
    med: f64,
    p10: f64,
    p90: f64,
    ci: (f64, f64),
    /// Median of the per-pair time ratios `a / b`.
    ratio: f64,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:+.2} ns [{:+.2}..{:+.2}] (95% CI {:+.2}..{:+.2})",
            self.med, self.p10, self.p90, self.ci.0, self.ci.1
        )
    }
}

/// The ranks (0-based, in sorted order) bounding a distribution-free 95% confidence interval of
/// the median of `n` values: the number of values below the true median is Binomial(n, 1/2), so
/// the interval is n/2 -+ 1.96 * sqrt(n) / 2 ranks (normal approximation), clamped to the data.
fn median_ci_ranks(n: usize) -> (usize, usize) {
    let half = 0.98 * (n as f64).sqrt();
    let mid = (n as f64 - 1.0) / 2.0;
    let lo = (mid - half).floor().max(0.0) as usize;
    let hi = ((mid + half).ceil() as usize).min(n - 1);
    (lo, hi)
}

/// The offsets of the misaligned columns (dispatcher and public calls): device +7, host +3.
const MIS_DEV: usize = 7;
const MIS_HOST: usize = 3;
/// Label of our misaligned public column (`MIS_DEV`, `MIS_HOST`).
const MISALIGNED_PUBLIC: &str = "public dev+7 host+3";
/// Label of the other library's misaligned public column (the same offsets).
const MISALIGNED_OTHER: &str = "other dev+7 host+3";

/// Where [`summary`] may run its paired measurements.
struct PairedOn<'a> {
    dir: Direction,
    dev: *mut u8,
    host: *mut u8,
    t: &'a Timing,
}

/// One line per size comparing our public call with the dispatcher and with the other library:
/// nanoseconds per call and speed ratios (> 1: our public call is faster), plus the paired
/// public-dispatcher and public-other differences ([`paired`]).
fn summary(what: &str, methods: &[Method], rows: &[(usize, Vec<Option<f64>>)], on: &PairedOn<'_>) {
    let col = |want: &dyn Fn(&Method) -> bool| methods.iter().position(want);
    let aligned_public =
        |m: &Method| matches!(m, Method::Public { label, dev_off: 0, host_off: 0, .. } if label.starts_with("public"));
    let Some(public) = col(&aligned_public) else {
        return;
    };
    let dispatch = col(&|m| matches!(m, Method::Dispatch { dev_off: 0, host_off: 0 }));
    let other = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with("other gdr_copy")));
    let other_misaligned = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with(MISALIGNED_OTHER)));
    let called = col(&|m| matches!(m, Method::DispatchCalled));
    let misaligned = col(&|m| matches!(m, Method::Public { label, .. } if label.starts_with(MISALIGNED_PUBLIC)));
    let misaligned_dispatch = col(&|m| matches!(m, Method::Dispatch { dev_off: MIS_DEV, host_off: MIS_HOST }));
    // The largest paired public-dispatcher differences and misaligned/aligned ratio of this run,
    // with their sizes: issue 10's bars in one line.
    let mut worst = [Worst::default(); 3];
    println!();
    for (len, row) in rows {
        let ns = |i: Option<usize>| i.and_then(|i| row[i]).map(|gbs| *len as f64 / gbs);
        let Some(p) = ns(Some(public)) else { continue };
        let mut line = format!("summary {what} {}: public {p:.2} ns", human(*len));
        if let Some(d) = ns(dispatch) {
            let pd = dispatch.map(|i| paired(&methods[public], &methods[i], *len, on));
            worst[0].note(pd.as_ref().map(|d| d.med), *len);
            let pd = pd.map_or(String::new(), |s| format!(", paired {s}"));
            line += &format!(", dispatcher {d:.2} ns (public-dispatcher {:+.2} ns{pd}, speed x{:.2})", p - d, d / p);
        }
        if let Some(c) = called {
            let s = paired(&methods[public], &methods[c], *len, on);
            worst[1].note(Some(s.med), *len);
            line += &format!(", paired public-dispatcher(C call) {s}");
        }
        if let Some(o) = ns(other) {
            let po = other.map(|i| paired(&methods[public], &methods[i], *len, on));
            let po = po.map_or(String::new(), |s| format!(", paired public-other {s}"));
            line += &format!(", other {o:.2} ns (speed x{:.2}{po})", o / p);
        }
        // Misaligned (device +7, host +3) over aligned time, same size: public and dispatcher.
        if let (Some(mp), Some(md), Some(d)) = (ns(misaligned), ns(misaligned_dispatch), ns(dispatch)) {
            line += &format!(", misaligned/aligned time: public x{:.2}, dispatcher x{:.2}", mp / p, md / d);
        }
        if let Some(m) = misaligned {
            let s = paired(&methods[m], &methods[public], *len, on);
            // A 1-byte copy has no misaligned form (the column is then the aligned one).
            worst[2].note((*len > 1).then_some(s.ratio), *len);
            line += &format!(", paired misaligned-aligned public {s}, time x{:.2}", s.ratio);
        }
        if let (Some(m), Some(o)) = (misaligned, other_misaligned) {
            line += &format!(", paired misaligned public-other {}", paired(&methods[m], &methods[o], *len, on));
        }
        println!("{line}");
    }
    let [pd, pdc, mis] = worst;
    let mut bar = format!("bar {what}:");
    for (name, w, ns) in [
        ("paired public-dispatcher", pd, true),
        ("paired public-dispatcher(C call)", pdc, true),
        ("misaligned/aligned public time", mis, false),
    ] {
        if let Some((v, len)) = w.0 {
            let v = if ns { format!("{v:+.2} ns") } else { format!("x{v:.2}") };
            bar += &format!(" {name} at most {v} ({});", human(len));
        }
    }
    println!("{bar}");
}

/// The largest value seen so far and the copy size it was seen at.
#[derive(Clone, Copy, Default)]
struct Worst(Option<(f64, usize)>);

impl Worst {
    fn note(&mut self, v: Option<f64>, len: usize) {
        if let Some(v) = v
            && self.0.is_none_or(|(w, _)| v > w)
        {
            self.0 = Some((v, len));
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Thread scaling
// ------------------------------------------------------------------------------------------------

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
fn scaling(ours: &GdrLib, cuda: &Cuda, threads: &[usize], t: &Timing) {
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
