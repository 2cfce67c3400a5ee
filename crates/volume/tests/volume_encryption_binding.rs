//! Encryption at rest binds data to its block and its key: sealed frames moved to another
//! block, replayed from an older version of the same block, opened with another key, without
//! a key, or given as plain frames to a keyed reader are refused (never garbage); equal
//! blocks get distinct nonces; an encrypted pack's index records no plaintext crc; a cache
//! written under a key refuses to reopen with another key or none, even before anything of
//! it was published; an encrypted volume that grows (and loses a publish reply around the
//! grow, and compacts) leaks no plaintext and reads back on a fresh host; keyless GC of a
//! grown encrypted volume keeps every object it needs.

mod common;

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use glidefs_objstore::format::pack::{decode_entry, decode_index};
use glidefs_objstore::{BlockLocation, PackBuilder, PackId};
use glidefs_testkit::FaultyStore;
use glidefs_volume::{CompactOptions, Volume, VolumeConfig, VolumeKey};
use object_store::local::LocalFileSystem;
use object_store::ObjectStore;

const MARK: &[u8] = b"<<secret plaintext marker 77>>";

fn key(seed: u8) -> Arc<VolumeKey> {
    Arc::new(VolumeKey::from_bytes([seed; 32]))
}

fn frame(pack: &Bytes, loc: &BlockLocation) -> Bytes {
    pack.slice(loc.offset as usize..(loc.offset + u64::from(loc.len)) as usize)
}

fn loc_of(locs: &[(u64, BlockLocation)], block: u64) -> BlockLocation {
    locs.iter().find(|(b, _)| *b == block).unwrap().1.clone()
}

/// Rewrites the block index in a frame's header and fixes its stored crc (what an attacker
/// with write access to the bucket can do without the key).
fn retarget(frame: &[u8], block: u64) -> Bytes {
    let mut f = frame.to_vec();
    f[8..16].copy_from_slice(&block.to_le_bytes());
    let crc = crc32c_sw(&f[4..]);
    f[0..4].copy_from_slice(&crc.to_le_bytes());
    Bytes::from(f)
}

