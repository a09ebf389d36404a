//! Backend selection (spec §4.1): gdrdrv unless GDRCOPY_USE_DMABUF_MMAP is exactly "1", which
//! forces the CUDA dma-buf backend (and never falls back to gdrdrv).
//! Each case runs in a forked child: the variable is read at gdr_open, and changing the
//! environment of a multi-threaded test process is not sound.

mod common;

use std::path::Path;

use common::*;
use gdrapi::abi::*;

fn child_with(value: &'static str) -> Exit {
    in_child(move || {
        // SAFETY: the forked child is single-threaded; nothing else reads the environment now.
        unsafe { std::env::set_var("GDRCOPY_USE_DMABUF_MMAP", value) };
        let g = capi::gdr_open();
        if value == "1" {
            if g.is_null() {
                return 0; // no CUDA >= 13.3 with dma-buf here: open fails, no gdrdrv fallback
            }
            // A dma-buf capable libcuda was found: it must be that backend, not gdrdrv.
            assert_eq!(attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP), Ok(1));
            let (mut ma, mut mi) = (0, 0);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_driver_get_version(g, &mut ma, &mut mi) }, libc::EBADF);
        } else {
            assert!(!g.is_null(), "gdr_open failed with GDRCOPY_USE_DMABUF_MMAP={value:?}");
            assert_eq!(attribute(g, GDR_ATTR_USING_DMA_BUF_MMAP), Ok(0), "value {value:?} must not force dma-buf");
            let (mut ma, mut mi) = (0, 0);
            // SAFETY: pointers to live locals/buffers of this test, or the NULL/stale values it checks are refused.
            assert_eq!(unsafe { capi::gdr_driver_get_version(g, &mut ma, &mut mi) }, 0);
        }
        assert_eq!(capi::gdr_close(g), 0);
        0
    })
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn only_exactly_1_forces_dma_buf() {
    if !Path::new("/dev/gdrdrv").exists() {
        skip("only_exactly_1_forces_dma_buf", "missing /dev/gdrdrv (gdrdrv kernel module)");
        return;
    }
    for value in ["1", "0", "", "yes", "11", " 1"] {
        assert_eq!(child_with(value), Exit::Code(0), "GDRCOPY_USE_DMABUF_MMAP={value:?}");
    }
}
