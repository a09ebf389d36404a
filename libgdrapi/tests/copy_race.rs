//! Copies racing unmap, unpin and close on gdrdrv with the simulated GPU (inside the VM, suite 35:
//! once in persistent mode, once with free callbacks firing). The scenario and what it asserts are
//! in `common/race.rs`; the dma-buf backend runs the same scenario in `dmabuf_cudasim.rs`.

mod common;

use std::time::Duration;

use common::race::{self, GPU_BYTE, Gpu};
use common::{GpuSim, devices, persistent_mode};

impl Gpu for GpuSim {
    fn alloc(&self, len: usize) -> u64 {
        self.alloc_filled(len, GPU_BYTE)
    }
    fn free(&self, va: u64) {
        self.free_va(va).expect("GPUSIM_IOC_FREE");
    }
}

#[test]
#[ignore = "needs /dev/gdrdrv + /dev/gpusim: runs in the VM (scripts/vmtest --suite 35-libgdrapi) or with --include-ignored"]
fn copies_race_unmap_unpin_close_on_gdrdrv() {
    if !devices("copies_race_unmap_unpin_close_on_gdrdrv") {
        return;
    }
    let sim = GpuSim::open();
    let free_callbacks = !persistent_mode();
    race::copy_unmap_race(&sim, 4, Duration::from_secs(4), free_callbacks);
    assert_eq!(sim.info().active_pins, 0, "pins left behind");
}
