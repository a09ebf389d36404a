//! Turns what was observed into findings, each with plain words and a fix.
//!
//! A finding that blocks one of the two gdrcopy paths (gdrdrv, dma-buf) is recorded with the
//! path it blocks; when the other path works it is shown as a warning instead of a failure.

use crate::cuda::{self, Cuda, DMABUF_MMAP_MIN_VERSION};
use crate::gdrapi::{GPU_PAGE, GdrApi, OpenOutcome};
use crate::report::{Finding, Report, Status};
use crate::sys::{self, Sys, cuda_version_string, human_bytes};
use crate::{nvm_ioctl, regmem, storage, verbs};

const NODE: &str = "/dev/gdrdrv";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    Gdrdrv,
    DmaBuf,
}

struct Builder {
    findings: Vec<(Finding, Option<Path>)>,
}

impl Builder {
    fn add(&mut self, f: Finding) {
        self.findings.push((f, None));
    }
    fn blocks(&mut self, path: Path, f: Finding) {
        self.findings.push((f, Some(path)));
    }
}

/// Facts about the gdrdrv module that several checks use.
struct Module {
    loaded: bool,
    version: Option<String>,
    major: Option<u32>,
    flavor: Option<String>,
}

fn module(sys: &Sys) -> Module {
    let params = sys.read("/proc/driver/gdrdrv/params").unwrap_or_default();
    Module {
        loaded: sys.exists("/sys/module/gdrdrv"),
        version: sys.read("/sys/module/gdrdrv/version").map(|s| s.trim().to_owned()),
        major: sys.read("/proc/devices").and_then(|t| sys::proc_devices_major(&t, "gdrdrv")),
        flavor: params
            .lines()
            .find_map(|l| l.strip_prefix("Built for NVIDIA driver flavor:"))
            .map(|s| s.trim().to_owned()),
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it and returns 0.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: release is NUL-terminated by the kernel.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy().into_owned()
}

/// Whether this process could load a kernel module at all (CAP_SYS_MODULE in the effective set).
fn can_load_modules(sys: &Sys) -> bool {
    const CAP_SYS_MODULE: u32 = 16;
    sys.read("/proc/self/status")
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("CapEff:").map(|v| v.trim().to_owned())))
        .and_then(|h| u64::from_str_radix(&h, 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_SYS_MODULE) != 0)
}

/// Where an installed gdrdrv.ko for `kver` lies, if any.
fn installed_module(sys: &Sys, kver: &str) -> Option<String> {
    ["updates/dkms", "kernel/drivers/misc", "extra", "updates"].iter().find_map(|d| {
        let dir = format!("/lib/modules/{kver}/{d}");
        sys.list(&dir).into_iter().find(|n| n.starts_with("gdrdrv.ko")).map(|n| format!("{dir}/{n}"))
    })
}

/// Which part of the report to produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    All,
    Gdrcopy,
    Registration,
    Storage,
}

pub fn run(sys: &Sys, only: Section) -> Report {
    let kver = kernel_release();
    let reg = || regmem::findings(&regmem::RegFacts::gather(sys, &kver, &verbs::probe_all));
    let sto = || storage::findings(&storage::StorageFacts::gather(sys, &nvm_ioctl::get_version));
    match only {
        Section::Registration => return section_report(reg()),
        Section::Storage => return section_report(sto()),
        Section::All | Section::Gdrcopy => {}
    }
    let mut r = run_gdrcopy(sys, &kver);
    if only == Section::All {
        r.findings.extend(reg());
        r.findings.extend(sto());
    }
    r
}

/// A report of one section: no gdrcopy round trip, the verdict is the first failure or "ok".
fn section_report(findings: Vec<Finding>) -> Report {
    let verdict = match findings.iter().find(|f| f.status == Status::Fail) {
        Some(f) => format!("{}: {}", f.check, f.summary),
        None => findings.first().map_or_else(|| "nothing to report".to_owned(), |f| f.summary.clone()),
    };
    Report { findings, working_path: None, verdict }
}

