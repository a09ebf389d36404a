//! Can an RDMA device here register GPU memory, and how? Peer-memory clients (nv_peer_mem's
//! nv_mem / nv_mem_nc, nvidia-peermem), the kernel's dma-buf MR importer and each provider's
//! support for it, and what NCCL, UCX, NVSHMEM and libfabric conclude from their own probes
//! (../shared/spec/peer-memory.md §4, §7, §12.6, §13).
//!
//! [`RegFacts::gather`] reads everything once; [`findings`] renders text and JSON facts from
//! that one value only, so the words can never say what the facts deny.

use crate::report::{Finding, Status};
use crate::sys::{self, Sys};
use crate::verbs::DmaBufProbe;

/// What the verbs probes answered: per device name, or why they could not run.
pub type ProbeAnswer = Result<Vec<(String, DmaBufProbe)>, String>;

pub const MEMORY_PEERS: &str = "/sys/kernel/mm/memory_peers";
const SYM_PEER_CORE: &str = "ib_register_peer_memory_client";
const SYM_DMABUF_IMPORTER: &str = "ib_umem_dmabuf_get";

/// One client directory under /sys/kernel/mm/memory_peers.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PeerClient {
    pub name: String,
    pub version: Option<String>,
    pub num_alloc_mrs: Option<u64>,
    pub num_reg_bytes: Option<u64>,
    pub num_free_callbacks: Option<u64>,
}

/// nvidia-peermem's identity and parameters (/sys/module/nvidia_peermem).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NvidiaPeermem {
    pub version: Option<String>,
    pub persistent_api_support: Option<i64>,
    pub peerdirect_support: Option<i64>,
}

/// Whether a provider can import dma-bufs (reg_user_mr_dmabuf), from the kernel's sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaBufSupport {
    Yes,
    No,
    Unknown,
}

