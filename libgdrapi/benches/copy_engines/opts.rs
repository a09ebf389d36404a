//! Command-line options and the copy sizes they select.

#![forbid(unsafe_code)]

pub(crate) struct Opts {
    pub(crate) quick: bool,
    pub(crate) cuda: bool,
    pub(crate) gdrapi: Option<String>,
    pub(crate) ours: Option<String>,
    pub(crate) threads: Vec<usize>,
    pub(crate) bar_only: bool,
    pub(crate) host_offset: usize,
    pub(crate) max_size: usize,
    pub(crate) pairs: Option<usize>,
}

fn usage() -> ! {
    eprintln!(
        "usage: copy_engines [--quick] [--no-cuda] [--max-size BYTES] [--ours PATH] [--gdrapi PATH] [--threads N,..] [--bar-only]\n\
         \x20 --quick      fewer sizes and samples (a few seconds)\n\
         \x20 --no-cuda    skip libcuda (no write-combined memory, no BAR mapping)\n\
         \x20 --max-size   largest copy (default 16 MiB)\n\
         \x20 --ours       our libgdrapi.so (default: the one built next to this benchmark)\n\
         \x20 --gdrapi     another libgdrapi to time on the same device memory (needs gdrdrv or dma-buf)\n\
         \x20 --threads    thread counts for the scaling table, e.g. 1,2,4,8\n\
         \x20 --bar-only   only the BAR tables (and the scaling table)\n\
         \x20 --host-offset  bytes between a page boundary and the host buffer (default 0)\n\
         \x20 --pairs N  block pairs per paired difference in the summaries (default 30; 10 with --quick)"
    );
    std::process::exit(2)
}

pub(crate) fn parse_opts() -> Opts {
    let mut o = Opts {
        quick: false,
        cuda: true,
        gdrapi: None,
        ours: None,
        threads: Vec::new(),
        bar_only: false,
        host_offset: 0,
        max_size: 16 << 20,
        pairs: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => o.quick = true,
            "--no-cuda" => o.cuda = false,
            "--bar-only" => o.bar_only = true,
            "--host-offset" => o.host_offset = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            "--gdrapi" => o.gdrapi = Some(args.next().unwrap_or_else(|| usage())),
            "--ours" => o.ours = Some(args.next().unwrap_or_else(|| usage())),
            "--threads" => {
                let list = args.next().unwrap_or_else(|| usage());
                o.threads = list.split(',').map(|t| t.parse().unwrap_or_else(|_| usage())).collect();
            }
            "--pairs" => {
                o.pairs = Some(args.next().and_then(|s| s.parse().ok()).filter(|&n| n >= 2).unwrap_or_else(|| usage()))
            }
            "--max-size" => o.max_size = args.next().and_then(|s| s.parse().ok()).unwrap_or_else(|| usage()),
            // `cargo bench` passes `--bench`; a filter-less run ignores it.
            "--bench" => {}
            "-h" | "--help" => usage(),
            _ => {
                eprintln!("unknown argument {a}");
                usage()
            }
        }
    }
    o
}

pub(crate) fn sizes(o: &Opts) -> Vec<usize> {
    let mut v: Vec<usize> = if o.quick {
        (0..=24).step_by(2).map(|s| 1usize << s).collect()
    } else {
        (0..=24).map(|s| 1usize << s).collect()
    };
    let odd: &[usize] = if o.quick { &[63, 4097] } else { &[3, 63, 100, 1000, 4097, 65537, 1_000_003] };
    v.extend_from_slice(odd);
    v.retain(|&s| s <= o.max_size);
    v.sort_unstable();
    v.dedup();
    v
}
