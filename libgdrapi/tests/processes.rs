//! fork(), many processes and many threads against /dev/gdrdrv (spec §3.12, §1.4 thread safety).
//!
//! gdrdrv files belong to the opening process: a fork child that uses the parent's gdr_t gets
//! EACCES from the kernel for every call, and does not inherit the parent's mappings (VM_DONTCOPY:
//! access raises SIGSEGV). Run with --test-threads=1 (forks copy only the calling thread).

mod common;

use common::*;
use gdrapi::abi::*;

const EACCES: i32 = libc::EACCES;

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn fork_child_cannot_use_parent_handles() {
    if !devices("fork_child_cannot_use_parent_handles") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(2 * GPU_PAGE);
    let g = open();
    let h = pin(g, mem.va, GPU_PAGE).unwrap();
    let h2 = pin(g, mem.va + GPU_PAGE as u64, GPU_PAGE).unwrap();
    let va = map(g, h, GPU_PAGE, 0).unwrap();
    assert_eq!(copy_to(h, va, b"parent data"), 0);

    let exit = in_child(|| {
        // The library's records were copied by fork; the kernel refuses the other process.
        assert_eq!(info(g, h).err(), Some(EACCES), "get_info");
        assert_eq!(callback_flag(g, h2), Err(EACCES), "get_callback_flag");
        assert_eq!(map(g, h2, GPU_PAGE, 0).err(), Some(EACCES), "map of the parent's pin");
        assert_eq!(pin(g, mem.va, GPU_PAGE).err(), Some(EACCES), "pin through the parent's gdr_t");
        assert_eq!(attribute(g, GDR_ATTR_USE_PERSISTENT_MAPPING), Err(EACCES), "get_attribute");
        let (mut ma, mut mi) = (0, 0);
        // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
        assert_eq!(unsafe { capi::gdr_driver_get_version(g, &mut ma, &mut mi) }, EACCES, "driver version");
        assert_eq!(capi::gdr_unpin_buffer(g, h2), EACCES, "unpin of the parent's pin");
        0
    });
    assert_eq!(exit, Exit::Code(0), "child checks (101 = a failed assertion, printed above)");

    // The mapping is not inherited: the child faults on the address.
    let exit = in_child(|| i32::from(touch(va)));
    assert_eq!(exit, Exit::Signal(libc::SIGSEGV), "child access to the parent's mapping");

    // The parent is unaffected, including the handle the child tried to unpin.
    let mut back = [0u8; 11];
    assert_eq!(copy_from(h, &mut back, va), 0);
    assert_eq!(&back, b"parent data");
    assert_eq!(callback_flag(g, h2), Ok(0));
    unmap_unpin(g, h, va, GPU_PAGE);
    assert_eq!(capi::gdr_unpin_buffer(g, h2), 0);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn fork_child_with_its_own_instance_works() {
    if !devices("fork_child_with_its_own_instance_works") {
        return;
    }
    let parent_g = open();
    let exit = in_child(|| {
        let sim = GpuSim::open();
        let mem = sim.alloc(GPU_PAGE);
        let g = open();
        let (h, va) = pin_map(g, mem.va, GPU_PAGE);
        assert_eq!(copy_to(h, va, b"child"), 0);
        assert_eq!(mem.read(0, 5), b"child");
        assert_eq!(capi::gdr_close(g), 0);
        0
    });
    assert_eq!(exit, Exit::Code(0));
    assert_eq!(capi::gdr_close(parent_g), 0);
}

/// One process's pin/map/copy/unmap/unpin cycle, checked against the GPU view; returns 0.
fn churn(seed: u64, rounds: usize) -> i32 {
    let sim = GpuSim::open();
    let g = open();
    let mut rng = Rng::new(seed);
    for round in 0..rounds {
        let pages = 1 + rng.below(4);
        let mem = sim.alloc(pages * GPU_PAGE);
        let (h, va) = pin_map(g, mem.va, pages * GPU_PAGE);
        let n = 1 + rng.below(pages * GPU_PAGE);
        let data = rng.bytes(n);
        assert_eq!(copy_to(h, va, &data), 0);
        assert_eq!(mem.read(0, n), data, "seed {seed} round {round}");
        let mut back = vec![0u8; n];
        assert_eq!(copy_from(h, &mut back, va), 0);
        assert_eq!(back, data);
        unmap_unpin(g, h, va, pages * GPU_PAGE);
    }
    assert_eq!(capi::gdr_close(g), 0);
    0
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn many_processes_at_once() {
    if !devices("many_processes_at_once") {
        return;
    }
    let pids: Vec<_> = (0..6).map(|i| spawn_child(move || churn(100 + i, 25))).collect();
    for (i, pid) in pids.into_iter().enumerate() {
        assert_eq!(wait(pid), Exit::Code(0), "process {i}");
    }
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn many_threads_one_instance() {
    if !devices("many_threads_one_instance") {
        return;
    }
    let sim = GpuSim::open();
    let g = open() as usize; // gdr_t values cross threads as integers
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let sim = &sim;
            s.spawn(move || {
                let g = g as GdrT;
                let mut rng = Rng::new(7 + t);
                for round in 0..25 {
                    let mem = sim.alloc(2 * GPU_PAGE);
                    let (h, va) = pin_map(g, mem.va, 2 * GPU_PAGE);
                    let n = 1 + rng.below(2 * GPU_PAGE);
                    let data = rng.bytes(n);
                    assert_eq!(copy_to(h, va, &data), 0);
                    assert_eq!(mem.read(0, n), data, "thread {t} round {round}");
                    unmap_unpin(g, h, va, 2 * GPU_PAGE);
                }
            });
        }
    });
    // One shared mapping, disjoint slices copied from several threads at once.
    let mem = sim.alloc(8 * GPU_PAGE);
    let (h, va) = pin_map(g as GdrT, mem.va, 8 * GPU_PAGE);
    let va = va as usize;
    std::thread::scope(|s| {
        for t in 0..8usize {
            s.spawn(move || {
                let data = vec![t as u8 + 1; GPU_PAGE];
                for _ in 0..20 {
                    assert_eq!(copy_to(h, (va + t * GPU_PAGE) as *mut u8, &data), 0);
                    let mut back = vec![0u8; GPU_PAGE];
                    assert_eq!(copy_from(h, &mut back, (va + t * GPU_PAGE) as *const u8), 0);
                    assert_eq!(back, data);
                }
            });
        }
    });
    for t in 0..8 {
        assert_eq!(mem.read(t * GPU_PAGE, GPU_PAGE), vec![t as u8 + 1; GPU_PAGE]);
    }
    assert_eq!(capi::gdr_close(g as GdrT), 0, "close with a live pin and mapping");
    // SAFETY: the VMA outlives gdr_close; the user unmaps it.
    unsafe { libc::munmap(va as *mut libc::c_void, 8 * GPU_PAGE) };
}