impl DmaBufSupport {
    fn word(self) -> &'static str {
        match self {
            DmaBufSupport::Yes => "yes",
            DmaBufSupport::No => "no",
            DmaBufSupport::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct RdmaDevice {
    pub name: String,
    /// The provider: the driver behind /sys/class/infiniband/<dev>/device, or the name's prefix
    /// for software devices (rxe, siw) that have no device link.
    pub provider: String,
    /// From the provider table.
    pub dmabuf: DmaBufSupport,
    /// NCCL's and UCX's own probes on this device, when libibverbs could run them.
    pub probe: Option<DmaBufProbe>,
}

impl RdmaDevice {
    /// Whether GPU memory registers through dma-buf here: the probe's answer (NCCL's rule)
    /// when it ran, else the kernel's importer and the provider table.
    fn dmabuf_ok(&self, importer: bool) -> bool {
        match self.probe {
            Some(p) => p.nccl_supported(),
            None => importer && self.dmabuf == DmaBufSupport::Yes,
        }
    }
}

/// Everything the registration report says, gathered once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RegFacts {
    /// (major, minor) of the running kernel.
    pub kernel: Option<(u32, u32)>,
    pub kallsyms_readable: bool,
    /// The code exporting ib_register_peer_memory_client (ib_core, ib_uverbs, a test host).
    pub peer_core: Option<String>,
    /// The code exporting ib_umem_dmabuf_get (ib_uverbs on kernels ≥ 5.12).
    pub dmabuf_importer: Option<String>,
    pub memory_peers: Vec<PeerClient>,
    /// /sys/module/nv_peer_mem/version when nv_peer_mem is loaded ("" if it has none).
    pub nv_peer_mem: Option<String>,
    pub nvidia_peermem: Option<NvidiaPeermem>,
    pub devices: Vec<RdmaDevice>,
    /// Why the verbs probes did not run (no libibverbs), if they did not.
    pub probe_error: Option<String>,
}

/// The provider's dma-buf support per the kernel sources (spec §12.6): mlx5 and efa since Debian
/// 6.1; irdma and bnxt_re in 6.12; rxe and siw never.
pub fn provider_dmabuf(provider: &str, kernel: Option<(u32, u32)>) -> DmaBufSupport {
    let p = provider.to_ascii_lowercase();
    let at_least = |v: (u32, u32)| kernel.is_some_and(|k| k >= v);
    if p.starts_with("rxe") || p.starts_with("siw") {
        DmaBufSupport::No
    } else if p.starts_with("mlx5") || p.starts_with("efa") {
        if at_least((6, 1)) { DmaBufSupport::Yes } else { DmaBufSupport::Unknown }
    } else if p.starts_with("irdma") || p.starts_with("bnxt") {
        if at_least((6, 12)) { DmaBufSupport::Yes } else { DmaBufSupport::Unknown }
    } else {
        DmaBufSupport::Unknown
    }
}

/// "6.1.0-56-amd64" → (6, 1).
pub fn kernel_major_minor(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
}

fn read_u64(sys: &Sys, p: &str) -> Option<u64> {
    sys.read(p)?.trim().parse().ok()
}

fn read_trim(sys: &Sys, p: &str) -> Option<String> {
    sys.read(p).map(|s| s.trim().to_owned())
}

impl RegFacts {
    /// `probe` runs the consumers' dma-buf probes (real: [`crate::verbs::probe_all`]).
    pub fn gather(sys: &Sys, kernel_release: &str, probe: &dyn Fn() -> ProbeAnswer) -> RegFacts {
        let kernel = kernel_major_minor(kernel_release);
        let names = sys.list("/sys/class/infiniband");
        let (probes, probe_error) = if names.is_empty() {
            (Vec::new(), None)
        } else {
            match probe() {
                Ok(v) => (v, None),
                Err(e) => (Vec::new(), Some(e)),
            }
        };
        let kallsyms = sys.read("/proc/kallsyms");
        let owner = |sym| kallsyms.as_deref().and_then(|t| sys::kallsyms_owner(t, sym));
        let memory_peers = sys
            .list(MEMORY_PEERS)
            .into_iter()
            .map(|name| {
                let d = format!("{MEMORY_PEERS}/{name}");
                PeerClient {
                    version: read_trim(sys, &format!("{d}/version")),
                    num_alloc_mrs: read_u64(sys, &format!("{d}/num_alloc_mrs")),
                    num_reg_bytes: read_u64(sys, &format!("{d}/num_reg_bytes")),
                    num_free_callbacks: read_u64(sys, &format!("{d}/num_free_callbacks")),
                    name,
                }
            })
            .collect();
        let nv_peer_mem = sys
            .exists("/sys/module/nv_peer_mem")
            .then(|| read_trim(sys, "/sys/module/nv_peer_mem/version").unwrap_or_default());
        let nvidia_peermem = sys.exists("/sys/module/nvidia_peermem").then(|| {
            let p = |n: &str| {
                sys.read(&format!("/sys/module/nvidia_peermem/parameters/{n}")).and_then(|v| v.trim().parse().ok())
            };
            NvidiaPeermem {
                version: read_trim(sys, "/sys/module/nvidia_peermem/version"),
                persistent_api_support: p("persistent_api_support"),
                peerdirect_support: p("peerdirect_support"),
            }
        });
        let devices = names
            .into_iter()
            .map(|name| {
                let provider = sys
                    .link_name(&format!("/sys/class/infiniband/{name}/device/driver"))
                    .unwrap_or_else(|| name.trim_end_matches(|c: char| c.is_ascii_digit()).to_owned());
                let dmabuf = match provider_dmabuf(&provider, kernel) {
                    DmaBufSupport::Unknown => provider_dmabuf(&name, kernel),
                    known => known,
                };
                let probe = probes.iter().find(|(n, _)| *n == name).map(|(_, p)| *p);
                RdmaDevice { name, provider, dmabuf, probe }
            })
            .collect();
        RegFacts {
            kernel,
            kallsyms_readable: kallsyms.is_some(),
            peer_core: owner(SYM_PEER_CORE),
            dmabuf_importer: owner(SYM_DMABUF_IMPORTER),
            memory_peers,
            nv_peer_mem,
            nvidia_peermem,
            devices,
            probe_error,
        }
    }

    fn client(&self, name: &str) -> Option<&PeerClient> {
        self.memory_peers.iter().find(|c| c.name == name)
    }

    fn has_file(&self, path: &str) -> bool {
        match path.strip_prefix(MEMORY_PEERS).and_then(|r| r.strip_prefix('/')) {
            Some(r) => r.strip_suffix("/version").and_then(|c| self.client(c)).is_some_and(|c| c.version.is_some()),
            None => match path {
                "/sys/module/nvidia_peermem/version" => {
                    self.nvidia_peermem.as_ref().is_some_and(|n| n.version.is_some())
                }
                "/sys/module/nv_peer_mem/version" => self.nv_peer_mem.as_deref().is_some_and(|v| !v.is_empty()),
                _ => false,
            },
        }
    }

