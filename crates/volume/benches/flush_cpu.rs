//! `flush_cpu` benchmark: CPU-seconds per GiB on the flush path, per stage (issue 26).
//!
//! - `encode`: `PackBuilder::add` of every block then `finish` (zstd level 1, the default:
//!   compress or store raw, frame crc and raw crc, sealing with XChaCha20-Poly1305 when
//!   `encrypted`), 128 blocks of 128 KiB per pack, one thread, in memory. CPU = this thread's
//!   CPU clock (`CLOCK_THREAD_CPUTIME_ID`).
//! - `flush`: `Volume::sync_to_store` of a fully dirty volume into an in-memory object store
//!   (read from the flushing file, crc checks, encode, upload, manifest publish), so the
//!   figure is the engine's CPU without an HTTP server's. CPU = the whole process's CPU clock
//!   (`CLOCK_PROCESS_CPUTIME_ID`: every runtime and blocking-pool thread) across the call;
//!   filling the volume beforehand is not counted.
//!
//! - `flush_s3` (with `--s3`, instead of the two above): the same flush to the in-process S3
//!   server (`glidefs_testkit::S3Server`, plain `http://`) through `open_store`, per PUT mode:
//!   `signed` (the body's SHA-256 in the SigV4 signature, the default over `http://`),
//!   `unsigned` (`UNSIGNED-PAYLOAD`, the default over `https://`), `unsigned_crc64nvme`
//!   (unsigned plus an `x-amz-checksum-crc64nvme` header, the default to AWS), and `memory`
//!   (the in-memory store, for reference). Rounds take the modes in turn. The server runs in
//!   this process, on a runtime of its own whose threads are named `s3-server`, and it does
//!   work of its own per mode (it checks a signed body's SHA-256, a CRC64NVME header, and
//!   always computes an MD5 for the ETag): `cpu_s_per_gib` is the whole process,
//!   `server_cpu_s_per_gib` the server's threads (`/proc/self/task/*/schedstat`), and
//!   `client_cpu_s_per_gib` the difference, the figure that stands for glidefs against a
//!   remote S3. The server's threads never exit during a run (its blocking pool keeps them
//!   an hour), so none of its CPU leaks into the client figure.
//! - `cold_read_s3` (with `--s3`): after each `flush_s3` pass, the volume's cache is emptied
//!   (`evict_to(0)`) and the whole volume read back in order, one block per `Volume::read`
//!   (readahead on, its default window), every block compared with what was written: the
//!   cold read path's CPU (GET, frame checks, decompression, fill into the cache, copy out),
//!   told apart from the server's as for `flush_s3`.
//!
//! Data kinds: `incompressible` (noise), `half_zero` (every 4 KiB page: 2 KiB noise, 2 KiB
//! zeros), `text` (every 4 KiB page: 1 KiB noise, 3 KiB repeated text, about 4:1).
//!
//! Each figure is the median of `--rounds` rounds (default 3). Usage: `cargo bench -p
//! glidefs-volume --bench flush_cpu -- [--json PATH] [--size-mib N] [--rounds N] [--dir DIR]
//! [--s3]`. Prints one JSON object. Timings vary with load: compare figures of one run, not
//! across runs on a shared machine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_objstore::{
    open_store, PackBuilder, PackId, S3Checksum, S3Options, UnsignedPayload, VolumeKey,
};
use glidefs_testkit::S3Server;
use glidefs_volume::{Volume, VolumeConfig};
use object_store::ObjectStore;
use rustix::time::{clock_gettime, ClockId};
use serde_json::json;

const BLOCK: u32 = 128 * 1024;
const PAGE: usize = 4096;
const BLOCKS_PER_PACK: usize = 128;
/// Distinct blocks generated per kind (encode cycles through them).
const POOL: usize = 256;
const GIB: f64 = (1u64 << 30) as f64;
const KINDS: [&str; 3] = ["incompressible", "half_zero", "text"];
/// Name prefix of the in-process S3 server's threads (at most 15 bytes: the kernel's limit).
const SERVER_THREADS: &str = "s3-server";

/// Where `flush_s3` flushes to: the in-memory store, or the S3 server with these PUT options.
#[derive(Clone, Copy)]
enum Target {
    Memory,
    S3(UnsignedPayload, S3Checksum),
}