fn run_gdrcopy(sys: &Sys, kver: &str) -> Report {
    let mut b = Builder { findings: Vec::new() };
    let kver = kver.to_owned();
    let m = module(sys);
    let cuda = cuda_checks(&mut b);
    module_checks(&mut b, sys, &m, &kver);
    node_check(&mut b, sys, &m);
    if let Some(c) = &cuda {
        bar_checks(&mut b, sys, c);
        memops_check(&mut b, c);
    }
    iommu_check(&mut b, sys);
    rdma_check(&mut b, sys);
    let working = library_checks(&mut b, cuda.as_ref(), &m);

    let working_path = working.map(str::to_owned);
    let mut findings = Vec::new();
    for (mut f, path) in b.findings {
        let other_works = match path {
            Some(Path::Gdrdrv) => working == Some("dma-buf"),
            Some(Path::DmaBuf) => working == Some("gdrdrv"),
            None => false,
        };
        if other_works && f.status == Status::Fail {
            f.status = Status::Warn;
        }
        findings.push(f);
    }
    let verdict = match working {
        Some(p) => format!("GPUDirect works: gdrcopy pinned, mapped and copied GPU memory through the {p} backend"),
        None => {
            let first = findings.iter().find(|f| f.status == Status::Fail).map(|f| f.summary.clone());
            format!(
                "no GPUDirect path works on this machine{}",
                first.map(|s| format!(" (first blocker: {s})")).unwrap_or_default()
            )
        }
    };
    Report { findings, working_path, verdict }
}

fn cuda_checks(b: &mut Builder) -> Option<Cuda> {
    let c = match Cuda::probe() {
        Ok(c) => c,
        Err(e) => {
            b.add(
                Finding::new("libcuda", Status::Fail, "libcuda.so.1 cannot be loaded: no NVIDIA GPU driver here")
                    .fact("error", e)
                    .fix("install the NVIDIA driver's user-space library (Debian: libcuda1 from non-free, or NVIDIA's CUDA repository); if it is installed in a private directory, add that directory to /etc/ld.so.conf.d/ and run ldconfig"),
            );
            return None;
        }
    };
    let v = c.version;
    let vs = v.map_or("unknown".to_owned(), cuda_version_string);
    if c.init != 0 {
        b.add(
            Finding::new("libcuda", Status::Fail, format!("libcuda.so.1 (driver API {vs}) loads but cuInit fails with CUresult {}", c.init))
                .fact("driver_version", v.map(i64::from))
                .fact("cuinit_result", i64::from(c.init))
                .fix("CUresult 100 means no GPU is visible (check nvidia-smi, the container's --gpus option, CUDA_VISIBLE_DEVICES); 999 or 3 usually mean the kernel driver and libcuda versions differ: reboot or reload the nvidia module after a driver upgrade"),
        );
        return Some(c);
    }
    b.add(
        Finding::new("libcuda", Status::Ok, format!("libcuda.so.1 loaded, driver API {vs}"))
            .fact("driver_version", v.map(i64::from)),
    );
    if c.gpus.is_empty() {
        b.add(
            Finding::new("gpus", Status::Fail, "the CUDA driver sees no GPU")
                .fact("count", 0i64)
                .fix("check that the GPU is visible (nvidia-smi) and not hidden by CUDA_VISIBLE_DEVICES"),
        );
    }
    for g in &c.gpus {
        b.add(
            Finding::new(
                "gpu",
                Status::Info,
                format!(
                    "GPU {}: {}, {} memory, PCI {}",
                    g.ordinal,
                    g.name,
                    human_bytes(g.total_mem),
                    g.pci_bus_id.as_deref().unwrap_or("unknown")
                ),
            )
            .fact("ordinal", i64::from(g.ordinal))
            .fact("name", g.name.clone())
            .fact("memory_bytes", g.total_mem as i64)
            .fact("pci_bus_id", g.pci_bus_id.clone())
            .fact("gpudirect_rdma_supported", g.attr(cuda::attr::GPU_DIRECT_RDMA_SUPPORTED).map(|a| a != 0)),
        );
    }
    let dmabuf_attr = c.gpus.iter().any(|g| g.attr(cuda::attr::DMA_BUF_SUPPORTED) == Some(1));
    let new_enough = v.is_some_and(|v| v >= DMABUF_MMAP_MIN_VERSION);
    let f = if new_enough && dmabuf_attr {
        Finding::new(
            "dma-buf",
            Status::Ok,
            format!(
                "driver API {vs} ≥ 13.3 and a GPU exports dma-bufs: the dma-buf mmap backend can work without gdrdrv"
            ),
        )
    } else if new_enough {
        Finding::new("dma-buf", Status::Fail, format!("driver API {vs} is new enough, but no GPU reports dma-buf support (attribute 124)"))
            .fix("dma-buf export needs the open-source NVIDIA kernel modules on a kernel with dma-buf support; otherwise use gdrdrv")
    } else {
        Finding::new("dma-buf", Status::Fail, format!("driver API {vs} is older than 13.3: the dma-buf mmap backend (gdrcopy 2.6) is not available"))
            .fix("install an NVIDIA driver that supports CUDA 13.3 or newer (then gdrcopy works without gdrdrv), or use gdrdrv")
    };
    b.blocks(Path::DmaBuf, f.fact("driver_version", v.map(i64::from)).fact("dma_buf_supported", dmabuf_attr));
    Some(c)
}

