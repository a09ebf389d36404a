//! GPU memory freed behind gdrcopy's back, and mappings used after unpin/close.
//!
//! gdrdrv's mode decides what a free does (spec §3.10): non-persistent pins get the NVIDIA free
//! callback (flag set, mapping zapped: access raises SIGBUS), persistent pins (the module default)
//! keep the pages until unpin. Each test detects the mode with GDR_ATTR_USE_PERSISTENT_MAPPING and
//! checks what applies; the VM suite runs this binary once in each mode.
//! Accesses that must fault run in a forked child, which opens its own instances (gdrdrv and
//! gpusim files belong to the process that opened them).

mod common;

use common::*;
use gdrapi::abi::*;

fn mode(test: &str) -> Option<bool> {
    if !devices(test) {
        return None;
    }
    let p = persistent_mode();
    println!("{test}: gdrdrv in {} mode", if p { "persistent" } else { "non-persistent" });
    Some(p)
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn free_while_pinned() {
    let Some(persistent) = mode("free_while_pinned") else { return };
    let sim = GpuSim::open();
    let mut mem = sim.alloc(2 * GPU_PAGE);
    mem.write(0, b"before the free");
    let g = open();
    let h = pin(g, mem.va, 2 * GPU_PAGE).unwrap();
    assert_eq!(callback_flag(g, h), Ok(0));
    mem.free().expect("GPUSIM_IOC_FREE");
    let i = info(g, h).expect("get_info still works after the free");
    assert_eq!((i.va, i.mapped_size, i.page_size), (mem.va, 2 * GPU_PAGE as u64, 65536));
    assert_eq!(i.mapping_type, MappingType::None as u32);
    if persistent {
        assert_eq!(callback_flag(g, h), Ok(0), "persistent pins get no callback");
        // The pages stay pinned and mappable until unpin.
        let va = map(g, h, 2 * GPU_PAGE, 0).expect("map after free (persistent)");
        let mut back = [0u8; 15];
        assert_eq!(copy_from(h, &mut back, va), 0);
        assert_eq!(&back, b"before the free");
        assert_eq!(capi::gdr_unmap(g, h, va.cast(), 2 * GPU_PAGE), 0);
    } else {
        assert_eq!(callback_flag(g, h), Ok(1), "free callback must have fired");
        assert_eq!(map(g, h, 2 * GPU_PAGE, 0).err(), Some(libc::EINVAL), "invalidated handle cannot map");
    }
    assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn free_while_mapped() {
    let Some(persistent) = mode("free_while_mapped") else { return };
    // In a child: the access after the free either works (persistent) or dies with SIGBUS.
    for access in ["load", "gdr_copy_from_mapping"] {
        let exit = in_child(|| {
            let sim = GpuSim::open();
            let mut mem = sim.alloc(GPU_PAGE);
            let g = open();
            let (h, va) = pin_map(g, mem.va, GPU_PAGE);
            assert_eq!(copy_to(h, va, &[0x5c; 64]), 0);
            mem.free().unwrap();
            let i = info(g, h).unwrap();
            if persistent {
                assert_eq!(callback_flag(g, h), Ok(0));
                assert_eq!(i.mapping_type, MappingType::WriteCombined as u32, "mapping survives (persistent)");
            } else {
                assert_eq!(callback_flag(g, h), Ok(1));
                assert_eq!(i.mapping_type, MappingType::None as u32, "kernel tore the mapping down");
            }
            let v = if access == "load" {
                touch(va)
            } else {
                let mut b = [0u8; 16];
                assert_eq!(copy_from(h, &mut b, va), 0);
                b[0]
            };
            assert_eq!(v, 0x5c, "data after the free");
            // Reached only without a fault: tear down cleanly.
            unmap_unpin(g, h, va, GPU_PAGE);
            assert_eq!(capi::gdr_close(g), 0);
            0
        });
        let want = if persistent { Exit::Code(0) } else { Exit::Signal(libc::SIGBUS) };
        assert_eq!(exit, want, "{access} through a mapping whose memory was freed");
    }
    // Without touching it, an invalidated mapping is still unmapped, unpinned and closed with 0.
    let sim = GpuSim::open();
    let mut mem = sim.alloc(GPU_PAGE);
    let g = open();
    let (h, va) = pin_map(g, mem.va, GPU_PAGE);
    mem.free().unwrap();
    assert_eq!(callback_flag(g, h), Ok(i32::from(!persistent)));
    unmap_unpin(g, h, va, GPU_PAGE);
    assert_eq!(capi::gdr_close(g), 0);
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn freeing_one_buffer_leaves_another_mapping_intact() {
    let Some(persistent) = mode("freeing_one_buffer_leaves_another_mapping_intact") else { return };
    let sim = GpuSim::open();
    let mut first = sim.alloc(GPU_PAGE);
    let second = sim.alloc(GPU_PAGE);
    let g = open();
    let h1 = pin(g, first.va, GPU_PAGE).unwrap();
    let h2 = pin(g, second.va, GPU_PAGE).unwrap();
    let va1 = map(g, h1, GPU_PAGE, 0).unwrap();
    let va2 = map(g, h2, GPU_PAGE, 0).unwrap();
    assert_eq!(copy_to(h1, va1, b"first"), 0);
    assert_eq!(copy_to(h2, va2, b"second"), 0);
    first.free().unwrap();
    assert_eq!(callback_flag(g, h1), Ok(i32::from(!persistent)));
    assert_eq!(callback_flag(g, h2), Ok(0));
    let mut back = [0u8; 6];
    assert_eq!(copy_from(h2, &mut back, va2), 0);
    assert_eq!(&back, b"second");
    assert_eq!(second.read(0, 6), b"second");
    for (h, va) in [(h1, va1), (h2, va2)] {
        unmap_unpin(g, h, va, GPU_PAGE);
    }
    assert_eq!(capi::gdr_close(g), 0);
}

/// After unpin or gdr_close the old mapping address has no pages: access raises SIGBUS (the VMA
/// stays until munmap), in both modes.
#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn access_after_unpin_or_close_faults() {
    if mode("access_after_unpin_or_close_faults").is_none() {
        return;
    }
    for how in ["unpin", "close"] {
        let exit = in_child(|| {
            let sim = GpuSim::open();
            let mem = sim.alloc(GPU_PAGE);
            let g = open();
            let (h, va) = pin_map(g, mem.va, GPU_PAGE);
            assert_eq!(copy_to(h, va, &[7u8; 8]), 0);
            assert_eq!(touch(va), 7);
            if how == "unpin" {
                assert_eq!(capi::gdr_unpin_buffer(g, h), 0);
            } else {
                assert_eq!(capi::gdr_close(g), 0);
            }
            // The library refuses; only the raw pointer can still be dereferenced.
            assert_eq!(copy_to(h, va, &[1u8]), libc::EINVAL);
            i32::from(touch(va)) + 1
        });
        match exit {
            Exit::Signal(s) => assert!(s == libc::SIGBUS || s == libc::SIGSEGV, "access after {how}: signal {s}"),
            Exit::Code(c) => {
                panic!("access after {how} did not fault (child exit {c}: 101 = failed check, else value+1)")
            }
        }
    }
}
