//! Prepared send/wait requests executed end to end on a CUDA stream, the way the verbs provider
//! (next issue) will hand them over: ranges registered through the provider seam, op lists in the
//! mlx5 shape (spec §7.1/§7.2), posted with gds_stream_post_send(_all)/gds_stream_post_wait_cq(_all)
//! and gds_post_descriptors. The test re-executes itself with cudasim (built with the workspace)
//! first on the loader path, so it runs under plain `cargo test`; it is never counted as passed
//! without having run. With `GDSYNC_REQUESTS_REAL_CUDA=1` it runs in place against the
//! libcuda.so.1 the loader finds instead: the real driver on the GPU machine
//! (libgdsync/gpu-test/run.sh).

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::ffi::{c_int, c_uint};
use std::time::{Duration, Instant};

use gdsync::abi::*;
use gdsync::capi::*;
use gdsync::engine::ranges::{Range, ranges};
use gpudirect_common::cuda::{Driver, as_fn};

struct Cu {
    _d: Driver,
    query: unsafe extern "C" fn(usize) -> c_int,
    create: unsafe extern "C" fn(*mut usize, c_uint) -> c_int,
    destroy: unsafe extern "C" fn(usize) -> c_int,
    stream: usize,
}

/// Set in the re-executed child that has cudasim on its loader path.
const CHILD: &str = "GDSYNC_REQUESTS_CUDASIM_CHILD";
/// Set by the caller to run against the libcuda.so.1 on the loader path (a real driver).
const REAL: &str = "GDSYNC_REQUESTS_REAL_CUDA";

/// cudasim's libcuda next to the test's profile directory (target/<profile>/libcuda.so).
fn cudasim_library() -> Option<std::path::PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let lib = exe.parent()?.parent()?.join("libcuda.so");
    lib.exists().then_some(lib)
}