/// What was observed about the gdrdrv module and this environment's ability to load one: the
/// one source of the gdrdrv-module finding, whose words and JSON facts are both rendered from it
/// (`module_finding`), so the text can never say what the facts deny.
#[derive(Clone, Debug, Default)]
struct ModuleFacts {
    kver: String,
    loaded: bool,
    version: Option<String>,
    flavor: Option<String>,
    /// CAP_SYS_MODULE is in this process's effective set.
    cap_sys_module: bool,
    /// /lib/modules/<kver> exists (modprobe and dkms need it).
    module_tree: bool,
    /// An installed gdrdrv.ko for this kernel.
    installed: Option<String>,
    /// A gdrdrv-* source directory under /usr/src.
    sources: Option<String>,
}

impl ModuleFacts {
    fn gather(sys: &Sys, m: &Module, kver: &str) -> ModuleFacts {
        ModuleFacts {
            kver: kver.to_owned(),
            loaded: m.loaded,
            version: m.version.clone(),
            flavor: m.flavor.clone(),
            cap_sys_module: can_load_modules(sys),
            module_tree: sys.exists(&format!("/lib/modules/{kver}")),
            installed: installed_module(sys, kver),
            sources: sys.list("/usr/src").into_iter().find(|n| n.starts_with("gdrdrv-")),
        }
    }

    /// Why this environment cannot load a kernel module, in words; None when it can.
    fn load_blocker(&self) -> Option<String> {
        let mut why = Vec::new();
        if !self.cap_sys_module {
            why.push("no CAP_SYS_MODULE".to_owned());
        }
        if !self.module_tree {
            why.push(format!("no /lib/modules/{}", self.kver));
        }
        (!why.is_empty()).then(|| why.join(", "))
    }

    fn can_load_modules(&self) -> bool {
        self.load_blocker().is_none()
    }
}

/// Renders the gdrdrv-module finding, text and facts alike, from `f` alone.
fn module_finding(f: &ModuleFacts) -> Finding {
    let finding = if f.loaded {
        Finding::new(
            "gdrdrv-module",
            Status::Ok,
            format!(
                "gdrdrv {} is loaded{}",
                f.version.as_deref().unwrap_or("(no version)"),
                f.flavor.as_deref().map(|fl| format!(", built for the {fl} NVIDIA driver")).unwrap_or_default()
            ),
        )
    } else {
        let fix = if let Some(why) = f.load_blocker() {
            format!(
                "this environment cannot load kernel modules ({why}): install gdrdrv on the host (e.g. the gdrdrv-dkms package) and pass /dev/gdrdrv into the container (--device=/dev/gdrdrv)"
            )
        } else if let Some(p) = &f.installed {
            format!("it is installed ({p}): run 'modprobe gdrdrv' as root (the NVIDIA driver must be loaded first)")
        } else if let Some(s) = &f.sources {
            format!(
                "sources are in /usr/src/{s} but no module is built for kernel {}: install linux-headers-{} and run 'dkms autoinstall'",
                f.kver, f.kver
            )
        } else {
            "install the gdrdrv-dkms package (Debian/Ubuntu) or gdrcopy-kmod (RPM), which builds and loads it"
                .to_owned()
        };
        Finding::new("gdrdrv-module", Status::Fail, format!("gdrdrv is not loaded in kernel {}", f.kver)).fix(fix)
    };
    finding
        .fact("loaded", f.loaded)
        .fact("version", f.version.clone())
        .fact("flavor", f.flavor.clone())
        .fact("kernel", f.kver.clone())
        .fact("can_load_modules", f.can_load_modules())
        .fact("cap_sys_module", f.cap_sys_module)
        .fact("module_tree", f.module_tree)
        .fact("installed", f.installed.clone())
        .fact("sources", f.sources.clone())
}