/// The `flush_s3` modes, in the order each round runs them.
const S3_MODES: [(&str, Target); 4] = [
    ("signed", Target::S3(UnsignedPayload::Off, S3Checksum::Off)),
    ("unsigned", Target::S3(UnsignedPayload::On, S3Checksum::Off)),
    (
        "unsigned_crc64nvme",
        Target::S3(UnsignedPayload::On, S3Checksum::Crc64nvme),
    ),
    ("memory", Target::Memory),
];

#[path = "common/args.rs"]
mod args;
use args::{parse_args, Args};
#[path = "common/median.rs"]
mod median;
use median::median;

fn cpu(id: ClockId) -> Duration {
    let t = clock_gettime(id);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// CPU time of this process's threads whose name starts with `prefix` (nanoseconds on CPU
/// from `/proc/self/task/*/schedstat`); `None` where the kernel keeps no schedstat.
fn threads_cpu(prefix: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with(prefix) {
            continue;
        }
        // A thread that exited since the listing has no files left: it counts nothing.
        let Ok(stat) = std::fs::read_to_string(task.path().join("schedstat")) else {
            continue;
        };
        let ns: u64 = stat.split_whitespace().next()?.parse().ok()?;
        total += Duration::from_nanos(ns);
    }
    Some(total)
}

/// Block `seed` of `kind` (see the module docs).
fn block(kind: &str, seed: u64) -> Vec<u8> {
    let noise = glidefs_testkit::noise(seed + 1, BLOCK as usize);
    let text = b"the quick brown fox jumps over the lazy dog; glidefs bench. ";
    match kind {
        "incompressible" => noise,
        "half_zero" => noise
            .chunks(PAGE)
            .flat_map(|p| p[..PAGE / 2].iter().copied().chain([0u8; PAGE / 2]))
            .collect(),
        _ => noise
            .chunks(PAGE)
            .flat_map(|p| {
                p[..1024]
                    .iter()
                    .copied()
                    .chain(text.iter().copied().cycle().take(PAGE - 1024))
            })
            .collect(),
    }
}

/// One measured pass: (CPU, wall, stored bytes) for `raw_bytes` of block data.
struct Pass {
    cpu: Duration,
    /// The in-process S3 server's share of `cpu` (`flush_s3` only).
    server_cpu: Option<Duration>,
    wall: Duration,
    stored: u64,
    raw_bytes: u64,
}

fn summarize(passes: &[Pass]) -> serde_json::Value {
    let raw = passes.first().map(|p| p.raw_bytes).unwrap_or(0) as f64;
    let per_gib = |d: Duration| d.as_secs_f64() / raw * GIB;
    let mut out = json!({
        "cpu_s_per_gib": median(passes.iter().map(|p| per_gib(p.cpu)).collect()),
        "mb_s": median(passes.iter().map(|p| raw / p.wall.as_secs_f64() / 1e6).collect()),
        "stored_ratio": median(passes.iter().map(|p| p.stored as f64 / raw).collect()),
        "rounds_cpu_s_per_gib": passes.iter().map(|p| per_gib(p.cpu)).collect::<Vec<_>>(),
    });
    let server: Option<Vec<Duration>> = passes.iter().map(|p| p.server_cpu).collect();
    if let (Some(server), Some(fields)) = (server, out.as_object_mut()) {
        let client: Vec<f64> = passes
            .iter()
            .zip(&server)
            .map(|(p, s)| per_gib(p.cpu.saturating_sub(*s)))
            .collect();
        let server: Vec<f64> = server.into_iter().map(per_gib).collect();
        fields.insert("client_cpu_s_per_gib".into(), json!(median(client.clone())));
        fields.insert("server_cpu_s_per_gib".into(), json!(median(server.clone())));
        fields.insert("rounds_client_cpu_s_per_gib".into(), json!(client));
        fields.insert("rounds_server_cpu_s_per_gib".into(), json!(server));
    }
    out
}

fn encode_pass(pool: &[Vec<u8>], blocks: u64, key: Option<&Arc<VolumeKey>>) -> Pass {
    let (c0, t0) = (cpu(ClockId::ThreadCPUTime), Instant::now());
    let mut stored = 0;
    let mut next = 0u64;
    while next < blocks {
        let mut b = PackBuilder::new(BLOCK)
            .expect("zstd")
            .with_key(key.cloned());
        for _ in 0..BLOCKS_PER_PACK.min((blocks - next) as usize) {
            b.add(next, &pool[next as usize % pool.len()]).expect("add");
            next += 1;
        }
        stored += b.finish(PackId::generate(0, next)).bytes.len() as u64;
    }
    Pass {
        cpu: cpu(ClockId::ThreadCPUTime) - c0,
        server_cpu: None,
        wall: t0.elapsed(),
        stored,
        raw_bytes: blocks * u64::from(BLOCK),
    }
}

