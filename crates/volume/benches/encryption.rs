//! `encryption` benchmark: a volume's flush to the store and its cold reads back, encrypted
//! against unencrypted, interleaved in one run.
//!
//! Per round and per mode: open a volume on a fresh cache directory, write `--size-mib` of
//! incompressible data, `sync_to_store` (timed: packs built, sealed when encrypted, uploaded,
//! manifest published), evict everything, read the volume back sequentially in 128 KiB reads
//! (timed: cold fetches with readahead, frames opened, blocks filled into the cache). Stores:
//! `memory` (in-process `InMemory`: the engine's CPU cost) and `s3` (the in-process S3 server
//! on loopback: a store in the loop).
//!
//! Usage: `cargo bench -p glidefs-volume --bench encryption -- [--size-mib N] [--rounds N]
//! [--store memory|s3|both]`. Prints one JSON object: MB/s per mode (median of the rounds)
//! and `ratio` = encrypted / unencrypted throughput.

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_volume::{Volume, VolumeConfig, VolumeKey};
use object_store::ObjectStore;
use serde_json::json;

const BLOCK: usize = 128 * 1024;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// One round of one mode: (flush time, cold read time).
async fn round(
    store: Arc<dyn ObjectStore>,
    name: &str,
    size: u64,
    key: Option<Arc<VolumeKey>>,
) -> (Duration, Duration) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cfg = VolumeConfig::new(name, dir.path(), size);
    cfg.encryption_key = key;
    let v = Volume::open(cfg, store).await.expect("open");
    let data = glidefs_testkit::noise(7, 4 << 20);
    for off in (0..size).step_by(data.len()) {
        v.write(off, &data).await.expect("write");
    }
    let t = Instant::now();
    v.sync_to_store().await.expect("sync_to_store");
    let flush = t.elapsed();
    v.evict_to(0).await.expect("evict");
    let mut buf = vec![0u8; BLOCK];
    let t = Instant::now();
    for off in (0..size).step_by(BLOCK) {
        v.read(off, &mut buf).await.expect("cold read");
    }
    let cold = t.elapsed();
    assert!(v.stats().await.blocks_fetched >= size / BLOCK as u64);
    v.close().await.expect("close");
    (flush, cold)
}

fn main() {
    let mut size_mib = 64u64;
    let mut rounds = 5usize;
    let mut which = "both".to_string();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--size-mib" => size_mib = args.next().and_then(|v| v.parse().ok()).unwrap_or(size_mib),
            "--rounds" => rounds = args.next().and_then(|v| v.parse().ok()).unwrap_or(rounds),
            "--store" => which = args.next().unwrap_or(which),
            _ => {} // `cargo bench` passes --bench
        }
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let size = size_mib << 20;
    let key = Arc::new(VolumeKey::from_bytes([0x42; 32]));
    let mut out = serde_json::Map::new();
    rt.block_on(async {
        let server = match which.as_str() {
            "s3" | "both" => Some(glidefs_testkit::S3Server::start().await.expect("s3 server")),
            _ => None,
        };
        let mut stores: Vec<(&str, Arc<dyn ObjectStore>)> = Vec::new();
        if which != "s3" {
            stores.push(("memory", Arc::new(object_store::memory::InMemory::new())));
        }
        if let Some(s) = &server {
            stores.push(("s3", s.object_store().expect("s3 client")));
        }
        for (label, store) in stores {
            let (mut fp, mut fe, mut cp, mut ce) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
            for r in 0..rounds.max(1) {
                // Alternate which mode goes first.
                for sealed in [r % 2 == 1, r % 2 == 0] {
                    let name = format!("{label}-{r}-{}", if sealed { "enc" } else { "plain" });
                    let k = sealed.then(|| key.clone());
                    let (f, c) = round(store.clone(), &name, size, k).await;
                    if sealed {
                        fe.push(f);
                        ce.push(c);
                    } else {
                        fp.push(f);
                        cp.push(c);
                    }
                }
            }
            let mbps = |d: Duration| size as f64 / d.as_secs_f64() / 1e6;
            let (fp, fe, cp, ce) = (
                mbps(median(fp)),
                mbps(median(fe)),
                mbps(median(cp)),
                mbps(median(ce)),
            );
            out.insert(
                label.to_string(),
                json!({
                    "flush_mb_s_plain": (fp * 10.0).round() / 10.0,
                    "flush_mb_s_encrypted": (fe * 10.0).round() / 10.0,
                    "flush_ratio": ((fe / fp) * 1000.0).round() / 1000.0,
                    "cold_read_mb_s_plain": (cp * 10.0).round() / 10.0,
                    "cold_read_mb_s_encrypted": (ce * 10.0).round() / 10.0,
                    "cold_read_ratio": ((ce / cp) * 1000.0).round() / 1000.0,
                }),
            );
        }
    });
    out.insert("bench".into(), json!("volume-encryption"));
    out.insert("size_mib".into(), json!(size_mib));
    out.insert("rounds".into(), json!(rounds));
    out.insert("block_bytes".into(), json!(BLOCK));
    println!("{}", serde_json::Value::Object(out));
}
