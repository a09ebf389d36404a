//! Why GPU-initiated storage (libnvm) can or cannot work here: NVMe controllers and the driver
//! each is bound to, the libnvm helper module and its ABI (NVM_GET_VERSION), whether it maps GPU
//! memory, the IOMMU in front of each controller, and the BAR sizes (docs/libnvm-module.md,
//! docs/storage.md).
//!
//! [`StorageFacts::gather`] reads everything once; [`findings`] renders text and JSON facts from
//! that one value only.

use crate::report::{Finding, Status};
use crate::sys::{self, Bar, Sys, human_bytes};
use std::path::Path;

/// The PCI driver, chrdev region and class name of the helper module (ours and upstream's).
pub const HELPER: &str = "libnvm helper";
const NVME_CLASS: &str = "0x010802";
const FEATURE_DEVICE_MEMORY: u32 = 0x1;

/// What NVM_GET_VERSION answered on the controller's node.
#[derive(Clone, Debug, PartialEq)]
pub enum AbiProbe {
    /// No node to ask (module not loaded, or the controller is not bound to it).
    NotTried,
    /// Our module: (abi_major, abi_minor, features).
    Version(u32, u32, u32),
    /// EINVAL: upstream's module (ABI 1.0, no feature report).
    Upstream,
    /// Another errno (EACCES: the node is root's).
    Error(i32),
}

/// What NVM_GET_VERSION returns: (abi_major, abi_minor, features) or the errno.
pub type AbiAnswer = std::io::Result<(u32, u32, u32)>;

