//! The command line the engine benches share (`store`, `flush_cpu`, `readahead`): `[--json PATH]
//! [--size-mib N] [--ops N] [--rounds N] [--dir DIR] [--s3] [--latency-ms N]`; what `cargo bench` adds itself
//! (`--bench`, filters) is ignored. A bench that has no use for a value ignores it.

use std::path::PathBuf;

/// The parsed options.
pub struct Args {
    pub json: Option<PathBuf>,
    pub size_mib: u64,
    pub ops: usize,
    pub rounds: usize,
    pub dir: Option<PathBuf>,
    /// `--s3`: flush to the in-process S3 server (`flush_cpu`).
    pub s3: bool,
    /// `--latency-ms`: added before every store call (`readahead`; default 5).
    pub latency_ms: u64,
}

impl Args {
    /// Defaults with these sizes: no JSON file, the system's temporary directory, no S3,
    /// 5 ms of store latency.
    pub fn defaults(size_mib: u64, ops: usize, rounds: usize) -> Args {
        Args {
            json: None,
            size_mib,
            ops,
            rounds,
            dir: None,
            s3: false,
            latency_ms: 5,
        }
    }
}

/// The runtime the engine benches run on: two workers (the CI machine's cores).
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Parses the process's arguments over `defaults`.
pub fn parse_args(defaults: Args) -> Args {
    let mut a = defaults;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        match arg.as_str() {
            "--json" => a.json = Some(PathBuf::from(val("--json"))),
            "--size-mib" => a.size_mib = val("--size-mib").parse().expect("--size-mib: integer"),
            "--ops" => a.ops = val("--ops").parse().expect("--ops: integer"),
            "--rounds" => a.rounds = val("--rounds").parse().expect("--rounds: integer"),
            "--dir" => a.dir = Some(PathBuf::from(val("--dir"))),
            "--s3" => a.s3 = true,
            "--latency-ms" => {
                a.latency_ms = val("--latency-ms").parse().expect("--latency-ms: integer")
            }
            _ => {} // `cargo bench` passes --bench and filters
        }
    }
    a
}
