//! `store` benchmark: the engine against the raw medium it sits on, in one run.
//!
//! - 4 KiB random cache-hit reads and writes through the engine (`Volume::read`/`write`, and
//!   the cache's plain `read_into`/`write` that USER_COPY uses) vs raw `pread`/`pwrite` on a
//!   file of the same size in the same directory; single thread; best of several rounds.
//!   "first-touch" writes turn a block Dirty (stripe lock + WAL append, no fsync).
//! - Flush to the in-process S3 server (`sync_to_store` of a fully dirty volume, incompressible
//!   data) vs raw PUTs of the same number and size of objects at the same concurrency.
//! - Cold reads (sequential, block-sized, after evicting everything) vs raw ranged GETs of the
//!   same size at the readahead depth.
//!
//! Usage: `cargo bench -p glidefs-volume --bench store -- [--json PATH] [--size-mib N]
//! [--ops N] [--rounds N] [--dir DIR]`. Prints one JSON object; ratios are engine/raw
//! throughput (higher is better, 1.0 = as fast as raw).

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use glidefs_volume::{Volume, VolumeConfig};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use rand::{Rng, RngExt, SeedableRng};
use serde_json::json;

const PAGE: usize = 4096;
const BLOCK: u32 = 128 * 1024;

#[path = "common/args.rs"]
mod args;
use args::{parse_args, Args};

fn best<F: FnMut() -> Duration>(rounds: usize, mut f: F) -> Duration {
    (0..rounds.max(1)).map(|_| f()).min().unwrap_or_default()
}

fn ns_per_op(d: Duration, ops: usize) -> f64 {
    d.as_nanos() as f64 / ops as f64
}

fn cmp(engine: Duration, raw: Duration, ops: usize) -> serde_json::Value {
    json!({
        "engine_ns_per_op": ns_per_op(engine, ops),
        "raw_ns_per_op": ns_per_op(raw, ops),
        "ratio": raw.as_secs_f64() / engine.as_secs_f64(),
    })
}

fn raw_file(path: &std::path::Path, size: u64, fill: bool) -> File {
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .expect("create raw file");
    f.set_len(size).expect("set_len");
    if fill {
        let chunk = vec![0x5Au8; 1 << 20];
        for off in (0..size).step_by(chunk.len()) {
            f.write_all_at(&chunk, off).expect("fill raw file");
        }
    }
    f
}

fn config(name: &str, dir: PathBuf, size: u64) -> VolumeConfig {
    let mut c = VolumeConfig::new(name, dir, size);
    c.block_size = BLOCK;
    c
}

async fn fill_volume(v: &Volume, size: u64, random: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut chunk = vec![0x5Au8; 1 << 20];
    for off in (0..size).step_by(chunk.len()) {
        if random {
            rng.fill_bytes(&mut chunk);
        }
        v.write(off, &chunk).await.expect("fill volume");
    }
}

fn main() {
    let args = parse_args(Args::defaults(256, 200_000, 3));
    let rt = args::runtime();
    let out = rt.block_on(run(&args));
    let text = serde_json::to_string_pretty(&out).expect("json");
    println!("{text}");
    if let Some(p) = &args.json {
        std::fs::write(p, text + "\n").expect("write --json file");
    }
}