    /// The first of `paths` that exists: the consumer's peer-memory probe.
    fn probe(&self, paths: &[&'static str]) -> Option<&'static str> {
        paths.iter().copied().find(|p| self.has_file(p))
    }

    /// Which peer-memory clients are registered, with their persistence, in words per client.
    fn clients(&self) -> Vec<(String, &'static str)> {
        let mut out = Vec::new();
        if self.nv_peer_mem.is_some() {
            out.push(("nv_mem (nv_peer_mem)".to_owned(), "invalidating"));
            // nv_mem_nc exists only with drivers that offer persistent pins; without the sysfs
            // tree that cannot be seen from here.
            if self.client("nv_mem_nc").is_some() {
                out.push(("nv_mem_nc (nv_peer_mem)".to_owned(), "persistent"));
            } else if self.memory_peers.is_empty() {
                out.push(("nv_mem_nc (nv_peer_mem)".to_owned(), "persistent, if the driver has persistent pins"));
            }
        }
        if let Some(n) = &self.nvidia_peermem {
            match n.persistent_api_support {
                Some(0) => {
                    out.push(("nv_mem (nvidia-peermem)".to_owned(), "invalidating"));
                    out.push(("nv_mem_nc (nvidia-peermem)".to_owned(), "persistent"));
                }
                Some(_) => out.push(("nv_mem (nvidia-peermem)".to_owned(), "persistent")),
                // Drivers before 560 have no such parameter: nv_mem and nv_mem_nc.
                None => {
                    out.push(("nv_mem (nvidia-peermem)".to_owned(), "invalidating"));
                    out.push(("nv_mem_nc (nvidia-peermem)".to_owned(), "persistent"));
                }
            }
        }
        out
    }
}

const NCCL_PEER: &[&str] = &[
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
    "/sys/module/nvidia_peermem/version",
];
const UCX_PEER: &[&str] = &[
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/module/nvidia_peermem/version",
    "/sys/module/nv_peer_mem/version",
];
const NVSHMEM_PEER: &[&str] = &[
    "/sys/kernel/mm/memory_peers/nv_mem/version",
    "/sys/kernel/mm/memory_peers/nvidia-peermem/version",
    "/sys/module/nvidia_peermem/version",
];

/// The findings of the registration report, all rendered from `f`.
pub fn findings(f: &RegFacts) -> Vec<Finding> {
    let mut out = Vec::new();
    let clients = f.clients();
    let client_list = clients.iter().map(|(c, p)| format!("{c}, {p}")).collect::<Vec<_>>().join("; ");
    let versions = f
        .memory_peers
        .iter()
        .map(|c| format!("{}={}", c.name, c.version.as_deref().unwrap_or("?")))
        .collect::<Vec<_>>()
        .join(",");

    // --- the peer-memory route ---
    let both = f.nv_peer_mem.is_some() && f.nvidia_peermem.is_some();
    let peer = match (&f.peer_core, clients.is_empty(), f.kallsyms_readable) {
        _ if both => Finding::new("peer-memory", Status::Fail, "nv_peer_mem and nvidia_peermem are both loaded: both register the client nv_mem")
            .fix("unload one (NVIDIA: only one may be loaded); keep nvidia_peermem with NVIDIA drivers ≥ 470"),
        (Some(core), false, _) => Finding::new(
            "peer-memory",
            Status::Ok,
            format!("peer-memory core in {core}; clients: {client_list}: ibv_reg_mr on a CUDA pointer works"),
        ),
        (Some(core), true, _) => Finding::new("peer-memory", Status::Warn, format!("peer-memory core in {core}, but no GPU client is loaded: ibv_reg_mr on a CUDA pointer fails (EFAULT)"))
            .fix("modprobe nvidia-peermem (NVIDIA driver ≥ 470) or nv_peer_mem"),
        (None, _, false) => Finding::new("peer-memory", Status::Skip, "/proc/kallsyms is not readable: cannot tell whether a peer-memory core exists"),
        (None, false, true) => Finding::new("peer-memory", Status::Warn, format!("clients loaded ({client_list}) but no code exports {SYM_PEER_CORE}"))
            .fix("the clients were built against another core; rebuild them for this kernel's RDMA stack"),
        (None, true, true) => Finding::new("peer-memory", Status::Info, "no peer-memory core (kernel.org/Debian kernels have none; MLNX_OFED, DOCA-OFED and Ubuntu kernels do): GPU memory registers through dma-buf only")
            .fix("use ibv_reg_dmabuf_mr, or install MLNX_OFED/DOCA-OFED and nvidia-peermem"),
    };
    let np = f.nvidia_peermem.clone().unwrap_or_default();
    out.push(
        peer.fact("core", f.peer_core.clone())
            .fact("clients", client_list.clone())
            .fact("nv_peer_mem_version", f.nv_peer_mem.clone().filter(|v| !v.is_empty()))
            .fact("nv_peer_mem_loaded", f.nv_peer_mem.is_some())
            .fact("nvidia_peermem_loaded", f.nvidia_peermem.is_some())
            .fact("nvidia_peermem_version", np.version.clone())
            .fact("persistent_api_support", np.persistent_api_support)
            .fact("peerdirect_support", np.peerdirect_support)
            .fact("memory_peers_sysfs", !f.memory_peers.is_empty())
            .fact("memory_peers_versions", versions),
    );
    for c in &f.memory_peers {
        out.push(
            Finding::new(
                "memory-peers",
                Status::Info,
                format!(
                    "{MEMORY_PEERS}/{}: version {}, {} MRs, {} bytes registered, {} free callbacks",
                    c.name,
                    c.version.as_deref().unwrap_or("(none)"),
                    c.num_alloc_mrs.map_or("?".into(), |v| v.to_string()),
                    c.num_reg_bytes.map_or("?".into(), |v| v.to_string()),
                    c.num_free_callbacks.map_or("?".into(), |v| v.to_string()),
                ),
            )
            .fact("client", c.name.clone())
            .fact("version", c.version.clone())
            .fact("num_alloc_mrs", c.num_alloc_mrs.map(|v| v as i64))
            .fact("num_reg_bytes", c.num_reg_bytes.map(|v| v as i64))
            .fact("num_free_callbacks", c.num_free_callbacks.map(|v| v as i64)),
        );
    }

    // --- the dma-buf route ---
    let dmabuf = match (&f.dmabuf_importer, f.kallsyms_readable) {
        (Some(m), _) => Finding::new(
            "dma-buf-mr",
            Status::Ok,
            format!("the kernel imports dma-bufs into MRs ({SYM_DMABUF_IMPORTER} in {m})"),
        ),
        (None, false) => Finding::new(
            "dma-buf-mr",
            Status::Skip,
            "/proc/kallsyms is not readable: cannot tell whether the kernel imports dma-bufs",
        ),
        (None, true) => Finding::new(
            "dma-buf-mr",
            Status::Info,
            format!(
                "no {SYM_DMABUF_IMPORTER} in /proc/kallsyms: the kernel is older than 5.12, or ib_uverbs is not loaded"
            ),
        )
        .fix("modprobe ib_uverbs (it loads with any RDMA driver); kernels before 5.12 cannot register dma-bufs"),
    };
    out.push(dmabuf.fact("importer", f.dmabuf_importer.clone()));

    // --- per device: how GPU memory registers with it ---
    let peer_ok = f.peer_core.is_some() && !clients.is_empty() && !both;
    for d in &f.devices {
        let dmabuf_ok = d.dmabuf_ok(f.dmabuf_importer.is_some());
        let mut how = Vec::new();
        if peer_ok {
            how.push("peer memory (ibv_reg_mr)");
        }
        if dmabuf_ok {
            how.push("dma-buf (ibv_reg_dmabuf_mr)");
        }
        let dmabuf_words = match (d.probe, d.dmabuf) {
            (Some(p), _) => {
                format!("answers ibv_reg_dmabuf_mr with {}", std::io::Error::from_raw_os_error(p.nccl_errno))
            }
            (None, DmaBufSupport::Yes) => "imports dma-bufs".into(),
            (None, DmaBufSupport::No) => "cannot import dma-bufs (EOPNOTSUPP)".into(),
            (None, DmaBufSupport::Unknown) => "dma-buf import not known for this provider".into(),
        };
        let (status, summary) = if how.is_empty() {
            (
                if d.probe.is_none() && d.dmabuf == DmaBufSupport::Unknown { Status::Warn } else { Status::Fail },
                format!(
                    "{} ({}): GPU memory cannot be registered: no peer-memory client, and the provider {dmabuf_words}",
                    d.name, d.provider
                ),
            )
        } else {
            (Status::Ok, format!("{} ({}): GPU memory registers through {}", d.name, d.provider, how.join(" and ")))
        };
        let mut fnd = Finding::new("rdma-gpu-mr", status, summary)
            .fact("device", d.name.clone())
            .fact("provider", d.provider.clone())
            .fact("provider_dmabuf", d.dmabuf.word())
            .fact("nccl_dmabuf_errno", d.probe.map(|p| i64::from(p.nccl_errno)))
            .fact("ucx_dmabuf_errno", d.probe.map(|p| i64::from(p.ucx_errno)))
            .fact("peer_memory", peer_ok)
            .fact("dma_buf", dmabuf_ok);
        if how.is_empty() {
            fnd = fnd.fix("a provider with dma-buf import (mlx5, efa; irdma, bnxt_re on 6.12), or a peer-memory core with nvidia-peermem/nv_peer_mem; otherwise stage through host memory");
        }
        out.push(fnd);
    }

    if f.devices.is_empty() {
        out.push(
            Finding::new(
                "rdma-gpu-mr",
                Status::Info,
                "no RDMA device (/sys/class/infiniband is empty): nothing to register GPU memory with",
            )
            .fact("device", None::<String>),
        );
    }

    // --- what the consumers conclude ---
    let nccl = f.probe(NCCL_PEER);
    let ucx = f.probe(UCX_PEER);
    let nvshmem = f.probe(NVSHMEM_PEER);
    let libfabric = f.peer_core.is_some();
    let importer = f.dmabuf_importer.is_some();
    let any_dmabuf = f.devices.iter().any(|d| d.dmabuf_ok(importer));
    let probed = |ok: fn(DmaBufProbe) -> bool| {
        f.devices.iter().filter(|d| d.probe.is_some_and(ok)).map(|d| d.name.as_str()).collect::<Vec<_>>().join(",")
    };
    let (nccl_dmabuf, ucx_dmabuf) = (probed(DmaBufProbe::nccl_supported), probed(DmaBufProbe::ucx_supported));
    let any_probe = f.devices.iter().any(|d| d.probe.is_some());
    let word = |p: Option<&str>| p.map_or("no".to_owned(), |p| format!("yes ({p})"));
    let list = |s: &str| if s.is_empty() { "none".to_owned() } else { s.to_owned() };
    let dmabuf_words = if any_probe {
        format!("dma-buf devices by NCCL's probe: {}; by UCX's: {}", list(&nccl_dmabuf), list(&ucx_dmabuf))
    } else {
        format!(
            "dma-buf usable by a device here: {} (from the provider table{})",
            if any_dmabuf { "yes" } else { "no" },
            f.probe_error.as_deref().map(|e| format!("; probes not run: {e}")).unwrap_or_default()
        )
    };
    let summary = format!(
        "peer memory detected by NCCL: {}; UCX: {}; NVSHMEM: {}; libfabric: {}. {dmabuf_words}",
        word(nccl),
        word(ucx),
        word(nvshmem),
        if libfabric { "yes (kallsyms)" } else { "no" },
    );
    let mut c = Finding::new("consumer-probes", Status::Info, summary)
        .fact("nccl_peer_mem", nccl)
        .fact("ucx_peer_mem", ucx)
        .fact("nvshmem_peer_mem", nvshmem)
        .fact("libfabric_peer_mem", libfabric)
        .fact("libfabric_dmabuf", f.dmabuf_importer.is_some())
        .fact("dmabuf_device", any_dmabuf)
        .fact("nccl_dmabuf_devices", any_probe.then_some(nccl_dmabuf.clone()))
        .fact("ucx_dmabuf_devices", any_probe.then_some(ucx_dmabuf.clone()))
        .fact("probe_error", f.probe_error.clone());
    if f.nv_peer_mem.is_some() && f.memory_peers.is_empty() && nccl.is_none() {
        c = c.fix("nv_peer_mem is loaded on a core without the memory_peers tree (OFED ≥ 24.04): NCCL and NVSHMEM do not see it; use nvidia-peermem or dma-buf");
    }
    out.push(c);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use crate::sys::fixture::Tree;

    const KALLSYMS_OFED: &str = "ffffffffc0a01000 T ib_register_peer_memory_client\t[ib_core]\n\
                                 ffffffffc0a02000 T ib_umem_dmabuf_get\t[ib_uverbs]\n";
    const KALLSYMS_DEBIAN: &str = "ffffffffc0a02000 T ib_umem_dmabuf_get\t[ib_uverbs]\n";

    fn peers(t: &Tree, client: &str, version: &str, mrs: u64) {
        let d = format!("sys/kernel/mm/memory_peers/{client}");
        t.file(&format!("{d}/version"), &format!("{version}\n"))
            .file(&format!("{d}/num_alloc_mrs"), &format!("{mrs}\n"))
            .file(&format!("{d}/num_reg_bytes"), "65536\n")
            .file(&format!("{d}/num_free_callbacks"), "0\n");
    }

    fn devices(t: &Tree) {
        t.link("sys/class/infiniband/mlx5_0/device/driver", "../../../bus/pci/drivers/mlx5_core")
            .dir("sys/class/infiniband/rxe0");
    }

    fn report(t: &Tree, kver: &str) -> (RegFacts, Vec<Finding>, String, String) {
        let f = RegFacts::gather(&Sys::with_root(t.root()), kver, &|| Err("no libibverbs in the fixture".into()));
        let v = findings(&f);
        let r = Report { findings: v.clone(), working_path: None, verdict: String::new() };
        (f, v, r.human(), r.json())
    }

    fn find<'a>(v: &'a [Finding], check: &str, needle: &str) -> &'a Finding {
        v.iter()
            .find(|f| f.check == check && f.summary.contains(needle))
            .unwrap_or_else(|| panic!("no {check} finding with '{needle}' in {v:#?}"))
    }