/// Pins and unpins racing on one instance from several threads, with a stale-handle storm.
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn concurrent_unpin_and_stale_handles() {
    if !devices("concurrent_unpin_and_stale_handles") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(GPU_PAGE);
    let g = open() as usize;
    let handles: Vec<GdrMh> = (0..32).map(|_| pin(g as GdrT, mem.va, GPU_PAGE).unwrap()).collect();
    // Every handle is unpinned by exactly one of the racing threads; the others see EINVAL.
    let results: Vec<Vec<i32>> = std::thread::scope(|s| {
        let joins: Vec<_> = (0..4)
            .map(|_| {
                let handles = &handles;
                s.spawn(move || handles.iter().map(|&h| capi::gdr_unpin_buffer(g as GdrT, h)).collect::<Vec<_>>())
            })
            .collect();
        joins.into_iter().map(|j| j.join().unwrap()).collect()
    });
    for i in 0..handles.len() {
        let zeros = results.iter().filter(|r| r[i] == 0).count();
        assert_eq!(zeros, 1, "handle {i} unpinned {zeros} times");
        assert!(
            results.iter().all(|r| r[i] == 0 || r[i] == libc::EINVAL),
            "handle {i}: {:?}",
            results.iter().map(|r| r[i]).collect::<Vec<_>>()
        );
    }
    assert_eq!(capi::gdr_close(g as GdrT), 0);
}

