//! `readahead` benchmark: cold sequential reads from a store with latency, with readahead
//! off and on, for one reader and for several readers at once (each reading its own part of
//! the volume in order, as fio's jobs with `offset_increment` or a guest reading several
//! files do).
//!
//! The store is the in-memory one behind `glidefs_testkit::FaultyStore`, which adds a fixed
//! latency before every call (`--latency-ms`, default 5: a nearby S3) and counts the GETs.
//! A pass: the cache emptied (`evict_to(0)`), then every reader reads its part one block per
//! `Volume::read`, every block compared with what was written. A volume with an object
//! store nearby is latency-bound on cold reads, which is what readahead is for: a run
//! of blocks written in sequence comes in one ranged GET per window step.
//!
//! Figures: MB/s (the bytes read over the pass's wall time) and GETs per pass, each the
//! median of `--rounds` passes; `speedup` is on/off. Usage: `cargo bench -p glidefs-volume
//! --bench readahead -- [--json PATH] [--size-mib N] [--rounds N] [--latency-ms N]`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_testkit::{FaultyStore, Op};
use glidefs_volume::{Volume, VolumeConfig};
use serde_json::json;

#[path = "common/args.rs"]
mod args;
use args::{parse_args, Args};
#[path = "common/median.rs"]
mod median;
use median::median;

const BLOCK: u32 = 128 * 1024;
/// Readers per pass.
const READERS: [u64; 2] = [1, 4];

/// One pass: (MB/s, GETs).
async fn pass(
    v: &Arc<Volume>,
    store: &FaultyStore,
    data: &Arc<Vec<u8>>,
    readers: u64,
) -> (f64, u64) {
    v.evict_to(0).await.expect("evict");
    let blocks = data.len() as u64 / u64::from(BLOCK);
    let each = blocks / readers;
    let gets = store.counts().calls(Op::Get);
    let t = Instant::now();
    let tasks: Vec<_> = (0..readers)
        .map(|r| {
            let (v, data) = (Arc::clone(v), Arc::clone(data));
            tokio::spawn(async move {
                let mut buf = vec![0u8; BLOCK as usize];
                for b in r * each..(r + 1) * each {
                    let at = (b * u64::from(BLOCK)) as usize;
                    v.read(at as u64, &mut buf).await.expect("cold read");
                    assert!(buf[..] == data[at..at + BLOCK as usize], "block {b}");
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("reader task");
    }
    let wall = t.elapsed();
    let read = each * readers * u64::from(BLOCK);
    (
        read as f64 / wall.as_secs_f64() / 1e6,
        store.counts().calls(Op::Get) - gets,
    )
}

/// Every pass of one readahead setting: `{"readers_N": {"mb_s", "gets"}}`.
async fn mode(a: &Args, readahead_blocks: u32, data: &Arc<Vec<u8>>) -> serde_json::Value {
    let dir = tempfile::tempdir().expect("cache dir");
    let store = Arc::new(FaultyStore::new(Arc::new(
        object_store::memory::InMemory::new(),
    )));
    let mut cfg = VolumeConfig::new("readahead", dir.path(), data.len() as u64);
    cfg.block_size = BLOCK;
    cfg.readahead_blocks = readahead_blocks;
    let v = Volume::open(cfg, store.clone()).await.expect("open volume");
    v.write(0, data).await.expect("fill");
    v.sync_to_store().await.expect("sync_to_store");
    store.set_latency(Duration::from_millis(a.latency_ms));
    let mut out = serde_json::Map::new();
    for readers in READERS {
        let (mut mbs, mut gets) = (Vec::new(), Vec::new());
        for _ in 0..a.rounds {
            let (m, g) = pass(&v, &store, data, readers).await;
            mbs.push(m);
            gets.push(g as f64);
        }
        out.insert(
            format!("readers_{readers}"),
            json!({ "mb_s": median(mbs), "gets": median(gets) }),
        );
    }
    out.into()
}

fn main() {
    let a = parse_args(Args::defaults(64, 0, 3));
    let rt = args::runtime();
    let data = Arc::new(glidefs_testkit::noise(7, (a.size_mib << 20) as usize));
    let window = VolumeConfig::new("defaults", "/", 0).readahead_blocks;
    let (off, on) =
        rt.block_on(async { (mode(&a, 0, &data).await, mode(&a, window, &data).await) });
    let speedup: serde_json::Map<String, serde_json::Value> = READERS
        .iter()
        .map(|r| {
            let k = format!("readers_{r}");
            let ratio = on[&k]["mb_s"].as_f64().unwrap_or(f64::NAN)
                / off[&k]["mb_s"].as_f64().unwrap_or(f64::NAN);
            (k, json!((ratio * 100.0).round() / 100.0))
        })
        .collect();
    let out = json!({
        "bench": "readahead",
        "size_mib": a.size_mib,
        "block_size": BLOCK,
        "latency_ms": a.latency_ms,
        "readahead_blocks": window,
        "rounds": a.rounds,
        "off": off,
        "on": on,
        "speedup": speedup,
    });
    let text = serde_json::to_string_pretty(&out).expect("json");
    println!("{text}");
    if let Some(p) = &a.json {
        std::fs::write(p, text + "\n").expect("write --json file");
    }
}