async fn flush_pass(dir: PathBuf, pool: &[Vec<u8>], blocks: u64) -> Pass {
    let size = blocks * u64::from(BLOCK);
    let mut cfg = VolumeConfig::new("flush-cpu", dir.clone(), size);
    cfg.block_size = BLOCK;
    let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let v = Volume::open(cfg, mem).await.expect("open volume");
    for b in 0..blocks {
        let data = &pool[b as usize % pool.len()];
        v.write(b * u64::from(BLOCK), data).await.expect("fill");
    }
    let (c0, t0) = (cpu(ClockId::ProcessCPUTime), Instant::now());
    let rep = v.sync_to_store().await.expect("sync_to_store");
    let pass = Pass {
        cpu: cpu(ClockId::ProcessCPUTime) - c0,
        server_cpu: None,
        wall: t0.elapsed(),
        stored: rep.bytes,
        raw_bytes: size,
    };
    assert_eq!(rep.blocks, blocks, "every block flushed");
    // Each pass leaves its cache files (twice the volume's size) behind otherwise: later
    // passes then pay the page cache's reclaim of earlier ones, so kinds measured later
    // looked dearer.
    drop(v);
    std::fs::remove_dir_all(&dir).expect("remove the volume's cache");
    pass
}

/// The start of a measured `flush_s3` / `cold_read_s3` span: the process's CPU clock, the
/// server threads' CPU, the wall clock.
struct Stamp(Duration, Option<Duration>, Instant);

impl Stamp {
    fn now() -> Stamp {
        Stamp(
            cpu(ClockId::ProcessCPUTime),
            threads_cpu(SERVER_THREADS),
            Instant::now(),
        )
    }

    /// The pass from this stamp to now.
    fn pass(&self, stored: u64, raw_bytes: u64) -> Pass {
        let Stamp(c1, s1, _) = Stamp::now();
        Pass {
            cpu: c1 - self.0,
            server_cpu: self.1.zip(s1).map(|(a, b)| b.saturating_sub(a)),
            wall: self.2.elapsed(),
            stored,
            raw_bytes,
        }
    }
}

/// One `flush_s3` pass to `target`: a fresh server (started on `server_rt`), client and
/// volume, then its `cold_read_s3` pass; the volume's cache directory and the server's are
/// removed afterwards. Returns (flush, cold read).
async fn s3_flush_pass(
    server_rt: &tokio::runtime::Handle,
    dir: PathBuf,
    pool: &[Vec<u8>],
    blocks: u64,
    target: Target,
) -> (Pass, Pass) {
    let size = blocks * u64::from(BLOCK);
    let mut cfg = VolumeConfig::new("flush-cpu", dir.clone(), size);
    cfg.block_size = BLOCK;
    let (server, store): (_, Arc<dyn ObjectStore>) = match target {
        Target::Memory => (None, Arc::new(object_store::memory::InMemory::new())),
        Target::S3(unsigned_payload, checksum) => {
            let server = server_rt
                .spawn(S3Server::start())
                .await
                .expect("server task")
                .expect("s3 server");
            let s3 = S3Options {
                endpoint: Some(server.endpoint.clone()),
                settings: server.aws_settings(),
                unsigned_payload,
                checksum,
            };
            let store = open_store(&format!("s3://{}", server.bucket), &s3).expect("s3 client");
            (Some(server), store)
        }
    };
    let v = Volume::open(cfg, store).await.expect("open volume");
    for b in 0..blocks {
        let data = &pool[b as usize % pool.len()];
        v.write(b * u64::from(BLOCK), data).await.expect("fill");
    }
    let start = Stamp::now();
    let rep = v.sync_to_store().await.expect("sync_to_store");
    let flush = start.pass(rep.bytes, size);
    assert_eq!(rep.blocks, blocks, "every block flushed");
    v.evict_to(0).await.expect("evict");
    let mut buf = vec![0u8; BLOCK as usize];
    let start = Stamp::now();
    for b in 0..blocks {
        v.read(b * u64::from(BLOCK), &mut buf)
            .await
            .expect("cold read");
        assert!(buf == pool[b as usize % pool.len()], "block {b} reads back");
    }
    let cold = start.pass(rep.bytes, size);
    // (A read that found its block cold just before readahead filled it fetches it again.)
    let fetched = v.stats().await.blocks_fetched;
    assert!(
        fetched >= blocks,
        "every block fetched: {fetched} of {blocks}"
    );
    drop(v);
    drop(server);
    std::fs::remove_dir_all(&dir).expect("remove the volume's cache");
    (flush, cold)
}

