//! A flush publishes a manifest whose size follows what changed (format 2: only the changed
//! segments' frames and a root), and a new host assembles the whole map from the older
//! manifest objects the latest one points into.

mod common;

use std::sync::Arc;

use common::*;
use glidefs_objstore::SEGMENT_BLOCKS;
use glidefs_volume::{Volume, VolumeConfig};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};

const BLOCK: u32 = 4096;
const SEGMENTS: u64 = 8;

fn big_config(dir: &std::path::Path) -> VolumeConfig {
    let mut c = VolumeConfig::new("vol-m", dir, SEGMENTS * SEGMENT_BLOCKS * u64::from(BLOCK));
    c.block_size = BLOCK;
    c.readahead_blocks = 0;
    c
}

async fn manifest_size(store: &Arc<dyn ObjectStore>, generation: u64) -> u64 {
    let p = Path::from(format!("volumes/vol-m/manifest/{generation:020}"));
    store.head(&p).await.unwrap().size
}

fn block_data(block: u64, version: u8) -> Vec<u8> {
    let mut d = page_data(block, version as usize);
    d.truncate(BLOCK as usize);
    d
}

#[tokio::test]
async fn a_small_flush_publishes_a_small_manifest() {
    let store = mem();
    let d1 = tempfile::tempdir().unwrap();
    let v = Volume::open(big_config(d1.path()), store.clone())
        .await
        .unwrap();
    // Generation 1: 256 blocks in every segment.
    let written: Vec<u64> = (0..SEGMENTS)
        .flat_map(|s| (0..256).map(move |i| s * SEGMENT_BLOCKS + i * 16))
        .collect();
    for &b in &written {
        v.write(b * u64::from(BLOCK), &block_data(b, 1))
            .await
            .unwrap();
    }
    assert_eq!(v.sync_to_store().await.unwrap().generation, 1);
    // Generation 2: one 4 KiB write.
    let changed = 3 * SEGMENT_BLOCKS + 5;
    v.write(changed * u64::from(BLOCK), &block_data(changed, 2))
        .await
        .unwrap();
    assert_eq!(v.sync_to_store().await.unwrap().generation, 2);
    let (full, small) = (
        manifest_size(&store, 1).await,
        manifest_size(&store, 2).await,
    );
    assert!(
        small * 4 < full,
        "one changed segment of {SEGMENTS}: {small} bytes vs {full} for all"
    );

    // A new host sees every block: segment 3 from generation 2, the rest from generation 1.
    let d2 = tempfile::tempdir().unwrap();
    let fresh = Volume::open(big_config(d2.path()), store.clone())
        .await
        .unwrap();
    assert_eq!(fresh.manifest_generation(), 2);
    let mut buf = vec![0u8; BLOCK as usize];
    for &b in written.iter().chain([&changed]) {
        fresh.read(b * u64::from(BLOCK), &mut buf).await.unwrap();
        let version = if b == changed { 2 } else { 1 };
        assert!(buf == block_data(b, version), "block {b}");
    }
}