    fn fact<'a>(f: &'a Finding, k: &str) -> &'a Value {
        &f.facts.iter().find(|(n, _)| *n == k).unwrap_or_else(|| panic!("no fact {k} in {f:?}")).1
    }
    use crate::report::Value;

    #[test]
    fn ofed_sysfs_core_with_nv_peer_mem() {
        let t = Tree::new("reg-ofed");
        t.file("proc/kallsyms", KALLSYMS_OFED).file("sys/module/nv_peer_mem/version", "1.3-0\n");
        peers(&t, "nv_mem", "1.3-0", 3);
        peers(&t, "nv_mem_nc", "1.3-0", 0);
        devices(&t);
        let (f, v, text, json) = report(&t, "6.1.0-56-amd64");
        assert_eq!(f.peer_core.as_deref(), Some("ib_core"));
        assert_eq!(f.devices.len(), 2);
        let p = find(&v, "peer-memory", "ib_core");
        assert_eq!(p.status, Status::Ok);
        assert!(
            p.summary.contains("nv_mem (nv_peer_mem), invalidating; nv_mem_nc (nv_peer_mem), persistent"),
            "{}",
            p.summary
        );
        assert_eq!(fact(p, "memory_peers_versions"), &Value::Str("nv_mem=1.3-0,nv_mem_nc=1.3-0".into()));
        let mlx = find(&v, "rdma-gpu-mr", "mlx5_0 (mlx5_core)");
        assert_eq!(mlx.status, Status::Ok);
        assert!(mlx.summary.contains("peer memory (ibv_reg_mr) and dma-buf (ibv_reg_dmabuf_mr)"), "{}", mlx.summary);
        let rxe = find(&v, "rdma-gpu-mr", "rxe0 (rxe)");
        assert_eq!(rxe.status, Status::Ok, "peer memory works on rxe too: {rxe:?}");
        assert_eq!(fact(rxe, "dma_buf"), &Value::Bool(false));
        let c = find(&v, "consumer-probes", "NCCL");
        assert_eq!(fact(c, "nccl_peer_mem"), &Value::Str("/sys/kernel/mm/memory_peers/nv_mem/version".into()));
        assert_eq!(fact(c, "ucx_peer_mem"), &Value::Str("/sys/kernel/mm/memory_peers/nv_mem/version".into()));
        assert_eq!(fact(c, "nvshmem_peer_mem"), &Value::Str("/sys/kernel/mm/memory_peers/nv_mem/version".into()));
        assert_eq!(fact(c, "libfabric_peer_mem"), &Value::Bool(true));
        assert!(text.contains("/sys/kernel/mm/memory_peers/nv_mem: version 1.3-0, 3 MRs"), "{text}");
        assert!(json.contains("\"check\":\"peer-memory\",\"status\":\"ok\""), "{json}");
        assert!(json.contains("\"nv_peer_mem_version\":\"1.3-0\""), "{json}");
    }

    #[test]
    fn debian_kernel_without_core_and_rxe_only() {
        let t = Tree::new("reg-debian");
        t.file("proc/kallsyms", KALLSYMS_DEBIAN).dir("sys/class/infiniband/rxe0");
        let (_, v, text, _) = report(&t, "6.1.0-56-amd64");
        assert_eq!(find(&v, "peer-memory", "no peer-memory core").status, Status::Info);
        assert_eq!(find(&v, "dma-buf-mr", "ib_uverbs").status, Status::Ok);
        let rxe = find(&v, "rdma-gpu-mr", "rxe0");
        assert_eq!(rxe.status, Status::Fail);
        assert!(rxe.summary.contains("cannot import dma-bufs (EOPNOTSUPP)"), "{}", rxe.summary);
        let c = find(&v, "consumer-probes", "NCCL: no; UCX: no; NVSHMEM: no; libfabric: no");
        assert_eq!(fact(c, "dmabuf_device"), &Value::Bool(false));
        assert!(text.contains("GPU memory registration with RDMA devices:"), "{text}");
    }

    #[test]
    fn doca_core_without_sysfs_and_nvidia_peermem_persistent() {
        let t = Tree::new("reg-doca");
        t.file("proc/kallsyms", "ffffffffc0a01000 T ib_register_peer_memory_client\t[ib_uverbs]\n")
            .file("sys/module/nvidia_peermem/version", "580.65.06\n")
            .file("sys/module/nvidia_peermem/parameters/persistent_api_support", "1\n")
            .file("sys/module/nvidia_peermem/parameters/peerdirect_support", "0\n");
        devices(&t);
        let (_, v, _, json) = report(&t, "6.12.117+deb12-amd64");
        let p = find(&v, "peer-memory", "ib_uverbs");
        assert!(p.summary.contains("nv_mem (nvidia-peermem), persistent"), "{}", p.summary);
        assert!(!p.summary.contains("nv_mem_nc"), "{}", p.summary);
        assert_eq!(fact(p, "persistent_api_support"), &Value::Int(1));
        // Without the kernel's importer no device can take dma-bufs, whatever the provider.
        assert_eq!(fact(find(&v, "rdma-gpu-mr", "mlx5_0"), "dma_buf"), &Value::Bool(false));
        let c = find(&v, "consumer-probes", "NCCL");
        assert_eq!(fact(c, "nccl_peer_mem"), &Value::Str("/sys/module/nvidia_peermem/version".into()));
        assert_eq!(fact(c, "nvshmem_peer_mem"), &Value::Str("/sys/module/nvidia_peermem/version".into()));
        assert!(json.contains("\"nvidia_peermem_version\":\"580.65.06\""), "{json}");
    }

    #[test]
    fn nv_peer_mem_on_a_core_without_sysfs_is_seen_by_ucx_only() {
        let t = Tree::new("reg-nosysfs");
        t.file("proc/kallsyms", KALLSYMS_OFED).file("sys/module/nv_peer_mem/version", "1.3-0\n");
        let (_, v, _, _) = report(&t, "6.1.0-56-amd64");
        let c = find(&v, "consumer-probes", "NCCL: no; UCX: yes (/sys/module/nv_peer_mem/version); NVSHMEM: no");
        assert!(c.fix.as_deref().is_some_and(|f| f.contains("OFED ≥ 24.04")), "{c:?}");
        assert!(find(&v, "peer-memory", "ib_core").summary.contains("if the driver has persistent pins"));
    }

    /// The consumers' own probes, where libibverbs runs them, decide over the provider table.
    #[test]
    fn verbs_probes_decide_the_dmabuf_route() {
        let t = Tree::new("reg-probes");
        t.file("proc/kallsyms", KALLSYMS_DEBIAN);
        devices(&t);
        let answers = || {
            Ok(vec![
                ("mlx5_0".to_owned(), DmaBufProbe { nccl_errno: libc::EBADF, ucx_errno: libc::EBADF }),
                ("rxe0".to_owned(), DmaBufProbe { nccl_errno: libc::EOPNOTSUPP, ucx_errno: libc::EOPNOTSUPP }),
            ])
        };
        let f = RegFacts::gather(&Sys::with_root(t.root()), "6.1.0-56-amd64", &answers);
        let v = findings(&f);
        let mlx = find(&v, "rdma-gpu-mr", "mlx5_0");
        assert_eq!(mlx.status, Status::Ok, "{mlx:?}");
        assert_eq!(fact(mlx, "nccl_dmabuf_errno"), &Value::Int(i64::from(libc::EBADF)));
        let rxe = find(&v, "rdma-gpu-mr", "rxe0");
        assert_eq!(rxe.status, Status::Fail);
        assert!(rxe.summary.contains("answers ibv_reg_dmabuf_mr with Operation not supported"), "{}", rxe.summary);
        let c = find(&v, "consumer-probes", "dma-buf devices by NCCL's probe: mlx5_0; by UCX's: mlx5_0");
        assert_eq!(fact(c, "nccl_dmabuf_devices"), &Value::Str("mlx5_0".into()));
        assert_eq!(fact(c, "probe_error"), &Value::Null);
        // Without libibverbs the table speaks, and the report says the probes did not run.
        let (_, v, _, _) = report(&t, "6.1.0-56-amd64");
        let c = find(&v, "consumer-probes", "from the provider table; probes not run: no libibverbs");
        assert_eq!(fact(c, "nccl_dmabuf_devices"), &Value::Null);
    }

    #[test]
    fn both_clients_loaded_is_a_failure() {
        let t = Tree::new("reg-both");
        t.file("proc/kallsyms", KALLSYMS_OFED)
            .file("sys/module/nv_peer_mem/version", "1.3-0\n")
            .file("sys/module/nvidia_peermem/version", "550.54.15\n");
        let (_, v, _, _) = report(&t, "6.1.0-56-amd64");
        assert_eq!(find(&v, "peer-memory", "both loaded").status, Status::Fail);
    }

    #[test]
    fn no_kallsyms_means_skip_not_a_verdict() {
        let t = Tree::new("reg-nokallsyms");
        let (_, v, _, _) = report(&t, "6.1.0-56-amd64");
        assert_eq!(find(&v, "rdma-gpu-mr", "no RDMA device").status, Status::Info);
        assert_eq!(find(&v, "peer-memory", "not readable").status, Status::Skip);
        assert_eq!(find(&v, "dma-buf-mr", "not readable").status, Status::Skip);
    }

    /// Every fixture: the consumer summary's words and its JSON facts say the same.
    #[test]
    fn consumer_words_match_facts() {
        for (i, (ks, files)) in [
            (KALLSYMS_OFED, &["sys/kernel/mm/memory_peers/nv_mem/version"][..]),
            (KALLSYMS_DEBIAN, &["sys/module/nvidia_peermem/version"][..]),
            ("", &["sys/module/nv_peer_mem/version"][..]),
            ("", &[][..]),
        ]
        .into_iter()
        .enumerate()
        {
            let t = Tree::new(&format!("reg-words-{i}"));
            t.file("proc/kallsyms", ks);
            for f in files {
                t.file(f, "x\n");
            }
            let (_, v, _, _) = report(&t, "6.1.0-56-amd64");
            let c = v.iter().find(|f| f.check == "consumer-probes").expect("consumer finding");
            for (who, key) in [("NCCL", "nccl_peer_mem"), ("UCX", "ucx_peer_mem"), ("NVSHMEM", "nvshmem_peer_mem")] {
                let said_yes = c.summary.contains(&format!("{who}: yes"));
                assert_eq!(said_yes, *fact(c, key) != Value::Null, "{who} in case {i}: {c:?}");
            }
            assert_eq!(c.summary.contains("libfabric: yes"), *fact(c, "libfabric_peer_mem") == Value::Bool(true));
        }
    }

    #[test]
    fn kernel_versions_and_provider_table() {
        assert_eq!(kernel_major_minor("6.1.0-56-amd64"), Some((6, 1)));
        assert_eq!(kernel_major_minor("6.12.117+deb12-amd64"), Some((6, 12)));
        assert_eq!(kernel_major_minor("x"), None);
        assert_eq!(provider_dmabuf("mlx5_core", Some((6, 1))), DmaBufSupport::Yes);
        assert_eq!(provider_dmabuf("irdma", Some((6, 1))), DmaBufSupport::Unknown);
        assert_eq!(provider_dmabuf("irdma", Some((6, 12))), DmaBufSupport::Yes);
        assert_eq!(provider_dmabuf("rxe", Some((6, 12))), DmaBufSupport::No);
        assert_eq!(provider_dmabuf("hfi1", Some((6, 12))), DmaBufSupport::Unknown);
    }
}