/// Runs `test` again in a child whose loader path starts with cudasim as libcuda.so.1 (the loader
/// reads LD_LIBRARY_PATH only at start-up). cudasim is built with the workspace; a run without
/// it fails instead of counting a test that did not run as passed.
fn run_with_cudasim(test: &str) {
    let sim = cudasim_library()
        .unwrap_or_else(|| panic!("{test}: missing the simulated libcuda: cargo build --release -p cudasim"));
    let dir = std::env::temp_dir().join(format!("gdsync-requests-{}-{test}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&sim, &link).unwrap();
    let path = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.display()),
        _ => dir.display().to_string(),
    };
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .env("LD_LIBRARY_PATH", path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{test} failed under cudasim:\n{text}");
    assert!(text.contains("1 passed") && !text.contains("SKIP"), "{test} did not run under cudasim:\n{text}");
}

/// The CUDA stream the test posts to; None in the parent, which re-runs the test in a child.
fn setup(test: &str) -> Option<Cu> {
    let real = std::env::var_os(REAL).is_some_and(|v| v == "1");
    if std::env::var_os(CHILD).is_none() && !real {
        run_with_cudasim(test);
        return None;
    }
    let d = match Driver::load("libcuda.so.1") {
        Ok(d) => d,
        Err(e) if real => panic!("{REAL}=1, yet libcuda.so.1 does not load ({e})"),
        Err(e) => panic!("the child has cudasim on its loader path, yet libcuda.so.1 does not load ({e})"),
    };
    let r = |n: &std::ffi::CStr| d.resolve(n, 12000).expect("symbol");
    // SAFETY: CUDA 12.0 prototypes of these entry points.
    unsafe {
        let init = as_fn::<unsafe extern "C" fn(c_uint) -> c_int>(r(c"cuInit"));
        let get = as_fn::<unsafe extern "C" fn(*mut c_int, c_int) -> c_int>(r(c"cuDeviceGet"));
        let retain = as_fn::<unsafe extern "C" fn(*mut usize, c_int) -> c_int>(r(c"cuDevicePrimaryCtxRetain"));
        let set = as_fn::<unsafe extern "C" fn(usize) -> c_int>(r(c"cuCtxSetCurrent"));
        let create = as_fn::<unsafe extern "C" fn(*mut usize, c_uint) -> c_int>(r(c"cuStreamCreate"));
        let query = as_fn::<unsafe extern "C" fn(usize) -> c_int>(r(c"cuStreamQuery"));
        let destroy = as_fn::<unsafe extern "C" fn(usize) -> c_int>(r(c"cuStreamDestroy"));
        let (mut dev, mut ctx, mut stream) = (0, 0usize, 0usize);
        assert_eq!(init(0), 0);
        assert_eq!(get(&mut dev, 0), 0);
        assert_eq!(retain(&mut ctx, dev), 0);
        assert_eq!(set(ctx), 0);
        assert_eq!(create(&mut stream, 1), 0);
        Some(Cu { query, create, destroy, stream, _d: d })
    }
}

impl Cu {
    /// The handle of a stream created and destroyed again: one the driver refuses.
    fn destroyed_stream(&self) -> usize {
        let mut s = 0usize;
        // SAFETY: valid out pointer; the stream is destroyed before anything uses it.
        unsafe {
            assert_eq!((self.create)(&mut s, 1), 0);
            assert_eq!((self.destroy)(s), 0);
        }
        s
    }
    fn blocked(&self) -> bool {
        std::thread::sleep(Duration::from_millis(20));
        // SAFETY: live stream.
        unsafe { (self.query)(self.stream) == 600 } // CUDA_ERROR_NOT_READY
    }
    fn drain(&self) {
        let t = Instant::now();
        // SAFETY: live stream.
        while unsafe { (self.query)(self.stream) } == 600 {
            assert!(t.elapsed() < Duration::from_secs(10), "stream stuck");
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Four page-sized areas playing doorbell record, BlueFlame register, CQ ring and peek flags.
struct Hw {
    base: *mut u8,
    dev: u64,
    dbr: u64,
    bf: u64,
    cq: u64,
    flag: u64,
}

const PAGE: usize = 4096;
const EINVAL: c_int = 22;

impl Hw {
    fn new() -> Hw {
        let layout = Layout::from_size_align(4 * PAGE, PAGE).unwrap();
        // SAFETY: non-zero size.
        let base = unsafe { alloc_zeroed(layout) };
        assert!(!base.is_null());
        let cuda = gdsync::cuda::cuda().expect("libcuda");
        let dev =
            gdsync::engine::memmgr::memmgr().map_mem(cuda, base as usize, 4 * PAGE, GDS_MEMORY_HOST).expect("register");
        let reg = |i: usize, len: usize| {
            ranges().register(Range { cpu: base as usize + i * PAGE, dev: dev + (i * PAGE) as u64, len })
        };
        let hw = Hw { base, dev, dbr: reg(0, 64), bf: reg(1, PAGE), cq: reg(2, PAGE), flag: reg(3, 64) };
        // Every CQE starts invalid (op_own = 0xF0: negative as a signed LE word at byte 60).
        for slot in 0..64 {
            hw.w32(2 * PAGE + slot * 64 + 60, 0xF000_0000);
        }
        hw
    }
    fn w32(&self, off: usize, v: u32) {
        // SAFETY: off < 4 pages, aligned.
        unsafe { std::ptr::write_volatile(self.base.add(off) as *mut u32, v) }
    }
    fn r32(&self, off: usize) -> u32 {
        // SAFETY: as above.
        unsafe { std::ptr::read_volatile(self.base.add(off) as *const u32) }
    }
    fn r64(&self, off: usize) -> u64 {
        // SAFETY: as above.
        unsafe { std::ptr::read_volatile(self.base.add(off) as *const u64) }
    }
}

fn op(type_: u32, wr: PeerOpUnion) -> PeerOpWr {
    PeerOpWr { next: std::ptr::null_mut(), type_, wr, comp_mask: 0 }
}

/// The mlx5 commit for producer index `pi`: dbrec store, fence, 8-byte doorbell (spec §7.1).
fn send_request(hw: &Hw, pi: u32, ctrl: u64) -> Box<SendRequest> {
    // SAFETY: all-zero is a valid request.
    let mut r: Box<SendRequest> = Box::new(unsafe { std::mem::zeroed() });
    r.wr[0] = op(
        IBV_EXP_PEER_OP_STORE_DWORD,
        PeerOpUnion { dword_va: DwordVa { data: (pi & 0xffff).to_be(), target_id: hw.dbr, offset: 4 } },
    );
    r.wr[1] = op(IBV_EXP_PEER_OP_FENCE, PeerOpUnion { fence_flags: 0x1A });
    r.wr[2] =
        op(IBV_EXP_PEER_OP_STORE_QWORD, PeerOpUnion { qword_va: QwordVa { data: ctrl, target_id: hw.bf, offset: 0 } });
    r.commit.storage = r.wr.as_mut_ptr();
    r.commit.entries = 3;
    r
}

/// The mlx5 peek of CQE `n` (GEQ mode) and the release of peek flag `k` (spec §7.2).
fn wait_request(hw: &Hw, n: usize, k: usize) -> Box<WaitRequest> {
    // SAFETY: all-zero is a valid request.
    let mut r: Box<WaitRequest> = Box::new(unsafe { std::mem::zeroed() });
    r.wr[0] = op(
        IBV_EXP_PEER_OP_POLL_GEQ_DWORD,
        PeerOpUnion { dword_va: DwordVa { data: 0, target_id: hw.cq, offset: n * 64 + 60 } },
    );
    r.wr[1] = op(
        IBV_EXP_PEER_OP_STORE_DWORD,
        PeerOpUnion { dword_va: DwordVa { data: 0, target_id: hw.flag, offset: 8 * k } },
    );
    r.peek.storage = r.wr.as_mut_ptr();
    r.peek.entries = 2;
    hw.w32(3 * PAGE + 8 * k, 1); // busy
    r
}

#[test]
fn prepared_requests_run_in_stream_order() {
    let Some(cu) = setup("prepared_requests_run_in_stream_order") else { return };
    let hw = Hw::new();
    let s = cu.stream as CuStream;
    // wait(CQE 0) then send: the doorbell must not ring before the completion arrives.
    let mut w = wait_request(&hw, 0, 0);
    let mut snd = send_request(&hw, 1, 0x1122_3344_5566_7788);
    // SAFETY: valid requests for the duration of the calls.
    unsafe {
        assert_eq!(gds_stream_post_wait_cq(s, &mut *w), 0);
        assert_eq!(gds_stream_post_send(s, &mut *snd), 0);
    }
    assert!(cu.blocked(), "the stream must wait for the CQE");
    assert_eq!((hw.r32(3 * PAGE), hw.r32(4), hw.r64(PAGE)), (1, 0, 0), "nothing ran early");
    hw.w32(2 * PAGE + 60, 0x0000_0000); // a valid completion (opcode 0, owner 0)
    cu.drain();
    assert_eq!(hw.r32(3 * PAGE), 0, "peek flag released");
    assert_eq!(hw.r32(4), 1u32.to_be(), "doorbell record = htonl(pi)");
    assert_eq!(hw.r64(PAGE), 0x1122_3344_5566_7788, "doorbell qword");

    // _all variants: two waits (CQE 1 and 2), then two sends.
    let mut ws = [*wait_request(&hw, 1, 1), *wait_request(&hw, 2, 2)];
    let mut ss = [*send_request(&hw, 2, 0xaaaa), *send_request(&hw, 3, 0xbbbb)];
    // SAFETY: arrays of 2 valid requests.
    unsafe {
        assert_eq!(gds_stream_post_wait_cq_all(s, 2, ws.as_mut_ptr()), 0);
        assert_eq!(gds_stream_post_send_all(s, 2, ss.as_mut_ptr()), 0);
    }
    hw.w32(2 * PAGE + 64 + 60, 0x0100_0000);
    assert!(cu.blocked(), "second CQE still missing");
    assert_eq!(hw.r32(3 * PAGE + 8), 0, "first wait passed");
    assert_eq!(hw.r32(3 * PAGE + 16), 1, "second wait not yet");
    hw.w32(2 * PAGE + 128 + 60, 0x0200_0000);
    cu.drain();
    assert_eq!((hw.r32(4), hw.r64(PAGE)), (3u32.to_be(), 0xbbbb), "last send wins, in order");

    // An error completion (opcode 13) does not satisfy the GEQ wait.
    let mut w = wait_request(&hw, 3, 3);
    // SAFETY: valid request.
    assert_eq!(unsafe { gds_stream_post_wait_cq(s, &mut *w) }, 0);
    hw.w32(2 * PAGE + 192 + 60, 0xD000_0000);
    assert!(cu.blocked(), "error CQE must not release a GEQ wait");
    hw.w32(2 * PAGE + 192 + 60, 0x0000_0000);
    cu.drain();

    // The CPU executes the same kind of request directly.
    let mut snd = send_request(&hw, 9, 0x99);
    let mut d = [Descriptor { tag: GDS_TAG_SEND, u: DescriptorUnion { send: &mut *snd } }];
    // SAFETY: one valid descriptor.
    assert_eq!(unsafe { gds_post_descriptors(1, d.as_mut_ptr(), 0) }, 0);
    assert_eq!((hw.r32(4), hw.r64(PAGE)), (9u32.to_be(), 0x99));

    // The mlx5 helpers report device addresses inside the registered ranges.
    let mut info = Mlx5SendInfo {
        bits: 0,
        dbrec_ptr: std::ptr::null_mut(),
        dbrec_value: 0,
        db_ptr: std::ptr::null_mut(),
        db_value: 0,
    };
    // SAFETY: one request, one info.
    assert_eq!(unsafe { gds_mlx5_get_send_info(1, &*snd, &mut info) }, 0);
    assert_eq!((info.dbrec_ptr as u64, info.db_ptr as u64, info.bits), (hw.dev + 4, hw.dev + PAGE as u64, 2));
    let w = wait_request(&hw, 5, 5);
    let mut wi = Mlx5WaitInfo {
        cond: 9,
        cqe_ptr: std::ptr::null_mut(),
        cqe_value: 1,
        flag_ptr: std::ptr::null_mut(),
        flag_value: 1,
    };
    // SAFETY: one request, one info.
    assert_eq!(unsafe { gds_mlx5_get_wait_info(1, &*w, &mut wi) }, 0);
    assert_eq!(
        (wi.cond, wi.cqe_ptr as u64, wi.flag_ptr as u64),
        (GDS_WAIT_COND_GEQ, hw.dev + (2 * PAGE + 5 * 64 + 60) as u64, hw.dev + (3 * PAGE + 40) as u64)
    );

    // A request whose target was unregistered is refused before anything is enqueued.
    let mut bad = send_request(&hw, 10, 0x10);
    bad.wr[2].wr.qword_va.target_id = 0x1234;
    // SAFETY: valid request.
    assert_eq!(unsafe { gds_stream_post_send(s, &mut *bad) }, EINVAL);
    cu.drain();
    assert_eq!(hw.r32(4), 9u32.to_be(), "nothing of the refused request ran");

    let layout = Layout::from_size_align(4 * PAGE, PAGE).unwrap();
    // The registration stays in the cache (process lifetime); the memory itself can go.
    // SAFETY: allocated above with this layout; the stream is drained.
    unsafe { dealloc(hw.base, layout) };
}

/// Two value descriptors on host words: a wait for `words[0] >= want` and a write of `val` to
/// `words[1]`, prepared as an application does.
fn flag_step(words: &mut [u32; 16], want: u32, val: u32) -> [Descriptor; 2] {
    let (w0, w1) = (&mut words[0] as *mut u32, &mut words[1] as *mut u32);
    let empty = DescriptorUnion { send: std::ptr::null_mut() };
    let mut d =
        [Descriptor { tag: GDS_TAG_WAIT_VALUE32, u: empty }, Descriptor { tag: GDS_TAG_WRITE_VALUE32, u: empty }];
    // SAFETY: the union members are plain data; each prepare writes the member its tag names.
    unsafe {
        assert_eq!(gds_prepare_wait_value32(&mut d[0].u.wait32, w0, want, GDS_WAIT_COND_GEQ, GDS_MEMORY_HOST), 0);
        assert_eq!(gds_prepare_write_value32(&mut d[1].u.write32, w1, val, GDS_MEMORY_HOST), 0);
    }
    d
}

#[test]
fn value_posts_run_in_stream_order() {
    let Some(cu) = setup("value_posts_run_in_stream_order") else { return };
    let s = cu.stream as CuStream;
    let words = Box::leak(Box::new([0u32; 16]));
    // The first post translates (and registers) the words; the ones after it take the
    // unguarded common case of gds_stream_post_descriptors.
    let mut last = 0;
    for i in 1..=3u32 {
        let mut d = flag_step(words, i, 100 + i);
        // SAFETY: two valid descriptors.
        assert_eq!(unsafe { gds_stream_post_descriptors(s, 2, d.as_mut_ptr(), 0) }, 0);
        assert!(cu.blocked(), "step {i}: the stream waits for the flag");
        // SAFETY: a live word the stream reads (volatile: the GPU/simulator writes words[1]).
        unsafe {
            assert_eq!(std::ptr::read_volatile(&words[1]), last, "step {i}: nothing ran early");
            std::ptr::write_volatile(&mut words[0], i);
        }
        cu.drain();
        // SAFETY: as above.
        assert_eq!(unsafe { std::ptr::read_volatile(&words[1]) }, 100 + i, "step {i}: the write ran");
        last = 100 + i;
    }
}

/// A post the driver refuses after the common case built it (a destroyed stream): EINVAL, as
/// upstream answers for a stream whose context cannot be found, and nothing enqueued. Needs a
/// driver that refuses a destroyed stream's handle (cudasim); the real driver may do anything
/// with one, so `gpu-test/run.sh` skips this test.
#[test]
fn a_refused_value_post_is_einval() {
    if std::env::var_os(REAL).is_some_and(|v| v == "1") {
        panic!("a_refused_value_post_is_einval needs cudasim (a destroyed stream handle): skip it on a real driver");
    }
    let Some(cu) = setup("a_refused_value_post_is_einval") else { return };
    let words = Box::leak(Box::new([0u32; 16]));
    let mut d = flag_step(words, 0, 7);
    // SAFETY: two valid descriptors; the first post makes the words known.
    assert_eq!(unsafe { gds_stream_post_descriptors(cu.stream as CuStream, 2, d.as_mut_ptr(), 0) }, 0);
    cu.drain();
    let gone = cu.destroyed_stream() as CuStream;
    let mut d = flag_step(words, 0, 9);
    // SAFETY: as above; the stream handle is one the driver refuses.
    assert_eq!(unsafe { gds_stream_post_descriptors(gone, 2, d.as_mut_ptr(), 0) }, EINVAL);
    // SAFETY: a live word.
    assert_eq!(unsafe { std::ptr::read_volatile(&words[1]) }, 7, "the refused write did not run");
}
