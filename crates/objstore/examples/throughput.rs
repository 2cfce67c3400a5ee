//! Overhead of `upload_packs` / `read_block` over raw object store put / ranged get.
//!
//! `cargo run --release -p glidefs-objstore --example throughput -- [memory|local|s3] [packs] [pack_mib]`
//!
//! Prints one JSON object: raw put vs `upload_packs` (same byte counts, same concurrency) and
//! raw ranged get vs `read_block` (same ranges, 16 in flight), plus pack encoding speed.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{self, StreamExt, TryStreamExt};
use glidefs_objstore::{EncodedPack, PackBuilder, PackId, StoreConfig, VolumeStore};
use glidefs_testkit::{block_pattern, S3Server};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

const BLOCK: u32 = 128 * 1024;
const READ_CONCURRENCY: usize = 16;

fn mb_s(bytes: u64, secs: f64) -> f64 {
    (bytes as f64 / 1e6) / secs.max(1e-9)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let backend = args.get(1).map(String::as_str).unwrap_or("s3").to_string();
    let packs: usize = args.get(2).map(|s| s.parse()).transpose()?.unwrap_or(16);
    let pack_mib: usize = args.get(3).map(|s| s.parse()).transpose()?.unwrap_or(8);

    let dir = tempfile::tempdir()?;
    let mut _server = None;
    let store: Arc<dyn ObjectStore> = match backend.as_str() {
        "memory" => glidefs_objstore::open_store("memory://", &Default::default())?,
        "local" => glidefs_objstore::open_store(
            &format!("file://{}", dir.path().display()),
            &Default::default(),
        )?,
        "s3" => {
            let server = S3Server::start().await?;
            let s = server.object_store()?;
            _server = Some(server);
            s
        }
        other => return Err(format!("unknown backend {other}").into()),
    };
    let cfg = StoreConfig::default();
    let vs = VolumeStore::new(Arc::clone(&store), "bench", cfg.clone())?;

    // Build packs (CPU: compression + checksums).
    let blocks_per_pack = pack_mib * 1024 * 1024 / BLOCK as usize;
    let t = Instant::now();
    let encoded: Vec<EncodedPack> = (0..packs)
        .map(|p| {
            let mut b = PackBuilder::new(BLOCK).expect("zstd compressor");
            for i in 0..blocks_per_pack {
                let blk = (p * blocks_per_pack + i) as u64;
                b.add(blk, &block_pattern(blk, 1, BLOCK as usize))
                    .expect("add");
            }
            b.finish(PackId::generate(1, p as u64))
        })
        .collect();
    let encode_s = t.elapsed().as_secs_f64();
    let raw_bytes = (packs * blocks_per_pack) as u64 * BLOCK as u64;
    let stored_bytes: u64 = encoded.iter().map(|p| p.bytes.len() as u64).sum();

    // Raw puts of the same objects under other keys, same concurrency.
    let t = Instant::now();
    stream::iter(encoded.iter().enumerate())
        .map(|(i, p)| {
            let store = Arc::clone(&store);
            let bytes: Bytes = p.bytes.clone();
            async move {
                store
                    .put(&Path::from(format!("raw/{i}")), PutPayload::from(bytes))
                    .await
            }
        })
        .buffer_unordered(cfg.upload_concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let raw_put_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    vs.upload_packs(&encoded).await?;
    let upload_s = t.elapsed().as_secs_f64();

    // Ranged reads of every block: raw get_range vs verified, decompressed read_block.
    let locations: Vec<_> = encoded
        .iter()
        .flat_map(|p| p.locations.iter().cloned())
        .collect();
    let t = Instant::now();
    let fetched: u64 = stream::iter(locations.iter())
        .map(|(_, loc)| {
            let store = Arc::clone(&store);
            let path = Path::from(format!("volumes/bench/packs/{}.pack", loc.pack));
            async move {
                store
                    .get_range(&path, loc.offset..loc.offset + loc.len as u64)
                    .await
                    .map(|b| b.len() as u64)
            }
        })
        .buffer_unordered(READ_CONCURRENCY)
        .try_fold(0u64, |acc, n| async move { Ok(acc + n) })
        .await?;
    let raw_get_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let delivered: u64 = stream::iter(locations.iter())
        .map(|(blk, loc)| vs.read_block(*blk, loc))
        .buffer_unordered(READ_CONCURRENCY)
        .try_fold(0u64, |acc, b| async move { Ok(acc + b.len() as u64) })
        .await?;
    let read_s = t.elapsed().as_secs_f64();

    println!(
        "{{\"backend\":\"{backend}\",\"packs\":{packs},\"pack_mib\":{pack_mib},\"block_bytes\":{BLOCK},\
\"raw_bytes\":{raw_bytes},\"stored_bytes\":{stored_bytes},\
\"encode_raw_mb_s\":{:.1},\"raw_put_mb_s\":{:.1},\"upload_packs_mb_s\":{:.1},\
\"raw_get_range_mb_s\":{:.1},\"read_block_stored_mb_s\":{:.1},\"read_block_raw_mb_s\":{:.1}}}",
        mb_s(raw_bytes, encode_s),
        mb_s(stored_bytes, raw_put_s),
        mb_s(stored_bytes, upload_s),
        mb_s(fetched, raw_get_s),
        mb_s(fetched, read_s),
        mb_s(delivered, read_s),
    );
    Ok(())
}