fn main() {
    let args = parse_args(Args::defaults(256, 0, 3));
    let rt = args::runtime();
    let out = if args.s3 {
        // The S3 server's own runtime: its CPU is told apart by its threads' names.
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(SERVER_THREADS)
            .thread_keep_alive(Duration::from_secs(3600))
            .enable_all()
            .build()
            .expect("server runtime");
        rt.block_on(run_s3(&args, server_rt.handle()))
    } else {
        rt.block_on(run(&args))
    };
    let text = serde_json::to_string_pretty(&out).expect("json");
    println!("{text}");
    if let Some(p) = &args.json {
        std::fs::write(p, text + "\n").expect("write --json file");
    }
}

async fn run(a: &Args) -> serde_json::Value {
    let blocks = (a.size_mib << 20) / u64::from(BLOCK);
    let base = bench_dir(a);
    let key = Arc::new(VolumeKey::from_bytes([0x42; 32]));
    let (mut encode, mut flush) = (serde_json::Map::new(), serde_json::Map::new());
    for kind in KINDS {
        let pool: Vec<Vec<u8>> = (0..POOL as u64).map(|s| block(kind, s)).collect();
        let plain: Vec<Pass> = (0..a.rounds)
            .map(|_| encode_pass(&pool, blocks, None))
            .collect();
        let sealed: Vec<Pass> = (0..a.rounds)
            .map(|_| encode_pass(&pool, blocks, Some(&key)))
            .collect();
        encode.insert(
            kind.into(),
            json!({ "plain": summarize(&plain), "encrypted": summarize(&sealed) }),
        );
        let mut passes = Vec::new();
        for round in 0..a.rounds {
            let dir = base.path().join(format!("{kind}-{round}"));
            passes.push(flush_pass(dir, &pool, blocks).await);
        }
        flush.insert(kind.into(), summarize(&passes));
    }
    report(a, [("encode", encode.into()), ("flush", flush.into())])
}

/// One `flush_s3` mode's passes: (flush, cold read).
type ModePasses = (Vec<Pass>, Vec<Pass>);

async fn run_s3(a: &Args, server_rt: &tokio::runtime::Handle) -> serde_json::Value {
    let blocks = (a.size_mib << 20) / u64::from(BLOCK);
    let base = bench_dir(a);
    let (mut flush, mut cold) = (serde_json::Map::new(), serde_json::Map::new());
    for kind in KINDS {
        let pool: Vec<Vec<u8>> = (0..POOL as u64).map(|s| block(kind, s)).collect();
        let mut passes: Vec<ModePasses> = S3_MODES.iter().map(|_| Default::default()).collect();
        for round in 0..a.rounds {
            for (i, (mode, target)) in S3_MODES.iter().enumerate() {
                let dir = base.path().join(format!("{kind}-{mode}-{round}"));
                let (f, c) = s3_flush_pass(server_rt, dir, &pool, blocks, *target).await;
                passes[i].0.push(f);
                passes[i].1.push(c);
            }
        }
        let modes = |pick: fn(&ModePasses) -> &Vec<Pass>| {
            S3_MODES
                .iter()
                .zip(&passes)
                .map(|((mode, _), p)| (mode.to_string(), summarize(pick(p))))
                .collect::<serde_json::Map<_, _>>()
        };
        flush.insert(kind.into(), modes(|p| &p.0).into());
        cold.insert(kind.into(), modes(|p| &p.1).into());
    }
    report(
        a,
        [("flush_s3", flush.into()), ("cold_read_s3", cold.into())],
    )
}

/// The report: the bench and its parameters, then `sections`.
fn report<const N: usize>(a: &Args, sections: [(&str, serde_json::Value); N]) -> serde_json::Value {
    let mut out = json!({
        "bench": "flush_cpu",
        "size_mib": a.size_mib,
        "block_size": BLOCK,
        "blocks_per_pack": BLOCKS_PER_PACK,
        "rounds": a.rounds,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    if let Some(fields) = out.as_object_mut() {
        fields.extend(sections.map(|(name, value)| (name.to_string(), value)));
    }
    out
}

/// The directory the volumes' caches live in (`--dir`, else the system's temporary one).
fn bench_dir(a: &Args) -> tempfile::TempDir {
    match &a.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("bench dir")
}
