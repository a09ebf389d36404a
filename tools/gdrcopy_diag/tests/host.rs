//! gdrcopy_diag run as a user would, on a machine without a GPU (CI), and against cudasim (the
//! simulated libcuda) in host-memory mode, which exports dma-bufs like a CUDA 13.3 driver.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A scratch directory removed when the test ends.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Scratch {
    fn path(&self) -> &str {
        self.0.to_str().expect("temp paths are UTF-8")
    }
}

fn exe() -> &'static str {
    env!("CARGO_BIN_EXE_gdrcopy_diag")
}

/// A directory holding libcuda.so.1 → cudasim and libgdrapi.so.2 → our library, or None (with
/// a visible SKIP) when this cargo invocation did not build them.
fn sim_libs(tag: &str) -> Option<Scratch> {
    let dir = Path::new(exe()).parent()?.to_path_buf();
    let (cuda, gdr) = (dir.join("libcuda.so"), dir.join("libgdrapi.so"));
    if !cuda.exists() || !gdr.exists() {
        eprintln!("SKIP {tag}: cudasim/libgdrapi not built next to the binary (run cargo test --workspace)");
        return None;
    }
    let d = std::env::temp_dir().join(format!("gdrcopy-diag-test-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).ok()?;
    std::os::unix::fs::symlink(&cuda, d.join("libcuda.so.1")).ok()?;
    std::os::unix::fs::symlink(&gdr, d.join("libgdrapi.so.2")).ok()?;
    Some(Scratch(d))
}

fn run(args: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let mut c = Command::new(exe());
    c.args(args).env_remove("GDRCOPY_USE_DMABUF_MMAP").env_remove("GDRCOPY_DIAG_SYSROOT");
    for (k, v) in env {
        c.env(k, v);
    }
    let Output { status, stdout, .. } = c.output().expect("run gdrcopy_diag");
    (status.code().unwrap_or(-1), String::from_utf8_lossy(&stdout).into_owned())
}

fn libcuda_present() -> bool {
    gpudirect_common::dl::Library::open("libcuda.so.1").is_ok()
}

#[test]
fn without_a_gpu_it_says_so_and_fails() {
    if libcuda_present() {
        eprintln!("SKIP without_a_gpu: this machine has a libcuda.so.1");
        return;
    }
    let (rc, out) = run(&[], &[("LD_LIBRARY_PATH", "")]);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("[FAIL] libcuda          libcuda.so.1 cannot be loaded: no NVIDIA GPU driver here"), "{out}");
    assert!(out.contains("verdict: no GPUDirect path works"), "{out}");
    let (rc, json) = run(&["--json"], &[("LD_LIBRARY_PATH", "")]);
    assert_eq!(rc, 1);
    assert!(json.starts_with("{\"tool\":\"gdrcopy_diag\""), "{json}");
    assert!(json.contains("\"gpudirect_works\":false,\"working_path\":null"), "{json}");
    assert!(json.contains("{\"check\":\"libcuda\",\"status\":\"fail\""), "{json}");
}

#[test]
fn dmabuf_path_over_cudasim_works_and_exits_zero() {
    let Some(d) = sim_libs("dmabuf") else { return };
    let lp = d.path();
    let env = [
        ("LD_LIBRARY_PATH", lp),
        ("CUDASIM_BACKEND", "host"),
        ("CUDASIM_DMABUF", "1"),
        ("CUDASIM_DRIVER_VERSION", "13030"),
    ];
    let (rc, out) = run(&[], &env);
    assert_eq!(rc, 0, "{out}");
    assert!(out.contains("[ OK ] backend          gdr_open picks the dma-buf backend"), "{out}");
    assert!(out.contains("[ OK ] round-trip       pinned, mapped and copied 4096 bytes"), "{out}");
    // gdrdrv is missing here, but the working dma-buf path turns its failures into warnings.
    // Nothing blocks gdrcopy; the storage section after it may fail (no NVMe, no libnvm).
    let gdrcopy_part = out.split("GPU memory registration with RDMA devices:").next().unwrap_or(&out);
    assert!(!gdrcopy_part.contains("[FAIL]"), "{out}");
    let (rc, json) = run(&["--json"], &env);
    assert_eq!(rc, 0);
    assert!(json.contains("\"gpudirect_works\":true,\"working_path\":\"dma-buf\""), "{json}");
    assert!(json.contains("\"check\":\"stream-memops\",\"status\":\"ok\""), "{json}");
}

#[test]
fn cuda_13_0_without_gdrdrv_is_explained() {
    // The GPU machine's situation: CUDA 13.0 driver, no gdrdrv.
    let Some(d) = sim_libs("cuda130") else { return };
    let env = [("LD_LIBRARY_PATH", d.path()), ("CUDASIM_BACKEND", "host"), ("CUDASIM_DRIVER_VERSION", "13000")];
    let root = fake_root("cuda130");
    let env = [env[0], env[1], env[2], ("GDRCOPY_DIAG_SYSROOT", root.path())];
    let (rc, out) = run(&[], &env);
    assert_eq!(rc, 1, "{out}");
    assert!(out.contains("[FAIL] dma-buf          driver API 13.0 is older than 13.3"), "{out}");
    assert!(out.contains("[FAIL] backend          gdr_open fails"), "{out}");
    assert!(out.contains("[SKIP] round-trip"), "{out}");
    // The fake tree: gdrdrv registered (major 511) but no node, a 256 MiB BAR for 16 GiB.
    assert!(out.contains("gdrdrv is registered (major 511) but /dev/gdrdrv does not exist"), "{out}");
    assert!(out.contains("fix: the package's udev rule creates it"), "{out}");
    assert!(
        out.contains("[WARN] bar1             GPU 0: BAR1 (PCI resource 2) is 256 MiB for 16 GiB of memory"),
        "{out}"
    );
    assert!(
        out.contains("[ OK ] gdrdrv-module    gdrdrv 2.6 is loaded, built for the opensource NVIDIA driver"),
        "{out}"
    );
    assert!(
        out.contains(
            "[ OK ] p2p-symbols      gdrdrv resolved NVIDIA's nvidia_p2p_* symbols at load (exported by gpusim)"
        ),
        "{out}"
    );
    assert!(out.contains("IOMMU translates device DMA (DMA-FQ)"), "{out}");
    assert!(out.contains("RDMA devices: mlx5_0 (mlx5_core); GDS_PROVIDER=mlx5 can use mlx5_0"), "{out}");
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(run(&["--frobnicate"], &[]).0, 2);
    let (rc, out) = run(&["--help"], &[]);
    assert_eq!(rc, 0);
    assert!(out.contains("--json"));
}

/// A fake /proc + /sys: gdrdrv loaded and registered, no /dev/gdrdrv, cudasim's PCI address
/// with a 256 MiB prefetchable BAR2, an IOMMU group in DMA-FQ mode, one mlx5 RDMA device.
fn fake_root(tag: &str) -> Scratch {
    let r = std::env::temp_dir().join(format!("gdrcopy-diag-root-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&r);
    let put = |p: &str, text: &str| {
        let f = r.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, text).unwrap();
    };
    put("proc/devices", "Character devices:\n  1 mem\n511 gdrdrv\n\nBlock devices:\n  8 sd\n");
    put("proc/kallsyms", "0000000000000000 T nvidia_p2p_get_pages\t[gpusim]\n");
    put("proc/driver/gdrdrv/params", "Version: 2.6\nBuilt for NVIDIA driver flavor: opensource\n");
    put("sys/module/gdrdrv/version", "2.6\n");
    put(
        "sys/bus/pci/devices/0000:65:00.0/resource",
        "0x00000000fe000000 0x00000000fe0000ff 0x0000000000040200\n\
         0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
         0x0000000380000000 0x000000038fffffff 0x000000000014220c\n",
    );
    put("sys/kernel/iommu_groups/0/type", "DMA-FQ\n");
    put("sys/class/iommu/dmar0/x", "");
    put("sys/class/infiniband/mlx5_0/x", "");
    std::fs::create_dir_all(r.join("sys/bus/pci/drivers/mlx5_core")).unwrap();
    std::fs::create_dir_all(r.join("sys/class/infiniband/mlx5_0")).unwrap();
    std::os::unix::fs::symlink(
        r.join("sys/bus/pci/drivers/mlx5_core"),
        r.join("sys/class/infiniband/mlx5_0/device/driver"),
    )
    .or_else(|_| {
        std::fs::create_dir_all(r.join("sys/class/infiniband/mlx5_0/device"))?;
        std::os::unix::fs::symlink(
            r.join("sys/bus/pci/drivers/mlx5_core"),
            r.join("sys/class/infiniband/mlx5_0/device/driver"),
        )
    })
    .unwrap();
    Scratch(r)
}