fn module_checks(b: &mut Builder, sys: &Sys, m: &Module, kver: &str) {
    let kallsyms = sys.read("/proc/kallsyms");
    let owner = kallsyms.as_deref().and_then(|t| sys::kallsyms_owner(t, "nvidia_p2p_get_pages"));
    let facts = ModuleFacts::gather(sys, m, kver);
    let f = module_finding(&facts);
    if facts.loaded {
        b.add(f)
    } else {
        b.blocks(Path::Gdrdrv, f)
    }
    let f = match (&kallsyms, &owner, m.loaded) {
        (_, _, true) => Finding::new(
            "p2p-symbols",
            Status::Ok,
            format!(
                "gdrdrv resolved NVIDIA's nvidia_p2p_* symbols at load{}",
                owner.as_deref().map(|o| format!(" (exported by {o})")).unwrap_or_default()
            ),
        ),
        (None, _, false) => Finding::new("p2p-symbols", Status::Skip, "/proc/kallsyms is not readable: cannot tell whether the NVIDIA driver exports nvidia_p2p_*"),
        (Some(_), Some(o), false) => Finding::new("p2p-symbols", Status::Info, format!("nvidia_p2p_get_pages is exported by {o}: gdrdrv can resolve it when loaded")),
        (Some(_), None, false) => Finding::new("p2p-symbols", Status::Fail, "no loaded kernel code exports nvidia_p2p_get_pages: the NVIDIA kernel driver is not loaded here, so gdrdrv cannot load")
            .fix("load the NVIDIA kernel driver (modprobe nvidia); in a container, the host must run it"),
    };
    let fail = f.status == Status::Fail;
    let f = f.fact("exporter", owner);
    if fail { b.blocks(Path::Gdrdrv, f) } else { b.add(f) }
}

fn node_check(b: &mut Builder, sys: &Sys, m: &Module) {
    let node = sys.node(NODE);
    let f = match (node, m.major) {
        (None, Some(major)) => Finding::new("gdrdrv-node", Status::Fail, format!("gdrdrv is registered (major {major}) but {NODE} does not exist"))
            .fix(format!("the package's udev rule creates it on module load ('udevadm trigger --subsystem-match=module' re-runs it); by hand: mknod -m 666 {NODE} c {major} 0")),
        (None, None) => Finding::new("gdrdrv-node", Status::Fail, format!("{NODE} does not exist"))
            .fix("it appears when gdrdrv is loaded (see gdrdrv-module); in a container pass it with --device=/dev/gdrdrv"),
        (Some(n), _) if !n.is_char => Finding::new("gdrdrv-node", Status::Fail, format!("{NODE} exists but is not a character device"))
            .fix(format!("remove it (rm {NODE}) and reload gdrdrv")),
        (Some(n), Some(major)) if n.major != major || n.minor != 0 => Finding::new(
            "gdrdrv-node", Status::Fail,
            format!("{NODE} is char {}:{} but gdrdrv is registered as {major}:0 (a stale node from an earlier load)", n.major, n.minor))
            .fix(format!("rm {NODE}; mknod -m 666 {NODE} c {major} 0 (or reload gdrdrv with the packaged udev rule)")),
        (Some(n), reg) if !sys.can_rw(NODE) => Finding::new(
            "gdrdrv-node", Status::Fail,
            format!("{NODE} (mode {:04o}, owner {}:{}) is not readable and writable by this user", n.mode, n.uid, n.gid))
            .fact("registered_major", reg.map(i64::from))
            .fix(format!("upstream's installer makes it mode 0666: chmod 0666 {NODE}, or add this user to the node's group")),
        (Some(n), reg) => {
            let st = if reg.is_none() { Status::Fail } else if n.mode & 0o666 == 0o666 { Status::Ok } else { Status::Warn };
            let mut f = Finding::new("gdrdrv-node", st, format!("{NODE}: char {}:{}, mode {:04o}{}", n.major, n.minor, n.mode,
                if reg.is_none() { ", but no gdrdrv is registered in /proc/devices (stale node)" } else { "" }));
            if reg.is_none() {
                f = f.fix(format!("load gdrdrv, or remove the stale node (rm {NODE})"));
            } else if st == Status::Warn {
                f = f.fix(format!("this user may open it, others may not: upstream uses mode 0666 (chmod 0666 {NODE})"));
            }
            f
        }
    };
    let f = match node {
        Some(n) => f.fact("exists", true).fact("major", i64::from(n.major)).fact("mode", format!("{:04o}", n.mode)),
        None => f.fact("exists", false),
    };
    if f.status == Status::Fail { b.blocks(Path::Gdrdrv, f) } else { b.add(f) }
}

