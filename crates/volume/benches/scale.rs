//! `scale` benchmark: what the engine costs as volumes get big and numerous (issue 12).
//!
//! Modes (the first free argument; all of them by default):
//! - `rss`: opens one `--big-tib` TiB volume (default 16) and `--volumes` idle volumes of
//!   `--volume-gib` GiB each (default 1000 × 64) in this process, against the in-memory object
//!   store, cache directories under `--dir` (default the system temp dir), and reports VmRSS
//!   (from /proc/self/status) before, after the big volume and after the set: bytes per idle
//!   volume. Target: at most 2 MiB per idle volume.
//! - `pause`: a `--pause-tib` TiB cache (default 1) whose every block is marked remote (fully
//!   mapped), with `--dirty-mib` MiB (default 1024) of randomly placed full-block writes; a
//!   probe thread enters the rotation gate in a loop while `rotate()`, `checkpoint()` and
//!   `complete_flush()` run and reports the longest wait it saw (`*_gate_stall_ms`: the I/O
//!   stall as a reader sees it, including scheduler noise), next to the write-gate hold the
//!   cache itself measured (`*_gate_hold_ms`, `Cache::gate_holds`) and each call's duration.
//! - `manifest`: a `--manifest-tib` TiB volume (default 1) with `--stored-gib` GiB (default
//!   100) already mapped in the (in-memory) store, published as one generation (the packs
//!   are stand-ins: the blocks are never read); the volume opens on it, takes one 4 KiB write
//!   and flushes: the manifest bytes that flush uploads, next to what format 1 (the whole map
//!   per flush) would upload. Target: under 1 MiB.
//!
//! Usage: `cargo bench -p glidefs-volume --bench scale -- [rss|pause|manifest] [--json PATH]
//! [--big-tib N] [--volumes N] [--volume-gib N] [--pause-tib N] [--dirty-mib N]
//! [--manifest-tib N] [--stored-gib N] [--dir DIR]`.
//! Prints one JSON object. CI never asserts on these numbers.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_cache::{Cache, CacheOptions, Geometry};
use glidefs_objstore::{BlockLocation, Manifest, PackId, StoreConfig, VolumeStore};
use glidefs_volume::{Volume, VolumeConfig};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::{RngExt, SeedableRng};
use serde_json::json;

const BLOCK: u32 = 128 * 1024;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

struct Args {
    modes: Vec<String>,
    json: Option<PathBuf>,
    big_tib: u64,
    volumes: usize,
    volume_gib: u64,
    pause_tib: u64,
    dirty_mib: u64,
    manifest_tib: u64,
    stored_gib: u64,
    dir: Option<PathBuf>,
}

fn parse_args() -> Args {
    let mut a = Args {
        modes: Vec::new(),
        json: None,
        big_tib: 16,
        volumes: 1000,
        volume_gib: 64,
        pause_tib: 1,
        dirty_mib: 1024,
        manifest_tib: 1,
        stored_gib: 100,
        dir: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().unwrap_or_else(|| panic!("{name} needs a value"));
        let num = |name: &str, v: String| -> u64 {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: integer, got {v}"))
        };
        match arg.as_str() {
            "--json" => a.json = Some(PathBuf::from(val("--json"))),
            "--big-tib" => a.big_tib = num("--big-tib", val("--big-tib")),
            "--volumes" => a.volumes = num("--volumes", val("--volumes")) as usize,
            "--volume-gib" => a.volume_gib = num("--volume-gib", val("--volume-gib")),
            "--pause-tib" => a.pause_tib = num("--pause-tib", val("--pause-tib")),
            "--dirty-mib" => a.dirty_mib = num("--dirty-mib", val("--dirty-mib")),
            "--manifest-tib" => a.manifest_tib = num("--manifest-tib", val("--manifest-tib")),
            "--stored-gib" => a.stored_gib = num("--stored-gib", val("--stored-gib")),
            "--dir" => a.dir = Some(PathBuf::from(val("--dir"))),
            "rss" | "pause" | "manifest" => a.modes.push(arg),
            _ => {} // `cargo bench` passes --bench and filters
        }
    }
    if a.modes.is_empty() {
        a.modes = vec!["rss".into(), "pause".into(), "manifest".into()];
    }
    a
}

/// VmRSS of this process in bytes.
fn rss() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

fn config(name: &str, dir: PathBuf, size: u64) -> VolumeConfig {
    let mut c = VolumeConfig::new(name, dir, size);
    c.block_size = BLOCK;
    c
}

fn main() {
    let args = parse_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let base = match &args.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("bench dir");
    let mut out = serde_json::Map::new();
    for mode in &args.modes {
        let v = match mode.as_str() {
            "rss" => rt.block_on(rss_mode(&args, base.path())),
            "manifest" => rt.block_on(manifest_mode(&args, base.path())),
            _ => pause_mode(&args, base.path()),
        };
        out.insert(mode.clone(), v);
    }
    let text = serde_json::to_string_pretty(&serde_json::Value::Object(out)).expect("json");
    println!("{text}");
    if let Some(p) = &args.json {
        std::fs::write(p, text + "\n").expect("write --json file");
    }
}