#[derive(Clone, Debug, PartialEq)]
pub struct Controller {
    pub bdf: String,
    pub driver: Option<String>,
    pub bars: Vec<Bar>,
    /// /dev/libnvmN when bound to the helper.
    pub node: Option<String>,
    pub iommu_group: Option<String>,
    /// The group's type: identity, DMA, DMA-FQ, unmanaged (vfio).
    pub iommu_type: Option<String>,
    pub abi: AbiProbe,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct StorageFacts {
    pub module_loaded: bool,
    pub module_version: Option<String>,
    pub controllers: Vec<Controller>,
    /// IOMMU units present (/sys/class/iommu).
    pub iommu_units: usize,
    /// Who exports nvidia_p2p_get_pages (nvidia, or gpusim in the test VM).
    pub p2p_exporter: Option<String>,
}

impl StorageFacts {
    /// `ask` runs NVM_GET_VERSION on a node path (real: [`crate::nvm_ioctl::get_version`]).
    pub fn gather(sys: &Sys, ask: &dyn Fn(&Path) -> AbiAnswer) -> StorageFacts {
        let module_loaded = sys.exists("/sys/module/libnvm");
        let controllers = sys
            .list("/sys/bus/pci/devices")
            .into_iter()
            .filter(|b| sys.read(&format!("/sys/bus/pci/devices/{b}/class")).is_some_and(|c| c.trim() == NVME_CLASS))
            .map(|bdf| {
                let d = format!("/sys/bus/pci/devices/{bdf}");
                let driver = sys.link_name(&format!("{d}/driver"));
                let node = sys
                    .list(&format!("{d}/{HELPER}"))
                    .into_iter()
                    .find(|n| n.starts_with("libnvm"))
                    .map(|n| format!("/dev/{n}"));
                let iommu_group = sys.link_name(&format!("{d}/iommu_group"));
                let iommu_type = iommu_group
                    .as_ref()
                    .and_then(|g| sys.read(&format!("/sys/kernel/iommu_groups/{g}/type")))
                    .map(|t| t.trim().to_owned());
                let abi = match &node {
                    Some(n) if module_loaded => match ask(&sys.path(n)) {
                        Ok((a, b, f)) => AbiProbe::Version(a, b, f),
                        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => AbiProbe::Upstream,
                        Err(e) => AbiProbe::Error(e.raw_os_error().unwrap_or(0)),
                    },
                    _ => AbiProbe::NotTried,
                };
                Controller {
                    bars: sys.read(&format!("{d}/resource")).map(|t| sys::pci_bars(&t)).unwrap_or_default(),
                    bdf,
                    driver,
                    node,
                    iommu_group,
                    iommu_type,
                    abi,
                }
            })
            .collect();
        StorageFacts {
            module_loaded,
            module_version: sys.read("/sys/module/libnvm/version").map(|v| v.trim().to_owned()),
            controllers,
            iommu_units: sys.list("/sys/class/iommu").len(),
            p2p_exporter: sys.read("/proc/kallsyms").and_then(|t| sys::kallsyms_owner(&t, "nvidia_p2p_get_pages")),
        }
    }
}

fn bars_words(bars: &[Bar]) -> String {
    if bars.is_empty() {
        return "no memory BAR".into();
    }
    bars.iter()
        .map(|b| format!("BAR{} {}{}", b.index, human_bytes(b.size), if b.prefetchable { " prefetchable" } else { "" }))
        .collect::<Vec<_>>()
        .join(", ")
}

fn errno_words(e: i32) -> String {
    std::io::Error::from_raw_os_error(e).to_string()
}

/// The findings of the storage report, all rendered from `f`. The first one, `storage`, is the
/// conclusion; the others are its evidence.
pub fn findings(f: &StorageFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let helper_ctrls: Vec<&Controller> = f.controllers.iter().filter(|c| c.driver.as_deref() == Some(HELPER)).collect();
    let abi =
        helper_ctrls.iter().map(|c| &c.abi).find(|a| **a != AbiProbe::NotTried).cloned().unwrap_or(AbiProbe::NotTried);
    let gpu_feature = match abi {
        AbiProbe::Version(_, _, feat) => Some(feat & FEATURE_DEVICE_MEMORY != 0),
        _ => None,
    };

    // Why not, first reason first.
    let mut blockers: Vec<(String, String)> = Vec::new();
    if f.controllers.is_empty() {
        blockers.push((
            "no NVMe controller (PCI class 0x010802) on this machine".into(),
            "GPU-initiated storage needs an NVMe SSD".into(),
        ));
    }
    if !f.module_loaded {
        blockers.push((
            "the libnvm helper module is not loaded".into(),
            "build and load it: make -C kmod/libnvm KBUILD_EXTRA_SYMBOLS=<NVIDIA's Module.symvers> install; modprobe libnvm (or the module-free paths: sysfs BAR0 + pagemap, vfio)".into(),
        ));
    }
    if !f.controllers.is_empty() && helper_ctrls.is_empty() {
        let c = &f.controllers[0];
        blockers.push((
            format!("no NVMe controller is bound to \"{HELPER}\" ({} is bound to {})", c.bdf, c.driver.as_deref().unwrap_or("no driver")),
            format!("echo {b} > /sys/bus/pci/devices/{b}/driver/unbind; echo '{HELPER}' > /sys/bus/pci/devices/{b}/driver_override; echo {b} > '/sys/bus/pci/drivers/{HELPER}/bind' (unmount its file systems first)", b = c.bdf),
        ));
    }
    match &abi {
        AbiProbe::Version(maj, min, _) if *maj != 1 => blockers.push((
            format!("the module speaks ABI {maj}.{min}; this libnvm needs 1.x"),
            "install the libnvm module that matches the library".into(),
        )),
        AbiProbe::Error(e) => blockers.push((
            format!("NVM_GET_VERSION on the controller's node failed: {}", errno_words(*e)),
            "the nodes are root's (mode 0600): run as root, or give the user access to /dev/libnvm*".into(),
        )),
        _ => {}
    }
    if gpu_feature == Some(false) {
        blockers.push((
            "the module was built without GPU memory support (no nv-p2p): NVM_MAP_DEVICE_MEMORY answers EINVAL".into(),
            "rebuild it with KBUILD_EXTRA_SYMBOLS naming the NVIDIA driver's Module.symvers".into(),
        ));
    }
    if f.p2p_exporter.is_none() && f.module_loaded {
        blockers.push((
            "no loaded code exports nvidia_p2p_get_pages: the NVIDIA kernel driver is not loaded".into(),
            "modprobe nvidia".into(),
        ));
    }
    let works = blockers.is_empty() && gpu_feature == Some(true);
    let conclusion = if works {
        let c = helper_ctrls[0];
        Finding::new(
            "storage",
            Status::Ok,
            format!(
                "GPU-initiated storage can work: {} bound to \"{HELPER}\" ({}), module ABI with GPU memory",
                c.bdf,
                c.node.as_deref().unwrap_or("?")
            ),
        )
    } else if let Some((why, fix)) = blockers.first() {
        Finding::new("storage", Status::Fail, format!("GPU-initiated storage cannot work: {why}")).fix(fix.clone())
    } else {
        // Upstream's module: it works, but cannot say whether it maps GPU memory.
        Finding::new("storage", Status::Warn, "GPU-initiated storage may work: upstream's libnvm module (no version ioctl) cannot say whether it maps GPU memory")
            .fix("install our kmod/libnvm, which reports its features, or check that upstream's module was built with CUDA")
    };
    out.push(
        conclusion
            .fact("works", works)
            .fact("reasons", blockers.iter().map(|(w, _)| w.as_str()).collect::<Vec<_>>().join("; "))
            .fact("controllers", f.controllers.len() as i64)
            .fact("bound_to_helper", helper_ctrls.len() as i64),
    );

    let (abi_words, abi_major, abi_minor, features) = match &abi {
        AbiProbe::NotTried => ("not asked (no controller bound to it)".to_owned(), None, None, None),
        AbiProbe::Version(a, b, feat) => (format!("ABI {a}.{b}, features 0x{feat:x}"), Some(*a), Some(*b), Some(*feat)),
        AbiProbe::Upstream => {
            ("upstream's module (EINVAL to NVM_GET_VERSION: ABI 1.0, no feature report)".to_owned(), None, None, None)
        }
        AbiProbe::Error(e) => (format!("NVM_GET_VERSION failed: {}", errno_words(*e)), None, None, None),
    };
    let m = if f.module_loaded {
        Finding::new(
            "libnvm-module",
            match &abi {
                AbiProbe::Version(1, _, _) => Status::Ok,
                AbiProbe::NotTried => Status::Info,
                AbiProbe::Upstream => Status::Warn,
                _ => Status::Fail,
            },
            format!("libnvm {} is loaded; {abi_words}", f.module_version.as_deref().unwrap_or("(no version)")),
        )
    } else {
        Finding::new("libnvm-module", Status::Fail, "the libnvm helper module (/dev/libnvmN) is not loaded")
    };
    out.push(
        m.fact("loaded", f.module_loaded)
            .fact("version", f.module_version.clone())
            .fact("abi_major", abi_major.map(i64::from))
            .fact("abi_minor", abi_minor.map(i64::from))
            .fact("features", features.map(i64::from))
            .fact("gpu_memory", gpu_feature)
            .fact("upstream_module", abi == AbiProbe::Upstream)
            .fact("p2p_exporter", f.p2p_exporter.clone()),
    );

    for c in &f.controllers {
        let drv = c.driver.as_deref().unwrap_or("no driver");
        let iommu = match (&c.iommu_group, c.iommu_type.as_deref()) {
            (None, _) => "no IOMMU group (DMA is not translated)".to_owned(),
            (Some(g), Some("identity")) => format!("IOMMU group {g}, passthrough"),
            (Some(g), t) => format!("IOMMU group {g}, type {}: DMA is translated", t.unwrap_or("unknown")),
        };
        let status = match c.driver.as_deref() {
            Some(HELPER) => Status::Ok,
            Some("nvme") | None | Some("vfio-pci") => Status::Info,
            Some(_) => Status::Warn,
        };
        let role = match c.driver.as_deref() {
            Some(HELPER) => "usable by libnvm through the module",
            Some("nvme") => "in use by the kernel's nvme driver",
            Some("vfio-pci") => "usable by libnvm's vfio path",
            None => "unbound: usable by the module-free paths (sysfs BAR0)",
            Some(_) => "held by another driver",
        };
        let mut fnd = Finding::new(
            "nvme",
            status,
            format!("NVMe {}: driver {drv} ({role}); {}; {iommu}", c.bdf, bars_words(&c.bars)),
        )
        .fact("bdf", c.bdf.clone())
        .fact("driver", c.driver.clone())
        .fact("node", c.node.clone())
        .fact("bar0_bytes", c.bars.iter().find(|b| b.index == 0).map(|b| b.size as i64))
        .fact("bars", c.bars.iter().map(|b| format!("{}:{}", b.index, b.size)).collect::<Vec<_>>().join(","))
        .fact("iommu_group", c.iommu_group.clone())
        .fact("iommu_type", c.iommu_type.clone());
        if c.iommu_group.is_some()
            && c.iommu_type.as_deref() != Some("identity")
            && c.driver.as_deref() != Some("vfio-pci")
        {
            fnd = fnd.fix("DMA through the IOMMU: the module and vfio paths work; the /proc/self/pagemap path (physical = bus address) does not (boot with iommu=pt, or use the module)");
        }
        out.push(fnd);
    }
    if f.controllers.is_empty() {
        out.push(Finding::new("nvme", Status::Info, "no NVMe controller").fact("iommu_units", f.iommu_units as i64));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Report, Value};
    use crate::sys::fixture::Tree;

    const BDF: &str = "0000:00:04.0";
    /// QEMU's nvme: BAR0 16 KiB registers (64-bit), BAR2 1 MiB CMB (prefetchable).
    const RESOURCE: &str = "0x00000000febf0000 0x00000000febf3fff 0x0000000000140204\n\
                            0x0000000000000000 0x0000000000000000 0x0000000000000000\n\
                            0x00000000fe000000 0x00000000fe0fffff 0x000000000014220c\n";

    fn ctrl(t: &Tree, driver: Option<&str>) {
        let d = format!("sys/bus/pci/devices/{BDF}");
        t.file(&format!("{d}/class"), "0x010802\n").file(&format!("{d}/resource"), RESOURCE);
        // Another PCI function that is not NVMe.
        t.file("sys/bus/pci/devices/0000:00:02.0/class", "0x030000\n");
        if let Some(drv) = driver {
            t.link(&format!("{d}/driver"), &format!("../../../bus/pci/drivers/{drv}"));
            if drv == HELPER {
                t.file(&format!("{d}/{HELPER}/libnvm0/dev"), "240:0\n");
            }
        }
    }

    fn module(t: &Tree) {
        t.file("sys/module/libnvm/version", "0.3\n")
            .file("proc/kallsyms", "ffffffffc0a01000 T nvidia_p2p_get_pages\t[gpusim]\n");
    }

    fn run(t: &Tree, answer: std::io::Result<(u32, u32, u32)>) -> (Vec<Finding>, String, String) {
        let answer = std::cell::RefCell::new(Some(answer));
        let ask = |p: &Path| {
            assert!(p.ends_with("dev/libnvm0"), "asked {p:?}");
            assert!(p.starts_with(t.root()), "asked outside the fixture: {p:?}");
            answer.borrow_mut().take().expect("asked twice")
        };
        let f = StorageFacts::gather(&Sys::with_root(t.root()), &ask);
        let v = findings(&f);
        let r = Report { findings: v.clone(), working_path: None, verdict: String::new() };
        (v, r.human(), r.json())
    }

    fn fact<'a>(f: &'a Finding, k: &str) -> &'a Value {
        &f.facts.iter().find(|(n, _)| *n == k).unwrap_or_else(|| panic!("no fact {k} in {f:?}")).1
    }

    #[test]
    fn vm_like_machine_works() {
        let t = Tree::new("sto-vm");
        ctrl(&t, Some(HELPER));
        module(&t);
        let (v, text, json) = run(&t, Ok((1, 0, 7)));
        assert_eq!(v[0].check, "storage");
        assert_eq!(v[0].status, Status::Ok, "{:?}", v[0]);
        assert!(v[0].summary.contains("0000:00:04.0 bound to \"libnvm helper\" (/dev/libnvm0)"), "{}", v[0].summary);
        assert_eq!(v[1].status, Status::Ok);
        assert!(v[1].summary.contains("libnvm 0.3 is loaded; ABI 1.0, features 0x7"), "{}", v[1].summary);
        assert_eq!(fact(&v[1], "gpu_memory"), &Value::Bool(true));
        assert_eq!(fact(&v[1], "p2p_exporter"), &Value::Str("gpusim".into()));
        assert_eq!(v.iter().filter(|f| f.check == "nvme").count(), 1, "only the NVMe function: {v:?}");
        assert!(text.contains("BAR0 16 KiB, BAR2 1 MiB prefetchable; no IOMMU group"), "{text}");
        assert!(json.contains("\"bar0_bytes\":16384"), "{json}");
        assert!(json.contains("\"bars\":\"0:16384,2:1048576\""), "{json}");
        assert!(text.contains("GPU-initiated storage (libnvm):"), "{text}");
    }

    #[test]
    fn nvme_driver_no_module_and_a_translating_iommu() {
        let t = Tree::new("sto-nvme");
        ctrl(&t, Some("nvme"));
        t.link(&format!("sys/bus/pci/devices/{BDF}/iommu_group"), "../../../kernel/iommu_groups/7")
            .file("sys/kernel/iommu_groups/7/type", "DMA-FQ\n")
            .dir("sys/class/iommu/dmar0");
        let (v, _, _) = run(&t, Ok((9, 9, 9)));
        assert_eq!(v[0].status, Status::Fail);
        assert!(v[0].summary.contains("the libnvm helper module is not loaded"), "{}", v[0].summary);
        let reasons = fact(&v[0], "reasons");
        assert!(matches!(reasons, Value::Str(r) if r.contains("0000:00:04.0 is bound to nvme")), "{reasons:?}");
        let n = v.iter().find(|f| f.check == "nvme").expect("nvme finding");
        assert!(n.summary.contains("driver nvme (in use by the kernel's nvme driver)"), "{}", n.summary);
        assert!(n.summary.contains("IOMMU group 7, type DMA-FQ"), "{}", n.summary);
        assert!(n.fix.as_deref().is_some_and(|f| f.contains("pagemap")), "{n:?}");
        assert_eq!(fact(n, "iommu_type"), &Value::Str("DMA-FQ".into()));
    }

    #[test]
    fn module_without_gpu_memory() {
        let t = Tree::new("sto-nogpu");
        ctrl(&t, Some(HELPER));
        module(&t);
        let (v, _, _) = run(&t, Ok((1, 0, 6)));
        assert_eq!(v[0].status, Status::Fail);
        assert!(v[0].summary.contains("built without GPU memory support"), "{}", v[0].summary);
        assert_eq!(fact(&v[1], "gpu_memory"), &Value::Bool(false));
    }

    #[test]
    fn abi_mismatch_and_permission() {
        let t = Tree::new("sto-abi");
        ctrl(&t, Some(HELPER));
        module(&t);
        let (v, _, _) = run(&t, Ok((2, 0, 7)));
        assert!(v[0].summary.contains("ABI 2.0; this libnvm needs 1.x"), "{}", v[0].summary);
        assert_eq!(v[1].status, Status::Fail);
        let (v, _, _) = run(&t, Err(std::io::Error::from_raw_os_error(libc::EACCES)));
        assert!(
            v[0].summary.contains("NVM_GET_VERSION on the controller's node failed: Permission denied"),
            "{}",
            v[0].summary
        );
        assert!(v[0].fix.as_deref().is_some_and(|f| f.contains("root")));
    }

    #[test]
    fn no_controller_at_all() {
        let t = Tree::new("sto-none");
        let (v, _, json) = run(&t, Ok((1, 0, 7)));
        assert!(v[0].summary.contains("no NVMe controller"), "{}", v[0].summary);
        assert!(json.contains("\"works\":false"), "{json}");
    }

    #[test]
    fn upstream_module_is_a_warning_not_a_failure() {
        let f = StorageFacts {
            module_loaded: true,
            module_version: Some("0.3".into()),
            controllers: vec![Controller {
                bdf: "0000:00:04.0".into(),
                driver: Some(HELPER.into()),
                bars: vec![Bar { index: 0, size: 16384, prefetchable: false }],
                node: Some("/dev/libnvm0".into()),
                iommu_group: None,
                iommu_type: None,
                abi: AbiProbe::Upstream,
            }],
            iommu_units: 0,
            p2p_exporter: Some("nvidia".into()),
        };
        let v = findings(&f);
        assert_eq!(v[0].status, Status::Warn, "{:?}", v[0]);
        assert_eq!(v[1].status, Status::Warn);
        assert!(v[1].summary.contains("upstream's module"), "{}", v[1].summary);
        assert!(v[2].summary.contains("BAR0 16 KiB"), "{}", v[2].summary);
    }
}