fn bar_checks(b: &mut Builder, sys: &Sys, c: &Cuda) {
    for g in &c.gpus {
        let Some(bus) = &g.pci_bus_id else { continue };
        let Some(res) = sys.read(&format!("/sys/bus/pci/devices/{bus}/resource")) else {
            b.add(Finding::new(
                "bar1",
                Status::Skip,
                format!("GPU {}: /sys/bus/pci/devices/{bus} is not visible here: BAR1 size unknown", g.ordinal),
            ));
            continue;
        };
        let Some(bar) = sys::memory_bar(&sys::pci_bars(&res)) else {
            b.add(Finding::new(
                "bar1",
                Status::Skip,
                format!("GPU {}: {bus} has no prefetchable memory BAR", g.ordinal),
            ));
            continue;
        };
        let f = if bar.size >= g.total_mem {
            Finding::new(
                "bar1",
                Status::Ok,
                format!(
                    "GPU {}: BAR1 (PCI resource {}) is {} for {} of memory: all of it can be pinned and mapped",
                    g.ordinal,
                    bar.index,
                    human_bytes(bar.size),
                    human_bytes(g.total_mem)
                ),
            )
        } else {
            Finding::new("bar1", Status::Warn, format!("GPU {}: BAR1 (PCI resource {}) is {} for {} of memory: at most that much (less what the driver reserves) can be pinned at once",
                g.ordinal, bar.index, human_bytes(bar.size), human_bytes(g.total_mem)))
                .fix("enable 'Above 4G decoding' and Resizable BAR in the firmware setup where the GPU supports a large BAR1; otherwise keep pinned buffers small and unpin them early")
        };
        b.add(
            f.fact("gpu", i64::from(g.ordinal))
                .fact("bar_index", bar.index as i64)
                .fact("bar_bytes", bar.size as i64)
                .fact("memory_bytes", g.total_mem as i64),
        );
    }
}