/// A child frees its own mapped buffer; the parent's mapping of a different buffer is unaffected
/// (upstream sanity `invalidation_fork_map_and_free`).
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn child_freeing_its_buffer_leaves_parent_mapping() {
    if !devices("child_freeing_its_buffer_leaves_parent_mapping") {
        return;
    }
    let sim = GpuSim::open();
    let mem = sim.alloc(GPU_PAGE);
    let g = open();
    let (h, va) = pin_map(g, mem.va, GPU_PAGE);
    assert_eq!(copy_to(h, va, b"parent value"), 0);
    let exit = in_child(|| {
        let sim = GpuSim::open();
        let mut mem = sim.alloc(GPU_PAGE);
        let g = open();
        let (h, va) = pin_map(g, mem.va, GPU_PAGE);
        assert_eq!(copy_to(h, va, b"child value"), 0);
        mem.free().unwrap();
        0 // exit without unmap/unpin/close: process teardown releases everything
    });
    assert_eq!(exit, Exit::Code(0));
    let mut back = [0u8; 12];
    assert_eq!(copy_from(h, &mut back, va), 0);
    assert_eq!(&back, b"parent value");
    assert_eq!(mem.read(0, 12), b"parent value");
    assert_eq!(capi::gdr_close(g), 0);
    // SAFETY: the VMA outlives gdr_close; the user unmaps it.
    unsafe { libc::munmap(va.cast(), GPU_PAGE) };
}

fn pipe() -> (i32, i32) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-int array.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    (fds[0], fds[1])
}

fn send(fd: i32) {
    // SAFETY: writes one byte from a local to a pipe we own.
    assert_eq!(unsafe { libc::write(fd, b"x".as_ptr().cast(), 1) }, 1);
}

/// Waits for one byte; false at end of file (the other side died).
fn receive(fd: i32) -> bool {
    let mut b = 0u8;
    // SAFETY: reads one byte into a local from a pipe we own.
    (unsafe { libc::read(fd, (&raw mut b).cast(), 1) }) == 1
}

fn close(fd: i32) {
    // SAFETY: closes a pipe end this process owns and no longer uses.
    unsafe { libc::close(fd) };
}

/// After a process frees GPU memory that it still has mapped, another process's data placed in
/// the freed memory must never show through the stale mapping (upstream sanity
/// `invalidation_fork_access_after_free`): non-persistent mode faults, persistent mode keeps the
/// old pages pinned so the other process cannot get them.
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn stale_mapping_never_shows_another_process_data() {
    if !devices("stale_mapping_never_shows_another_process_data") {
        return;
    }
    let persistent = persistent_mode();
    // The "parent" role runs in a child of the test so that its fault can be observed.
    let exit = in_child(|| {
        let (to_child_r, to_child_w) = pipe();
        let (to_parent_r, to_parent_w) = pipe();
        let sim = GpuSim::open();
        let mut mem = sim.alloc(4 * GPU_PAGE);
        let g = open();
        let (h, va) = pin_map(g, mem.va, 4 * GPU_PAGE);
        assert_eq!(copy_to(h, va, &[0x11; 64]), 0);
        mem.free().unwrap();
        let other = spawn_child(move || {
            close(to_child_w);
            close(to_parent_r);
            let sim = GpuSim::open();
            // Take as much BAR as is free so that the freed pages are reused if they can be.
            let info = sim.info();
            let pages = (info.free_bytes as usize / GPU_PAGE).clamp(1, 64);
            let mem = sim.alloc(pages * GPU_PAGE);
            mem.write(0, &vec![0xee; pages * GPU_PAGE]);
            send(to_parent_w);
            // Keep the data in place until the other side has looked (or died trying).
            receive(to_child_r);
            0
        });
        close(to_parent_w);
        close(to_child_r);
        assert!(receive(to_parent_r), "the other process died before writing its data");
        let mut seen = [0u8; 64];
        let rc = copy_from(h, &mut seen, va); // faults in non-persistent mode
        send(to_child_w);
        assert_eq!(wait(other), Exit::Code(0));
        assert_eq!(rc, 0);
        assert!(seen.iter().all(|&b| b != 0xee), "another process's data leaked through a stale mapping");
        assert_eq!(seen, [0x11; 64], "persistent pins keep the freed pages and their data");
        0
    });
    if persistent {
        assert_eq!(exit, Exit::Code(0));
    } else {
        assert_eq!(exit, Exit::Signal(libc::SIGBUS), "stale mapping after the free callback");
    }
}
