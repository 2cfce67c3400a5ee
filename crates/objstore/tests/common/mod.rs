//! Shared helpers for the objstore integration tests.
#![allow(dead_code)]

pub mod proxy;
pub mod snapshots;

use std::sync::Arc;
use std::time::Duration;

use glidefs_objstore::{EncodedPack, Manifest, PackBuilder, PackId, StoreConfig, VolumeStore};
use glidefs_testkit::{block_pattern, S3Server};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::ObjectStore;

pub const BS: u32 = 4096;
pub const VOLUME_SIZE: u64 = 1 << 20; // 256 blocks of 4 KiB

/// Retries quick enough for tests.
pub fn fast_cfg() -> StoreConfig {
    StoreConfig {
        upload_concurrency: 4,
        max_retries: 5,
        retry_base_delay: Duration::from_millis(1),
        retry_max_delay: Duration::from_millis(5),
        ..StoreConfig::default()
    }
}

/// One object store backend under test; keeps its server/directory alive.
pub struct Backend {
    pub name: &'static str,
    pub store: Arc<dyn ObjectStore>,
    _dir: Option<tempfile::TempDir>,
    _server: Option<S3Server>,
}

pub fn memory() -> Backend {
    Backend {
        name: "memory",
        store: Arc::new(InMemory::new()),
        _dir: None,
        _server: None,
    }
}

pub fn local() -> Backend {
    let dir = tempfile::tempdir().expect("tempdir");
    let fs = LocalFileSystem::new_with_prefix(dir.path()).expect("local fs");
    Backend {
        name: "local",
        store: Arc::new(fs),
        _dir: Some(dir),
        _server: None,
    }
}

pub async fn s3() -> Backend {
    let server = S3Server::start().await.expect("s3 server");
    let store = server.object_store().expect("s3 client");
    Backend {
        name: "s3",
        store,
        _dir: None,
        _server: Some(server),
    }
}

pub async fn all_backends() -> Vec<Backend> {
    vec![memory(), local(), s3().await]
}

pub fn volume(store: &Arc<dyn ObjectStore>, name: &str) -> VolumeStore {
    VolumeStore::new(Arc::clone(store), name, fast_cfg()).expect("volume store")
}

/// A pack holding `blocks`, each filled with the pattern of (`block`, `generation`).
pub fn pattern_pack(blocks: &[u64], generation: u64, seq: u64) -> EncodedPack {
    let mut b = PackBuilder::new(BS).expect("zstd compressor");
    for &blk in blocks {
        b.add(blk, &block_pattern(blk, generation, BS as usize))
            .expect("add block");
    }
    b.finish(PackId::generate(generation, seq))
}

/// `base.successor()` with the pack's blocks pointed at it.
pub fn next_manifest(base: &Manifest, packs: &[&EncodedPack]) -> Manifest {
    let mut m = base.successor();
    for p in packs {
        for (blk, loc) in &p.locations {
            m.insert(*blk, loc.clone());
        }
    }
    m
}

pub fn empty(volume: &str) -> Manifest {
    Manifest::new(volume, BS, VOLUME_SIZE)
}