fn memops_check(b: &mut Builder, c: &Cuda) {
    use cuda::attr::*;
    for g in &c.gpus {
        let on = |a| g.attr(a) == Some(1);
        let v1 = on(CAN_USE_STREAM_MEM_OPS_V1);
        let w64 = on(CAN_USE_64_BIT_STREAM_MEM_OPS) || on(CAN_USE_64_BIT_STREAM_MEM_OPS_V1);
        let nor = on(CAN_USE_STREAM_WAIT_VALUE_NOR) || on(CAN_USE_STREAM_WAIT_VALUE_NOR_V1);
        let usable = c.memops_v2_entry_points || v1;
        let f = if usable {
            Finding::new(
                "stream-memops",
                if w64 { Status::Ok } else { Status::Warn },
                format!(
                    "GPU {}: stream memory operations available ({}); 64-bit: {}, wait NOR: {}, flush remote writes: {}",
                    g.ordinal,
                    if c.memops_v2_entry_points { "v2 entry points" } else { "v1, NVreg_EnableStreamMemOPs=1" },
                    yes(w64),
                    yes(nor),
                    yes(on(CAN_FLUSH_REMOTE_WRITES))
                ),
            )
        } else {
            Finding::new("stream-memops", Status::Fail, format!("GPU {}: no stream memory operations: libgdsync cannot post waits or writes", g.ordinal))
                .fix("use a driver with CUDA 11.7 or newer (v2 entry points), or load the nvidia module with NVreg_EnableStreamMemOPs=1")
        };
        let f = if usable && !w64 {
            f.fix("64-bit writes/waits are unavailable: libgdsync falls back to 32-bit operations (or set GDS_DISABLE_WRITE64=1)")
        } else {
            f
        };
        b.add(
            f.fact("gpu", i64::from(g.ordinal))
                .fact("usable", usable)
                .fact("write64", w64)
                .fact("wait_nor", nor)
                .fact("flush_remote_writes", on(CAN_FLUSH_REMOTE_WRITES))
                .fact("v2_entry_points", c.memops_v2_entry_points)
                .fact("attr_92", g.attr(CAN_USE_STREAM_MEM_OPS_V1).map(i64::from))
                .fact("attr_122", g.attr(CAN_USE_64_BIT_STREAM_MEM_OPS).map(i64::from))
                .fact("attr_123", g.attr(CAN_USE_STREAM_WAIT_VALUE_NOR).map(i64::from)),
        );
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn iommu_check(b: &mut Builder, sys: &Sys) {
    let units = sys.list("/sys/class/iommu");
    let groups = sys.list("/sys/kernel/iommu_groups");
    let mut types: Vec<String> = groups
        .iter()
        .filter_map(|g| sys.read(&format!("/sys/kernel/iommu_groups/{g}/type")))
        .map(|t| t.trim().to_owned())
        .collect();
    types.sort();
    types.dedup();
    let cmdline = sys.read("/proc/cmdline").unwrap_or_default();
    let params: Vec<&str> = cmdline.split_whitespace().filter(|w| w.contains("iommu")).collect();
    let f = if units.is_empty() && groups.is_empty() {
        Finding::new("iommu", Status::Ok, "no IOMMU is active: device DMA is not translated")
    } else if !types.is_empty() && types.iter().all(|t| t == "identity") {
        Finding::new("iommu", Status::Ok, "IOMMU active in passthrough (identity) mode")
    } else {
        Finding::new("iommu", Status::Warn, format!("IOMMU translates device DMA ({}): gdrcopy's CPU mappings are unaffected, but a NIC's GPUDirect RDMA into GPU memory may fail or be slow",
            if types.is_empty() { "type unknown".to_owned() } else { types.join(", ") }))
            .fix("for GPUDirect RDMA boot with iommu=pt (passthrough), as NVIDIA recommends")
    };
    b.add(
        f.fact("units", units.len() as i64)
            .fact("groups", groups.len() as i64)
            .fact("types", types.join(","))
            .fact("cmdline", params.join(" ")),
    );
}

fn rdma_check(b: &mut Builder, sys: &Sys) {
    let devs = sys.list("/sys/class/infiniband");
    let described: Vec<(String, String)> = devs
        .iter()
        .map(|d| {
            (
                d.clone(),
                sys.link_name(&format!("/sys/class/infiniband/{d}/device/driver")).unwrap_or_else(|| "virtual".into()),
            )
        })
        .collect();
    let mlx5: Vec<&str> = described
        .iter()
        .filter(|(n, drv)| drv.starts_with("mlx5") || n.starts_with("mlx5"))
        .map(|(n, _)| n.as_str())
        .collect();
    let verbs = gpudirect_common::dl::Library::open("libibverbs.so.1").is_ok();
    let list = described.iter().map(|(n, d)| format!("{n} ({d})")).collect::<Vec<_>>().join(", ");
    let f = if devs.is_empty() {
        Finding::new("rdma", Status::Info, "no RDMA device: libgdsync's QP/CQ half has nothing to drive (the memory operations still work)")
            .fix("for GPUDirect Async across the network: an RDMA NIC with its driver (mlx5_ib for ConnectX), or soft-RoCE for tests (rdma link add rxe0 type rxe netdev <if>)")
    } else if mlx5.is_empty() {
        Finding::new(
            "rdma",
            Status::Info,
            format!(
                "RDMA devices: {list}; none is mlx5, so GDS_PROVIDER=mlx5 cannot be used (libgdsync uses its CPU-proxy provider)"
            ),
        )
    } else {
        Finding::new("rdma", Status::Ok, format!("RDMA devices: {list}; GDS_PROVIDER=mlx5 can use {}", mlx5.join(", ")))
    };
    let f = if !verbs && !devs.is_empty() {
        Finding { status: Status::Warn, ..f }.fix("libibverbs.so.1 is missing: install rdma-core (Debian: libibverbs1)")
    } else {
        f
    };
    b.add(f.fact("devices", devs.join(",")).fact("mlx5", !mlx5.is_empty()).fact("libibverbs", verbs));
}

/// Asks libgdrapi which backend it opens and tries a real round trip; returns the working path.
fn library_checks(b: &mut Builder, cuda: Option<&Cuda>, m: &Module) -> Option<&'static str> {
    let api = match GdrApi::load() {
        Ok(a) => a,
        Err(e) => {
            b.add(
                Finding::new("libgdrapi", Status::Fail, "libgdrapi.so.2 cannot be loaded")
                    .fact("error", e)
                    .fix("install libgdrapi2 (Debian/Ubuntu) or gdrcopy (RPM), or ./build.sh install; then ldconfig"),
            );
            return None;
        }
    };
    let rv = api.runtime_version;
    b.add(
        Finding::new(
            "libgdrapi",
            Status::Ok,
            format!("libgdrapi.so.2 loaded, API {}", rv.map_or("unknown".into(), |(a, c)| format!("{a}.{c}"))),
        )
        .fact("api_version", rv.map(|(a, c)| format!("{a}.{c}"))),
    );

    let buf = cuda.filter(|c| !c.gpus.is_empty()).map(|c| c.alloc(2 * GPU_PAGE));
    let aligned = match &buf {
        Some(Ok(d)) => Some((d.ptr + GPU_PAGE as u64 - 1) & !(GPU_PAGE as u64 - 1)),
        _ => None,
    };
    let forced = std::env::var("GDRCOPY_USE_DMABUF_MMAP").is_ok_and(|v| v == "1");
    let out: OpenOutcome = api.open_and_try(aligned);
    match out.backend {
        None => b.add(
            Finding::new(
                "backend",
                Status::Fail,
                format!(
                    "gdr_open fails ({}): neither gdrdrv nor the dma-buf backend can be used",
                    std::io::Error::from_raw_os_error(out.errno)
                ),
            )
            .fact("errno", i64::from(out.errno))
            .fact("forced_dmabuf", forced)
            .fix("make one path work: gdrdrv (see gdrdrv-module, gdrdrv-node) or a CUDA ≥ 13.3 driver (see dma-buf)"),
        ),
        Some(p) => {
            let mut f = Finding::new(
                "backend",
                Status::Ok,
                format!(
                    "gdr_open picks the {p} backend{}{}",
                    out.driver_version.map(|(a, c)| format!(" (driver reports {a}.{c})")).unwrap_or_default(),
                    if forced { ", forced by GDRCOPY_USE_DMABUF_MMAP=1" } else { "" }
                ),
            );
            if let (Some((dm, dn)), Some((lm, ln))) = (out.driver_version, rv) {
                if dm < 2 {
                    f = Finding { status: Status::Fail, ..f }.fix("gdrdrv is older than 2.0, which this library refuses: install the gdrdrv that matches the library");
                } else if (dm, dn) < (lm, ln) {
                    f = Finding { status: Status::Warn, ..f }.fix(format!("gdrdrv {dm}.{dn} is older than the library ({lm}.{ln}): features added since (pin flags, attributes) are off; install the matching gdrdrv-dkms"));
                }
            }
            b.add(
                f.fact("backend", p)
                    .fact("driver_version", out.driver_version.map(|(a, c)| format!("{a}.{c}")))
                    .fact("module_version", m.version.clone()),
            );
        }
    }
    match (&buf, &out.round_trip) {
        (None, _) => {
            b.add(Finding::new("round-trip", Status::Skip, "no GPU to allocate memory on: pin/map/copy not tried"));
            None
        }
        (Some(Err(e)), _) => {
            b.add(Finding::new("round-trip", Status::Fail, format!("cannot allocate GPU memory for the test: {e}")));
            None
        }
        (Some(Ok(_)), None) => {
            b.add(Finding::new("round-trip", Status::Skip, "gdr_open failed: pin/map/copy not tried"));
            None
        }
        (Some(Ok(_)), Some(Err(e))) => {
            b.add(Finding::new("round-trip", Status::Fail, format!("pin/map/copy of one 64 KiB GPU page failed: {e}"))
                .fix("set GDRCOPY_ENABLE_LOGGING=1 GDRCOPY_LOG_LEVEL=1 and look at dmesg for gdrdrv lines; on consumer GPUs nvidia_p2p_get_pages refuses (GPUDirect RDMA is a data-center/RTX-pro feature)"));
            None
        }
        (Some(Ok(_)), Some(Ok(n))) => {
            b.add(
                Finding::new(
                    "round-trip",
                    Status::Ok,
                    format!(
                        "pinned, mapped and copied {n} bytes to and from GPU memory through {}",
                        out.backend.unwrap_or("?")
                    ),
                )
                .fact("bytes", *n as i64),
            );
            out.backend
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;

    /// The value of `key` in the one finding's "facts" object of `json`, as JSON text.
    fn json_fact(json: &str, key: &str) -> String {
        let facts = &json[json.find("\"facts\":{").expect("facts object")..];
        let at = facts.find(&format!("\"{key}\":")).unwrap_or_else(|| panic!("no fact {key} in {json}"));
        let v = &facts[at + key.len() + 3..];
        if let Some(rest) = v.strip_prefix('"') {
            format!("\"{}\"", &rest[..rest.find('"').expect("closing quote")])
        } else {
            v[..v.find([',', '}']).expect("value end")].to_owned()
        }
    }

    fn unquote(v: &str) -> Option<&str> {
        (v != "null").then(|| v.trim_matches('"'))
    }

    /// Every combination of what the gdrdrv-module check can observe.
    fn all_module_facts() -> Vec<ModuleFacts> {
        let mut out = Vec::new();
        for bits in 0u32..128 {
            let bit = |n: u32| bits & (1 << n) != 0;
            out.push(ModuleFacts {
                kver: "6.1.0-test".into(),
                loaded: bit(0),
                cap_sys_module: bit(1),
                module_tree: bit(2),
                installed: bit(3).then(|| "/lib/modules/6.1.0-test/updates/dkms/gdrdrv.ko.xz".into()),
                sources: bit(4).then(|| "gdrdrv-2.6".into()),
                version: bit(5).then(|| "2.6".into()),
                flavor: bit(6).then(|| "opensource".into()),
            });
        }
        out
    }

    #[test]
    fn module_text_and_json_agree_on_every_fact() {
        for mf in all_module_facts() {
            let f = module_finding(&mf);
            let text = format!("{} {}", f.summary, f.fix.clone().unwrap_or_default());
            let json = Report { findings: vec![f], working_path: None, verdict: String::new() }.json();
            let ctx = format!("{mf:?}\ntext: {text}\njson: {json}");
            let flag = |k: &str| match json_fact(&json, k).as_str() {
                "true" => true,
                "false" => false,
                v => panic!("{k} is {v}, not a bool\n{ctx}"),
            };

            let loaded = flag("loaded");
            assert_eq!(loaded, mf.loaded, "{ctx}");
            assert_eq!(text.contains("is not loaded"), !loaded, "{ctx}");
            assert_eq!(text.contains(" is loaded"), loaded, "{ctx}");
            assert_eq!(unquote(&json_fact(&json, "kernel")), Some("6.1.0-test"), "{ctx}");
            if !loaded {
                assert!(text.contains("kernel 6.1.0-test"), "{ctx}");
            }

            // The defect: text said "cannot load kernel modules" while the JSON said it could.
            let can_load = flag("can_load_modules");
            assert_eq!(can_load, mf.cap_sys_module && mf.module_tree, "{ctx}");
            assert_eq!(text.contains("cannot load kernel modules"), !loaded && !can_load, "{ctx}");
            assert_eq!(flag("cap_sys_module"), mf.cap_sys_module, "{ctx}");
            assert_eq!(text.contains("no CAP_SYS_MODULE"), !loaded && !flag("cap_sys_module"), "{ctx}");
            assert_eq!(flag("module_tree"), mf.module_tree, "{ctx}");
            assert_eq!(text.contains("no /lib/modules/6.1.0-test"), !loaded && !flag("module_tree"), "{ctx}");

            let installed = json_fact(&json, "installed");
            assert_eq!(unquote(&installed), mf.installed.as_deref(), "{ctx}");
            let says_installed = text.contains("it is installed (");
            if says_installed {
                assert!(text.contains(unquote(&installed).expect("text names an install the JSON lacks")), "{ctx}");
            }
            assert_eq!(says_installed, !loaded && can_load && unquote(&installed).is_some(), "{ctx}");

            let sources = json_fact(&json, "sources");
            assert_eq!(unquote(&sources), mf.sources.as_deref(), "{ctx}");
            let says_sources = text.contains("sources are in /usr/src/");
            if says_sources {
                assert!(text.contains(unquote(&sources).expect("text names sources the JSON lacks")), "{ctx}");
            }
            assert_eq!(
                says_sources,
                !loaded && can_load && unquote(&installed).is_none() && unquote(&sources).is_some(),
                "{ctx}"
            );

            let version = json_fact(&json, "version");
            assert_eq!(unquote(&version), mf.version.as_deref(), "{ctx}");
            if loaded {
                let shown = unquote(&version).unwrap_or("(no version)");
                assert!(text.contains(&format!("gdrdrv {shown} is loaded")), "{ctx}");
            }
            let flavor = json_fact(&json, "flavor");
            assert_eq!(unquote(&flavor), mf.flavor.as_deref(), "{ctx}");
            assert_eq!(
                text.contains("built for the opensource NVIDIA driver"),
                loaded && unquote(&flavor).is_some(),
                "{ctx}"
            );
        }
    }

    /// The GPU machine's case: CAP_SYS_MODULE held, but no module tree for the running kernel.
    #[test]
    fn no_module_tree_means_modules_cannot_be_loaded() {
        let mf = ModuleFacts { kver: "6.18.44".into(), cap_sys_module: true, module_tree: false, ..Default::default() };
        let json = Report { findings: vec![module_finding(&mf)], working_path: None, verdict: String::new() }.json();
        assert_eq!(json_fact(&json, "can_load_modules"), "false", "{json}");
        assert!(json.contains("cannot load kernel modules (no /lib/modules/6.18.44)"), "{json}");
    }
}