/// CRC-32C (Castagnoli), bitwise (the tests have no crc crate).
fn crc32c_sw(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A sealed frame is bound to its block; a frame moved to another block (header rewritten, crc
/// fixed), an older frame of the same block put where the manifest names a newer one, a frame
/// sealed with another key, a sealed frame read without a key and a plain frame read with a key are
/// all errors, never data.
#[test]
fn moved_replayed_and_foreign_frames_are_refused() {
    const BSZ: u32 = 4096;
    let k = key(1);
    let a_old = glidefs_testkit::noise(1, BSZ as usize);
    let a_new = glidefs_testkit::noise(3, BSZ as usize);
    let b = glidefs_testkit::noise(5, BSZ as usize);
    let build = |key: Option<Arc<VolumeKey>>, blocks: &[(u64, &[u8])], id: &str| {
        let mut pb = PackBuilder::new(BSZ).unwrap().with_key(key);
        for (blk, d) in blocks {
            pb.add(*blk, d).unwrap();
        }
        pb.finish(PackId::new(id).unwrap())
    };
    let p1 = build(Some(k.clone()), &[(1, &a_old), (2, &b)], "p-1");
    let p2 = build(Some(k.clone()), &[(1, &a_new)], "p-2");
    let l1_old = loc_of(&p1.locations, 1);
    let l2 = loc_of(&p1.locations, 2);
    let l1_new = loc_of(&p2.locations, 1);
    // Sanity: each frame opens where it belongs.
    assert_eq!(
        &decode_entry(frame(&p1.bytes, &l1_old), 1, l1_old.raw_crc, Some(&k)).unwrap()[..],
        &a_old[..]
    );
    assert_eq!(
        &decode_entry(frame(&p2.bytes, &l1_new), 1, l1_new.raw_crc, Some(&k)).unwrap()[..],
        &a_new[..]
    );
    // Block 2's frame moved to block 1 (header rewritten, crc fixed): the tag refuses it.
    let moved = retarget(&frame(&p1.bytes, &l2), 1);
    assert!(decode_entry(moved.clone(), 1, l2.raw_crc, Some(&k)).is_err());
    assert!(decode_entry(moved, 1, l1_new.raw_crc, Some(&k)).is_err());
    // The old version of block 1 (same length: incompressible) where the manifest names the
    // new one: the manifest's raw crc refuses it.
    assert_eq!(l1_old.len, l1_new.len);
    assert!(decode_entry(frame(&p1.bytes, &l1_old), 1, l1_new.raw_crc, Some(&k)).is_err());
    // Another key, no key, a plain frame with a key.
    let other = key(2);
    assert!(decode_entry(frame(&p2.bytes, &l1_new), 1, l1_new.raw_crc, Some(&other)).is_err());
    assert!(decode_entry(frame(&p2.bytes, &l1_new), 1, l1_new.raw_crc, None).is_err());
    let plain = build(None, &[(1, &a_new)], "p-3");
    let lp = loc_of(&plain.locations, 1);
    assert!(decode_entry(frame(&plain.bytes, &lp), 1, lp.raw_crc, Some(&k)).is_err());
    // A plain frame relabelled as sealed (flags byte set, crc fixed): refused with the key.
    let mut relabel = frame(&plain.bytes, &lp).to_vec();
    relabel[5] = 0x01;
    let crc = crc32c_sw(&relabel[4..]);
    relabel[0..4].copy_from_slice(&crc.to_le_bytes());
    assert!(decode_entry(Bytes::from(relabel), 1, lp.raw_crc, Some(&k)).is_err());
    // The encrypted pack's index records no crc of the plaintext, and the plaintext of an
    // incompressible block appears nowhere in the pack.
    let (_, index) = decode_index(&p1.bytes).unwrap();
    assert!(index.iter().all(|r| r.raw_crc == 0), "{index:?}");
    for (d, crc) in [(&a_old, l1_old.raw_crc), (&b, l2.raw_crc)] {
        assert!(!p1.bytes.windows(64).any(|w| w == &d[100..164]));
        assert!(!p1.bytes.windows(4).any(|w| w == crc.to_le_bytes()));
    }
}

/// Two seals of the same block with the same content never reuse a nonce (pack frames draw random
/// nonces), so equal blocks do not give equal ciphertexts.
#[test]
fn equal_blocks_get_distinct_nonces() {
    let k = key(4);
    let d = vec![7u8; 4096];
    let mut pb = PackBuilder::new(4096).unwrap().with_key(Some(k.clone()));
    pb.add(1, &d).unwrap();
    pb.add(2, &d).unwrap();
    let p = pb.finish(PackId::new("p-1").unwrap());
    let mut pb = PackBuilder::new(4096).unwrap().with_key(Some(k));
    pb.add(1, &d).unwrap();
    let q = pb.finish(PackId::new("p-2").unwrap());
    let f1 = frame(&p.bytes, &loc_of(&p.locations, 1));
    let f2 = frame(&p.bytes, &loc_of(&p.locations, 2));
    let g1 = frame(&q.bytes, &loc_of(&q.locations, 1));
    let nonce = |f: &Bytes| f[20..44].to_vec();
    assert_ne!(nonce(&f1), nonce(&f2));
    assert_ne!(nonce(&f1), nonce(&g1));
    assert_ne!(f1[44..], g1[44..]);
}

fn local(dir: &Path) -> Arc<dyn ObjectStore> {
    Arc::new(LocalFileSystem::new_with_prefix(dir).unwrap())
}

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

fn block_with_mark(seed: u64) -> Vec<u8> {
    let mut d: Vec<u8> = MARK.iter().copied().cycle().take(BS as usize / 2).collect();
    d.extend_from_slice(&glidefs_testkit::noise(2 * seed + 1, BS as usize / 2));
    d
}

fn keyed(dir: &Path, k: Option<Arc<VolumeKey>>, size: u64) -> VolumeConfig {
    let mut c = config(dir);
    c.size = size;
    c.encryption_key = k;
    c
}

/// An encrypted volume that grows (with a publish reply lost just before the grow, and a crash
/// before the re-send), writes past the old end, flushes and compacts stores no plaintext in any
/// object, and reads back on a fresh host with its key only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encrypted_volume_grown_across_a_lost_reply_leaks_nothing() {
    const NEW: u64 = 3 * SIZE;
    let bucket = tempfile::tempdir().unwrap();
    let inner = local(bucket.path());
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let k = key(9);
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(keyed(dir.path(), Some(k.clone()), SIZE), store.clone())
        .await
        .unwrap();
    let mut want: Vec<(u64, Vec<u8>)> = Vec::new();
    for b in 0..BLOCKS {
        let d = block_with_mark(b);
        v.write(b * BS as u64, &d).await.unwrap();
        want.push((b * BS as u64, d));
    }
    lose_next_manifest_reply(&faulty);
    assert!(v.sync_to_store().await.is_err());
    faulty.clear_faults();
    v.resize(NEW).await.unwrap();
    for b in BLOCKS..3 * BLOCKS {
        let d = block_with_mark(1000 + b);
        v.write(b * BS as u64, &d).await.unwrap();
        want.push((b * BS as u64, d));
    }
    v.flush().await.unwrap();
    v.kill().await;
    drop(v);
    let v = Volume::open(keyed(dir.path(), Some(k.clone()), NEW), store.clone())
        .await
        .unwrap();
    v.sync_to_store().await.unwrap();
    // Overwrite half (first packs half dead), flush, compact.
    for b in (0..3 * BLOCKS).step_by(2) {
        let d = block_with_mark(5000 + b);
        v.write(b * BS as u64, &d).await.unwrap();
        want.retain(|(o, _)| *o != b * BS as u64);
        want.push((b * BS as u64, d));
    }
    v.sync_to_store().await.unwrap();
    let report = v
        .compact(CompactOptions {
            threshold: 0.9,
            max_bytes: 256 << 20,
        })
        .await
        .unwrap();
    assert!(report.blocks_moved > 0, "{report:?}");
    v.close().await.unwrap();
    for (path, bytes) in objects(bucket.path()) {
        assert!(
            !bytes.windows(12).any(|w| w == &MARK[..12]),
            "marker in clear in {path}"
        );
        for (off, d) in &want {
            assert!(
                !bytes.windows(48).any(|w| w == &d[d.len() - 48..]),
                "tail of offset {off} in clear in {path}"
            );
        }
    }
    let fresh = tempfile::tempdir().unwrap();
    let back = Volume::open(keyed(fresh.path(), Some(k.clone()), NEW), inner.clone())
        .await
        .unwrap();
    for (off, d) in &want {
        let mut buf = vec![0u8; d.len()];
        back.read(*off, &mut buf).await.unwrap();
        assert_eq!(&buf, d, "fresh host, offset {off}");
    }
    back.close().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    assert!(
        Volume::open(keyed(fresh.path(), Some(key(10)), NEW), inner.clone())
            .await
            .is_err()
    );
    let fresh = tempfile::tempdir().unwrap();
    assert!(Volume::open(keyed(fresh.path(), None, NEW), inner)
        .await
        .is_err());
}

/// A volume without an owner id whose writes are only in its local cache (nothing published
/// yet, so the store records no key id) refuses to reopen with ANOTHER key: the cache
/// directory records the key id (the cache's `key-id` record, `key_id.rs`). Were it to open,
/// the acknowledged writes would be sealed under the wrong key at the next flush and the
/// volume's real key refused from then on (the data readable only by whoever holds the
/// wrong key); the test publishes and reports that if the open succeeds.
///
/// (With an owner id, as the daemon's writable volumes have, the first open publishes a claim
/// sealed with the key, so the second open is refused: the next test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_unpublished_cache_with_another_key_is_refused() {
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let (k1, k2) = (key(21), key(22));
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(keyed(dir.path(), Some(k1.clone()), SIZE), store.clone())
        .await
        .unwrap();
    let d = block_with_mark(1);
    v.write(0, &d).await.unwrap();
    v.flush().await.unwrap(); // acknowledged (local durability)
    v.kill().await;
    drop(v);
    let wrong = Volume::open(keyed(dir.path(), Some(k2.clone()), SIZE), store.clone()).await;
    let Ok(wrong) = wrong else {
        return; // refused
    };
    // Not refused: show the consequence, then fail.
    wrong.sync_to_store().await.unwrap();
    wrong.close().await.unwrap();
    let fresh = tempfile::tempdir().unwrap();
    let right = Volume::open(keyed(fresh.path(), Some(k1.clone()), SIZE), store.clone()).await;
    panic!(
        "the cache written under key {} reopened with key {} without an error; its data was \
         published under the wrong key, and the volume's own key now gets: {:?}",
        k1.id(),
        k2.id(),
        right.err().map(|e| e.to_string())
    );
}