async fn rss_mode(a: &Args, base: &std::path::Path) -> serde_json::Value {
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let before = rss();
    let t = Instant::now();
    let big = Volume::open(
        config("big", base.join("big"), a.big_tib * TIB),
        store.clone(),
    )
    .await
    .expect("open the big volume");
    let big_open = t.elapsed();
    let after_big = rss();
    let t = Instant::now();
    let mut set = Vec::with_capacity(a.volumes);
    for i in 0..a.volumes {
        let name = format!("idle-{i:04}");
        let v = Volume::open(
            config(&name, base.join(&name), a.volume_gib * GIB),
            store.clone(),
        )
        .await
        .expect("open an idle volume");
        set.push(v);
    }
    let set_open = t.elapsed();
    let after_set = rss();
    let big_mem = big.cache().memory();
    let idle_mem = set.first().map(|v| v.cache().memory()).unwrap_or_default();
    let per_volume = (after_set.saturating_sub(after_big)) / (a.volumes.max(1) as u64);
    let out = json!({
        "big_volume_tib": a.big_tib,
        "idle_volumes": a.volumes,
        "idle_volume_gib": a.volume_gib,
        "rss_before_mib": mib(before),
        "rss_after_big_mib": mib(after_big),
        "rss_after_set_mib": mib(after_set),
        "big_volume_rss_mib": mib(after_big.saturating_sub(before)),
        "per_idle_volume_rss_kib": per_volume as f64 / 1024.0,
        "target_per_idle_volume_kib": 2048,
        "big_cache_map_bytes": big_mem.state_bytes + big_mem.crc_bytes,
        "idle_cache_map_bytes": idle_mem.state_bytes + idle_mem.crc_bytes,
        "big_open_ms": big_open.as_secs_f64() * 1e3,
        "set_open_ms": set_open.as_secs_f64() * 1e3,
    });
    for v in set {
        v.close().await.expect("close");
    }
    big.close().await.expect("close");
    out
}

/// Runs `f` while a probe thread enters and leaves the gate in a loop; returns `f`'s duration
/// and the longest `enter()` the probe saw.
fn probed<T>(cache: &Arc<Cache>, f: impl FnOnce() -> T) -> (T, Duration, Duration, u64) {
    let stop = Arc::new(AtomicBool::new(false));
    let probe = {
        let (cache, stop) = (cache.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut worst, mut n) = (Duration::ZERO, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let g = cache.enter();
                worst = worst.max(t.elapsed());
                drop(g);
                n += 1;
            }
            (worst, n)
        })
    };
    std::thread::sleep(Duration::from_millis(20));
    let t = Instant::now();
    let r = f();
    let took = t.elapsed();
    std::thread::sleep(Duration::from_millis(20));
    stop.store(true, Ordering::Relaxed);
    let (worst, n) = probe.join().expect("probe thread");
    (r, took, worst, n)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pause_mode(a: &Args, base: &std::path::Path) -> serde_json::Value {
    let size = a.pause_tib * TIB;
    let geo = Geometry::new(size, BLOCK).expect("geometry");
    let dir = base.join("pause");
    let rss0 = rss();
    let cache = Arc::new(Cache::open(&dir, geo, CacheOptions::default()).expect("open cache"));
    let t = Instant::now();
    cache.set_remote(0..geo.num_blocks());
    let map_all = t.elapsed();
    let dirty_blocks = (a.dirty_mib << 20) / u64::from(BLOCK);
    let mut rng = rand::rngs::StdRng::seed_from_u64(12);
    let mut blocks = std::collections::BTreeSet::new();
    while (blocks.len() as u64) < dirty_blocks.min(geo.num_blocks()) {
        blocks.insert(rng.random_range(0..geo.num_blocks()));
    }
    let data = vec![0xA5u8; BLOCK as usize];
    let t = Instant::now();
    for &b in &blocks {
        cache.write(b * u64::from(BLOCK), &data).expect("write");
    }
    let write_all = t.elapsed();
    let rss_dirty = rss();
    let mem_dirty = cache.memory();
    let (rot, rotate, rotate_stall, rotate_probes) =
        probed(&cache, || cache.rotate().expect("rotate").expect("dirty"));
    let (_, checkpoint, checkpoint_stall, checkpoint_probes) =
        probed(&cache, || cache.checkpoint().expect("checkpoint"));
    let (_, complete, complete_stall, _) =
        probed(&cache, || cache.complete_flush(&rot).expect("complete"));
    let holds = cache.gate_holds();
    let checkpoint_bytes = std::fs::metadata(dir.join("checkpoint"))
        .map(|m| m.len())
        .unwrap_or(0);
    json!({
        "volume_tib": a.pause_tib,
        "mapped_blocks": geo.num_blocks(),
        "dirty_blocks": blocks.len(),
        "dirty_mib": (blocks.len() as u64 * u64::from(BLOCK)) >> 20,
        "map_all_ms": ms(map_all),
        "write_dirty_ms": ms(write_all),
        "rss_mapped_and_dirty_mib": mib(rss_dirty.saturating_sub(rss0)),
        "state_map_bytes": mem_dirty.state_bytes,
        "crc_store_bytes": mem_dirty.crc_bytes,
        "crc_chunks": mem_dirty.crc_chunks,
        "rotate_ms": ms(rotate),
        "rotate_gate_stall_ms": ms(rotate_stall),
        "rotate_gate_hold_ms": ms(holds.rotate.last),
        "rotate_probes": rotate_probes,
        "checkpoint_ms": ms(checkpoint),
        "checkpoint_gate_stall_ms": ms(checkpoint_stall),
        "checkpoint_gate_hold_ms": ms(holds.checkpoint.last),
        "checkpoint_probes": checkpoint_probes,
        "checkpoint_file_bytes": checkpoint_bytes,
        "complete_flush_ms": ms(complete),
        "complete_flush_gate_stall_ms": ms(complete_stall),
        "complete_flush_gate_hold_ms": ms(holds.complete_flush.last),
    })
}

