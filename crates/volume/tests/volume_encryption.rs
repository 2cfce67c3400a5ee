//! Encryption at rest, end to end through the volume: a known plaintext written, flushed and
//! compacted never appears in any object of a `file://`-style store; the volume reads back
//! on a fresh host with the right key; a wrong key, no key, or a key for an unencrypted
//! volume is refused at open with both key ids.

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use glidefs_volume::{CompactOptions, Volume, VolumeConfig, VolumeErrorKind, VolumeKey};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

/// A marker that every written block carries, in clear and compressible.
const MARK: &[u8] = b"<<glidefs secret plaintext marker 42>>";

fn key(seed: u8) -> Arc<VolumeKey> {
    Arc::new(VolumeKey::from_bytes([seed; 32]))
}

fn keyed(dir: &Path, key: Option<Arc<VolumeKey>>) -> VolumeConfig {
    let mut c = config(dir);
    c.encryption_key = key;
    c
}

/// Page content: the marker repeated, then the page number and seed (so pages differ), then
/// an incompressible tail that must not appear either.
fn page(seed: u64, p: usize) -> Vec<u8> {
    let mut d: Vec<u8> = MARK.iter().copied().cycle().take(PAGE / 2).collect();
    d[..16].copy_from_slice(&[(seed as u8) ^ 0x5a; 16]);
    d[16..24].copy_from_slice(&(p as u64).to_le_bytes());
    d.extend_from_slice(&page_data(seed, p)[..PAGE / 2]);
    d
}

async fn write_pattern(
    v: &Volume,
    oracle: &mut Oracle,
    seed: u64,
    pages: impl Iterator<Item = usize>,
) {
    for p in pages {
        let d = page(seed, p);
        v.write((p * PAGE) as u64, &d).await.unwrap();
        oracle.write(p, d);
    }
}

fn local(dir: &Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
}

/// Every file under `dir` (the store's objects), read whole.
fn objects(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else {
                out.push((path.display().to_string(), std::fs::read(&path).unwrap()));
            }
        }
    }
    out
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Asserts that no object holds the marker, or a piece of any page's incompressible tail.
fn assert_no_plaintext(dir: &Path, oracle: &Oracle, ctx: &str) -> usize {
    let objs = objects(dir);
    assert!(
        objs.iter().any(|(p, _)| p.ends_with(".pack")),
        "{ctx}: packs were written"
    );
    for (path, bytes) in &objs {
        assert!(!contains(bytes, MARK), "{ctx}: marker in clear in {path}");
        assert!(
            !contains(bytes, &MARK[..12]),
            "{ctx}: marker prefix in {path}"
        );
        for (p, data) in oracle.cur.iter().enumerate().step_by(3) {
            assert!(
                !contains(bytes, &data[PAGE - 48..]),
                "{ctx}: page {p}'s tail in clear in {path}"
            );
        }
    }
    objs.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_volume_hides_plaintext_reads_back_and_refuses_other_keys() {
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let k = key(1);
    let mut oracle = Oracle::new();

    // Write every page, flush to the store, overwrite half of the blocks and flush again (so
    // the first packs are half dead, for compaction below).
    let cache = tempfile::tempdir().unwrap();
    let v = Volume::open(keyed(cache.path(), Some(k.clone())), store.clone())
        .await
        .unwrap();
    write_pattern(&v, &mut oracle, 1, 0..PAGES).await;
    v.sync_to_store().await.unwrap();
    let half = (0..PAGES).filter(|p| (p / PPB).is_multiple_of(2));
    write_pattern(&v, &mut oracle, 2, half).await;
    v.sync_to_store().await.unwrap();
    oracle.assert_pages(0, &read_all(&v).await, "writer");
    let n = assert_no_plaintext(bucket.path(), &oracle, "after flush");
    assert!(n >= 4, "{n} objects");

    // Compaction copies sealed frames into new packs: still no plaintext, still readable.
    let report = v
        .compact(CompactOptions {
            threshold: 0.9,
            max_bytes: 256 << 20,
        })
        .await
        .unwrap();
    assert!(report.blocks_moved > 0, "{report:?}");
    assert!(report.publishes > 0, "{report:?}");
    v.close().await.unwrap();
    assert_no_plaintext(bucket.path(), &oracle, "after compaction");

    // GC runs without the key (as the daemon's GC of every volume does) and keeps what the
    // encrypted manifests reference.
    let gc = gc_hard(&store).await;
    assert!(
        !gc.packs_deleted.is_empty(),
        "the compacted packs go: {gc:?}"
    );

    // A fresh host with the right key reads back every byte (cold reads through the seal).
    let fresh = tempfile::tempdir().unwrap();
    let back = Volume::open(keyed(fresh.path(), Some(k.clone())), store.clone())
        .await
        .unwrap();
    oracle.assert_pages(0, &read_all(&back).await, "fresh host, right key");
    assert!(back.stats().await.blocks_fetched >= BLOCKS);
    back.close().await.unwrap();

    // Another key, or no key: refused at open with both key ids, before any read.
    let other = key(2);
    for (given, expect) in [(Some(other.clone()), Some(other.id())), (None, None)] {
        let dir = tempfile::tempdir().unwrap();
        let err = Volume::open(keyed(dir.path(), given), store.clone())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), VolumeErrorKind::InvalidInput, "{err}");
        assert_eq!(err.key_mismatch(), Some((Some(k.id()), expect)), "{err}");
        let msg = format!(
            "{err}: {}",
            std::error::Error::source(&err)
                .map(|s| s.to_string())
                .unwrap_or_default()
        );
        assert!(msg.contains(&k.id().to_string()), "{msg}");
    }
}

/// An unencrypted volume stays readable without a key, and refuses a key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_for_an_unencrypted_volume_is_refused() {
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let mut oracle = Oracle::new();
    let cache = tempfile::tempdir().unwrap();
    let v = open(cache.path(), store.clone()).await;
    write_pattern(&v, &mut oracle, 3, 0..8).await;
    v.sync_to_store().await.unwrap();
    v.close().await.unwrap();
    let plain = objects(bucket.path());
    let tail = &oracle.cur[5][PAGE - 48..];
    assert!(
        plain.iter().any(|(_, b)| contains(b, tail)),
        "sanity: an unencrypted volume stores page data in clear (the scan finds it)"
    );
    let k = key(7);
    let dir = tempfile::tempdir().unwrap();
    let err = Volume::open(keyed(dir.path(), Some(k.clone())), store.clone())
        .await
        .unwrap_err();
    assert_eq!(err.key_mismatch(), Some((None, Some(k.id()))), "{err}");
    check_fresh_host(&store, &oracle, "unencrypted, no key").await;
}
