//! gdrcopy_diag: inspects this machine and says, in plain words with a fix for each finding,
//! whether GPUDirect (gdrcopy's CPU mappings of GPU memory, libgdsync's stream memory
//! operations and RDMA devices) can work here. See docs/diagnostics.md.
//!
//! Exit status: 0 only when gdrcopy really pinned, mapped and copied GPU memory through one of
//! its backends; 1 when no path works; 2 on bad usage.

mod checks;
mod cuda;
mod gdrapi;
mod nvm_ioctl;
mod regmem;
mod report;
mod storage;
mod sys;
mod verbs;

const USAGE: &str = "usage: gdrcopy_diag [--json] [--only gdrcopy|registration|storage] [-h|--help] [--version]

Checks libcuda and the driver version, /dev/gdrdrv, the gdrdrv module and NVIDIA's p2p symbols,
each GPU's BAR1 against its memory, the IOMMU, stream memory operations (libgdsync), RDMA devices
(mlx5 for GDS_PROVIDER=mlx5), the backend gdr_open picks, and finally pins, maps and copies one
GPU page through libgdrapi. Then how each RDMA device can register GPU memory (peer-memory
clients, dma-buf, what NCCL/UCX/NVSHMEM/libfabric detect) and why GPU-initiated storage (libnvm)
can or cannot work (NVMe controllers and their drivers, the libnvm module and its ABI, IOMMU, BARs).

  --json     one JSON object on stdout instead of the text report
  --only S   only that section: gdrcopy, registration or storage
Exit status: 0 when a GPUDirect path works (with --only registration|storage: when that section
has no failure), 1 when not, 2 on bad usage.
Environment: GDRCOPY_USE_DMABUF_MMAP=1 is honoured as libgdrapi honours it.";

fn main() {
    let mut json = false;
    let mut only = checks::Section::All;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json = true,
            "--only" => {
                only = match args.next().as_deref() {
                    Some("gdrcopy") => checks::Section::Gdrcopy,
                    Some("registration") => checks::Section::Registration,
                    Some("storage") => checks::Section::Storage,
                    other => {
                        eprintln!(
                            "gdrcopy_diag: --only takes gdrcopy, registration or storage, not {other:?}\n{USAGE}"
                        );
                        std::process::exit(2);
                    }
                }
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            "--version" => {
                println!("gdrcopy_diag {}", env!("CARGO_PKG_VERSION"));
                return;
            }
            other => {
                eprintln!("gdrcopy_diag: unknown argument '{other}'\n{USAGE}");
                std::process::exit(2);
            }
        }
    }
    let report = checks::run(&sys::Sys::from_env(), only);
    if json {
        print!("{}", report.json());
    } else {
        print!("{}", report.human());
    }
    let ok = match only {
        checks::Section::All | checks::Section::Gdrcopy => report.working_path.is_some(),
        checks::Section::Registration | checks::Section::Storage => {
            !report.findings.iter().any(|f| f.status == report::Status::Fail)
        }
    };
    std::process::exit(if ok { 0 } else { 1 });
}