/// Size of the manifest object of `generation` of volume `name`.
async fn manifest_bytes(store: &Arc<dyn ObjectStore>, name: &str, generation: u64) -> u64 {
    let p = Path::from(format!("volumes/{name}/manifest/{generation:020}"));
    store.head(&p).await.expect("head manifest").size
}

async fn manifest_mode(a: &Args, base: &std::path::Path) -> serde_json::Value {
    const NAME: &str = "mapped";
    const PER_PACK: u64 = 128; // 16 MiB packs
    const HOLE: u64 = 1000; // an unmapped block inside a full segment: written below
    let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let size = a.manifest_tib * TIB;
    let stored_blocks = (a.stored_gib * GIB / u64::from(BLOCK)).min(size / u64::from(BLOCK));
    // The store: stand-in packs (HEAD-able objects) and one generation mapping every block.
    let vs = VolumeStore::new(store.clone(), NAME, StoreConfig::default()).expect("store");
    vs.load_manifest().await.expect("load");
    let mut m = Manifest::new(NAME, BLOCK, size).successor();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let packs = stored_blocks.div_ceil(PER_PACK);
    let mut ids = Vec::new();
    for p in 0..packs {
        let id = PackId::generate(1, p);
        let path = Path::from(format!("volumes/{NAME}/packs/{}.pack", id.as_str()));
        store
            .put(&path, PutPayload::from_static(b"stand-in"))
            .await
            .expect("put pack");
        ids.push(id);
    }
    let rss_before_map = rss();
    let mut offset = 0u64;
    for (p, id) in (0..packs).zip(ids) {
        for b in p * PER_PACK..((p + 1) * PER_PACK).min(stored_blocks) {
            if b % PER_PACK == 0 {
                offset = 0;
            }
            let len = rng.random_range(40_000..131_092u32);
            if b != HOLE {
                m.insert(
                    b,
                    BlockLocation {
                        pack: id.clone(),
                        entry: (b % PER_PACK) as u32,
                        offset,
                        len,
                        raw_crc: rng.random(),
                    },
                );
            }
            offset += u64::from(len);
        }
    }
    let map_rss = rss().saturating_sub(rss_before_map);
    let v1_bytes = m.encode_v1().expect("encode v1").len() as u64;
    let t = Instant::now();
    vs.publish_manifest(&mut m)
        .await
        .expect("publish generation 1");
    let publish_full = t.elapsed();
    let full_bytes = manifest_bytes(&store, NAME, 1).await;
    drop(m);

    let t = Instant::now();
    let v = Volume::open(config(NAME, base.join(NAME), size), store.clone())
        .await
        .expect("open the mapped volume");
    let open = t.elapsed();
    v.write(HOLE * u64::from(BLOCK) + 8192, &[0x5A; 4096])
        .await
        .expect("write");
    let t = Instant::now();
    let r = v.sync_to_store().await.expect("flush");
    let flush = t.elapsed();
    let small_bytes = manifest_bytes(&store, NAME, r.generation).await;
    let out = json!({
        "volume_tib": a.manifest_tib,
        "stored_gib": a.stored_gib,
        "mapped_blocks": stored_blocks - 1,
        "format1_manifest_bytes_per_flush": v1_bytes,
        "format2_first_publish_bytes": full_bytes,
        "format2_first_publish_ms": ms(publish_full),
        "open_ms": ms(open),
        "manifest_in_memory_mib": mib(map_rss),
        "small_write_flush_generation": r.generation,
        "small_write_flush_manifest_bytes": small_bytes,
        "small_write_flush_pack_bytes": r.bytes,
        "small_write_flush_ms": ms(flush),
        "target_manifest_bytes": 1 << 20,
    });
    v.close().await.expect("close");
    out
}
