//! gdrcopy_diag: inspects this machine and says, in plain words with a fix for each finding,
//! whether GPUDirect (gdrcopy's CPU mappings of GPU memory, libgdsync's stream memory
//! operations and RDMA devices) can work here. See docs/diagnostics.md.
//!
//! Exit status: 0 only when gdrcopy really pinned, mapped and copied GPU memory through one of
//! its backends; 1 when no path works; 2 on bad usage.

mod checks;
mod cuda;
mod gdrapi;
mod report;
mod sys;

const USAGE: &str = "usage: gdrcopy_diag [--json] [-h|--help] [--version]

Checks libcuda and the driver version, /dev/gdrdrv, the gdrdrv module and NVIDIA's p2p symbols,
each GPU's BAR1 against its memory, the IOMMU, stream memory operations (libgdsync), RDMA devices
(mlx5 for GDS_PROVIDER=mlx5), the backend gdr_open picks, and finally pins, maps and copies one
GPU page through libgdrapi.

  --json     one JSON object on stdout instead of the text report
Exit status: 0 when a GPUDirect path works, 1 when none does, 2 on bad usage.
Environment: GDRCOPY_USE_DMABUF_MMAP=1 is honoured as libgdrapi honours it.";

fn main() {
    let mut json = false;
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--json" => json = true,
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
    let report = checks::run(&sys::Sys::from_env());
    if json {
        print!("{}", report.json());
    } else {
        print!("{}", report.human());
    }
    std::process::exit(if report.working_path.is_some() { 0 } else { 1 });
}