/// With an owner id (the daemon's writable volumes) the first open publishes a claim sealed with
/// the key, so reopening the cache with another key is refused (KeyMismatch naming both ids) before
/// any write is sealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_owned_volume_refuses_another_key_before_its_first_flush() {
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let (k1, k2) = (key(23), key(24));
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = keyed(dir.path(), Some(k1.clone()), SIZE);
    cfg.owner = Some("host-a".into());
    let v = Volume::open(cfg.clone(), store.clone()).await.unwrap();
    let d = block_with_mark(2);
    v.write(0, &d).await.unwrap();
    v.flush().await.unwrap();
    v.kill().await;
    drop(v);
    let mut wrong = cfg.clone();
    wrong.encryption_key = Some(k2.clone());
    let err = Volume::open(wrong, store.clone()).await.unwrap_err();
    assert_eq!(
        err.key_mismatch(),
        Some((Some(k1.id()), Some(k2.id()))),
        "{err}"
    );
    let v = Volume::open(cfg, store.clone()).await.unwrap();
    let mut buf = vec![0u8; d.len()];
    v.read(0, &mut buf).await.unwrap();
    assert_eq!(buf, d);
    v.close().await.unwrap();
}

/// The plaintext variant of `reopening_unpublished_cache_with_another_key_is_refused`: a
/// volume without an owner id written under a key, whose writes are only in its local cache,
/// refuses to reopen WITHOUT a key (the cache's `key-id` record); were it to open, its next
/// flush would upload the acknowledged blocks to the store in clear (the test flushes and
/// reports which objects hold plaintext).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reopening_an_unpublished_encrypted_cache_without_its_key_is_refused() {
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let k = key(25);
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(keyed(dir.path(), Some(k.clone()), SIZE), store.clone())
        .await
        .unwrap();
    let d = block_with_mark(3);
    v.write(0, &d).await.unwrap();
    v.flush().await.unwrap();
    v.kill().await;
    drop(v);
    let keyless = Volume::open(keyed(dir.path(), None, SIZE), store.clone()).await;
    let Ok(keyless) = keyless else {
        return; // refused
    };
    keyless.sync_to_store().await.unwrap();
    keyless.close().await.unwrap();
    let leaked: Vec<String> = objects(bucket.path())
        .into_iter()
        .filter(|(_, bytes)| bytes.windows(12).any(|w| w == &MARK[..12]))
        .map(|(p, _)| p)
        .collect();
    panic!(
        "a cache written under key {} reopened without a key; after its flush the plaintext \
         marker is in: {leaked:?}",
        k.id()
    );
}