async fn run(a: &Args) -> serde_json::Value {
    let size = a.size_mib << 20;
    let base = match &a.dir {
        Some(d) => tempfile::tempdir_in(d),
        None => tempfile::tempdir(),
    }
    .expect("bench dir");
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let pages = size / PAGE as u64;
    let offs: Vec<u64> = (0..a.ops)
        .map(|_| rng.random_range(0..pages) * PAGE as u64)
        .collect();
    let data = vec![0xC3u8; PAGE];
    let mut buf = vec![0u8; PAGE];

    // ---- cache-hit 4 KiB I/O -------------------------------------------------------------
    let raw = raw_file(&base.path().join("raw.img"), size, true);
    let mem: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
    let vol = Volume::open(config("hit", base.path().join("hit"), size), mem.clone())
        .await
        .expect("open volume");
    fill_volume(&vol, size, false).await;
    let cache = vol.cache().clone();

    let mut r = Vec::new();
    for _ in 0..a.rounds {
        let raw_read = best(1, || {
            let t = Instant::now();
            for &o in &offs {
                raw.read_exact_at(&mut buf, o).expect("pread");
            }
            t.elapsed()
        });
        let t = Instant::now();
        for &o in &offs {
            vol.read(o, &mut buf).await.expect("engine read");
        }
        let vol_read = t.elapsed();
        let cache_read = best(1, || {
            let t = Instant::now();
            for &o in &offs {
                cache.read_into(o, &mut buf, &[]).expect("cache read");
            }
            t.elapsed()
        });
        let raw_write = best(1, || {
            let t = Instant::now();
            for &o in &offs {
                raw.write_all_at(&data, o).expect("pwrite");
            }
            t.elapsed()
        });
        let t = Instant::now();
        for &o in &offs {
            vol.write(o, &data).await.expect("engine write");
        }
        let vol_write = t.elapsed();
        let cache_write = best(1, || {
            let t = Instant::now();
            for &o in &offs {
                cache.write(o, &data).expect("cache write");
            }
            t.elapsed()
        });
        r.push([
            raw_read,
            vol_read,
            cache_read,
            raw_write,
            vol_write,
            cache_write,
        ]);
    }
    let m = |i: usize| r.iter().map(|x| x[i]).min().unwrap_or_default();
    let n = a.ops;

    // first-touch writes: every write turns a block Dirty (stripe lock + WAL append)
    let blocks = size / u64::from(BLOCK);
    let mut order: Vec<u64> = (0..blocks).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.random_range(0..=i));
    }
    let touch: Vec<u64> = order
        .iter()
        .map(|b| {
            b * u64::from(BLOCK) + rng.random_range(0..u64::from(BLOCK) / PAGE as u64) * PAGE as u64
        })
        .collect();
    let mut ft = Vec::new();
    for round in 0..a.rounds {
        let raw2 = raw_file(
            &base.path().join(format!("raw-ft-{round}.img")),
            size,
            false,
        );
        let t = Instant::now();
        for &o in &touch {
            raw2.write_all_at(&data, o).expect("pwrite");
        }
        let raw_t = t.elapsed();
        let v = Volume::open(
            config("ft", base.path().join(format!("ft-{round}")), size),
            mem.clone(),
        )
        .await
        .expect("open");
        let t = Instant::now();
        for &o in &touch {
            v.write(o, &data).await.expect("first-touch write");
        }
        ft.push((v.cache().wal_seq(), t.elapsed(), raw_t));
    }
    let ft_engine = ft.iter().map(|x| x.1).min().unwrap_or_default();
    let ft_raw = ft.iter().map(|x| x.2).min().unwrap_or_default();
    drop(vol);

    // ---- flush to S3 vs raw PUT ----------------------------------------------------------
    let server = glidefs_testkit::S3Server::start().await.expect("s3 server");
    let s3 = server.object_store().expect("s3 client");
    let fv = Volume::open(config("flush", base.path().join("flush"), size), s3.clone())
        .await
        .expect("open");
    fill_volume(&fv, size, true).await;
    let t = Instant::now();
    let rep = fv.sync_to_store().await.expect("sync_to_store");
    let flush_t = t.elapsed();
    let conc = fv.config().store.upload_concurrency;
    let obj_size = (rep.bytes / rep.packs.max(1)) as usize;
    let mut payload = vec![0u8; obj_size];
    rng.fill_bytes(&mut payload);
    let payload = bytes::Bytes::from(payload);
    let t = Instant::now();
    futures::stream::iter(0..rep.packs)
        .map(|i| {
            let (s3, p) = (s3.clone(), payload.clone());
            async move {
                s3.put(
                    &object_store::path::Path::from(format!("raw/obj-{i}")),
                    PutPayload::from(p),
                )
                .await
            }
        })
        .buffer_unordered(conc)
        .try_collect::<Vec<_>>()
        .await
        .expect("raw put");
    let put_t = t.elapsed();
    let flush_mbps = size as f64 / flush_t.as_secs_f64() / 1e6;
    // diagnostic: pack encoding alone (one thread, same incompressible data, no I/O)
    let mut block = vec![0u8; BLOCK as usize];
    rng.fill_bytes(&mut block);
    let t = Instant::now();
    let mut builder = glidefs_objstore::PackBuilder::new(BLOCK).expect("zstd compressor");
    for b in 0..blocks {
        builder.add(b, &block).expect("pack add");
    }
    let encoded = builder.finish(glidefs_objstore::PackId::generate(0, 0));
    let encode_mbps = size as f64 / t.elapsed().as_secs_f64() / 1e6;
    drop(encoded);
    let put_mbps = (obj_size as u64 * rep.packs) as f64 / put_t.as_secs_f64() / 1e6;

    // ---- cold reads vs raw ranged GET ----------------------------------------------------
    fv.evict_to(0).await.expect("evict");
    let mut bbuf = vec![0u8; BLOCK as usize];
    let t = Instant::now();
    for off in (0..size).step_by(BLOCK as usize) {
        fv.read(off, &mut bbuf).await.expect("cold read");
    }
    let cold_t = t.elapsed();
    let stats = fv.stats().await;
    let depth = fv.config().readahead_blocks.max(1) as usize;
    let per_obj = obj_size as u64 / u64::from(BLOCK);
    let t = Instant::now();
    futures::stream::iter(0..blocks)
        .map(|b| {
            let s3 = s3.clone();
            let obj = (b / per_obj.max(1)) % rep.packs.max(1);
            let start = (b % per_obj.max(1)) * u64::from(BLOCK);
            async move {
                s3.get_range(
                    &object_store::path::Path::from(format!("raw/obj-{obj}")),
                    start..start + u64::from(BLOCK),
                )
                .await
            }
        })
        .buffered(depth)
        .try_collect::<Vec<_>>()
        .await
        .expect("raw get");
    let get_t = t.elapsed();
    let cold_mbps = size as f64 / cold_t.as_secs_f64() / 1e6;
    let get_mbps = size as f64 / get_t.as_secs_f64() / 1e6;

    json!({
        "bench": "store",
        "size_mib": a.size_mib,
        "block_size": BLOCK,
        "ops": n,
        "rounds": a.rounds,
        "hit_read_4k": {
            "volume": cmp(m(1), m(0), n),
            "cache_read_into": cmp(m(2), m(0), n),
            "target_ratio": 0.9,
        },
        "hit_write_4k": {
            "volume": cmp(m(4), m(3), n),
            "cache_write": cmp(m(5), m(3), n),
            "first_touch_volume": cmp(ft_engine, ft_raw, touch.len()),
            "first_touch_wal_records": ft.first().map(|x| x.0).unwrap_or(0),
            "target_ratio": 0.6,
        },
        "flush": {
            "engine_mb_s": flush_mbps,
            "raw_put_mb_s": put_mbps,
            "ratio": flush_mbps / put_mbps,
            "packs": rep.packs,
            "pack_bytes": obj_size,
            "upload_concurrency": conc,
            "target_ratio": 0.7,
            "pack_encode_mb_s_one_thread": encode_mbps,
        },
        "cold_read": {
            "engine_mb_s": cold_mbps,
            "raw_get_mb_s": get_mbps,
            "ratio": cold_mbps / get_mbps,
            "depth": depth,
            "blocks_fetched": stats.blocks_fetched,
            "readahead_started": stats.readahead_started,
        },
    })
}
