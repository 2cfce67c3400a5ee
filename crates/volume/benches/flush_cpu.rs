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
//! Data kinds: `incompressible` (noise), `half_zero` (every 4 KiB page: 2 KiB noise, 2 KiB
//! zeros), `text` (every 4 KiB page: 1 KiB noise, 3 KiB repeated text, about 4:1).
//!
//! Each figure is the median of `--rounds` rounds (default 3). Usage: `cargo bench -p
//! glidefs-volume --bench flush_cpu -- [--json PATH] [--size-mib N] [--rounds N] [--dir DIR]`.
//! Prints one JSON object. Timings vary with load: compare figures of one run, not across
//! runs on a shared machine.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_objstore::{PackBuilder, PackId, VolumeKey};
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

#[path = "common/args.rs"]
mod args;
use args::{parse_args, Args};

fn cpu(id: ClockId) -> Duration {
    let t = clock_gettime(id);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
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
    wall: Duration,
    stored: u64,
    raw_bytes: u64,
}

fn summarize(passes: &[Pass]) -> serde_json::Value {
    let raw = passes.first().map(|p| p.raw_bytes).unwrap_or(0) as f64;
    json!({
        "cpu_s_per_gib": median(passes.iter().map(|p| p.cpu.as_secs_f64() / raw * GIB).collect()),
        "mb_s": median(passes.iter().map(|p| raw / p.wall.as_secs_f64() / 1e6).collect()),
        "stored_ratio": median(passes.iter().map(|p| p.stored as f64 / raw).collect()),
        "rounds_cpu_s_per_gib": passes.iter().map(|p| p.cpu.as_secs_f64() / raw * GIB)
            .collect::<Vec<_>>(),
    })
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
        wall: t0.elapsed(),
        stored,
        raw_bytes: blocks * u64::from(BLOCK),
    }
}

async fn flush_pass(dir: PathBuf, pool: &[Vec<u8>], blocks: u64) -> Pass {
    let size = blocks * u64::from(BLOCK);
    let mut cfg = VolumeConfig::new("flush-cpu", dir, size);
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
        wall: t0.elapsed(),
        stored: rep.bytes,
        raw_bytes: size,
    };
    assert_eq!(rep.blocks, blocks, "every block flushed");
    pass
}

fn main() {
    let args = parse_args(Args {
        json: None,
        size_mib: 256,
        ops: 0,
        rounds: 3,
        dir: None,
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let out = rt.block_on(run(&args));
    let text = serde_json::to_string_pretty(&out).expect("json");
    println!("{text}");
    if let Some(p) = &args.json {
        std::fs::write(p, text + "\n").expect("write --json file");
    }
}

async fn run(a: &Args) -> serde_json::Value {
    let blocks = (a.size_mib << 20) / u64::from(BLOCK);
    let base = match &a.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("bench dir");
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
    json!({
        "bench": "flush_cpu",
        "size_mib": a.size_mib,
        "block_size": BLOCK,
        "blocks_per_pack": BLOCKS_PER_PACK,
        "rounds": a.rounds,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "encode": encode,
        "flush": flush,
    })
}