/// Keyless GC of an encrypted volume whose manifest segments live in several older manifest objects
/// (copy on write), across a grow that adds segments, keeps every object a live segment or block
/// needs: a fresh host reads everything back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_gc_keeps_segments_of_a_grown_encrypted_volume() {
    const SEG: u64 = 4096; // glidefs_objstore::SEGMENT_BLOCKS
    let small = 2 * SEG * BS as u64;
    let big = 5 * SEG * BS as u64;
    let bucket = tempfile::tempdir().unwrap();
    let store = local(bucket.path());
    let k = key(31);
    let dir = tempfile::tempdir().unwrap();
    let v = Volume::open(keyed(dir.path(), Some(k.clone()), small), store.clone())
        .await
        .unwrap();
    let mut want: Vec<(u64, Vec<u8>)> = Vec::new();
    let put = |b: u64, seed: u64, want: &mut Vec<(u64, Vec<u8>)>| {
        let d = block_with_mark(seed);
        want.retain(|(o, _)| *o != b * BS as u64);
        want.push((b * BS as u64, d.clone()));
        (b * BS as u64, d)
    };
    for (b, seed) in [(3, 1), (SEG + 5, 2), (2 * SEG - 1, 3)] {
        let (o, d) = put(b, seed, &mut want);
        v.write(o, &d).await.unwrap();
    }
    v.sync_to_store().await.unwrap();
    let (o, d) = put(4, 4, &mut want); // segment 0 only
    v.write(o, &d).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.resize(big).await.unwrap();
    for (b, seed) in [(3 * SEG + 7, 5), (5 * SEG - 1, 6)] {
        let (o, d) = put(b, seed, &mut want);
        v.write(o, &d).await.unwrap();
    }
    v.sync_to_store().await.unwrap();
    let (o, d) = put(SEG + 6, 7, &mut want); // segment 1 only
    v.write(o, &d).await.unwrap();
    v.sync_to_store().await.unwrap();
    v.close().await.unwrap();
    let gc = gc_hard(&store).await;
    let fresh = tempfile::tempdir().unwrap();
    let back = Volume::open(keyed(fresh.path(), Some(k.clone()), big), store.clone())
        .await
        .unwrap();
    for (off, d) in &want {
        let mut buf = vec![0u8; d.len()];
        back.read(*off, &mut buf).await.unwrap();
        assert_eq!(&buf, d, "fresh host after keyless GC {gc:?}, offset {off}");
    }
    back.close().await.unwrap();
}
