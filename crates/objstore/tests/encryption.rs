//! Encryption at rest (FORMAT.md, "Encryption"): sealed pack frames and encrypted manifests
//! round trip; tampering, a wrong key, a missing key and a frame moved to another block are
//! refused with clear errors; plaintext never appears in what is stored; GC needs no key.

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use futures::TryStreamExt;
use glidefs_objstore::format::pack::{decode_entry, decode_index_with_key_id, ENTRY_HEADER_LEN};
use glidefs_objstore::{
    BlockLocation, ErrorKind, FormatError, GcOptions, Manifest, ObjStoreError, PackBuilder, PackId,
    VolumeKey, SEAL_OVERHEAD,
};
use object_store::ObjectStoreExt;

fn key(seed: u8) -> Arc<VolumeKey> {
    Arc::new(VolumeKey::from_bytes([seed; 32]))
}

/// A recognisable, compressible block: `marker` repeated.
fn marked(marker: &[u8], len: usize) -> Vec<u8> {
    marker.iter().copied().cycle().take(len).collect()
}

const MARK: &[u8] = b"PLAINTEXT-MARKER-0123456789";

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fn frame_of(pack: &Bytes, loc: &BlockLocation) -> Bytes {
    pack.slice(loc.offset as usize..(loc.offset + u64::from(loc.len)) as usize)
}

/// Rewrites the frame's stored crc after a change (so the AEAD, not the crc, must catch it).
fn fix_crc(frame: &mut [u8]) {
    let crc = crc32c::crc32c(&frame[4..]);
    frame[..4].copy_from_slice(&crc.to_le_bytes());
}

fn sealed_pack(k: &Arc<VolumeKey>) -> (glidefs_objstore::EncodedPack, Vec<(u64, Vec<u8>)>) {
    let blocks = vec![
        (3u64, marked(MARK, BS as usize)),
        (7, glidefs_testkit::noise(7, BS as usize)),
        (
            9,
            marked(b"another marker, also compressible ", BS as usize),
        ),
    ];
    let mut b = PackBuilder::new(BS).unwrap().with_key(Some(k.clone()));
    for (i, d) in &blocks {
        b.add(*i, d).unwrap();
    }
    let predicted = b.encoded_bytes();
    let pack = b.finish(PackId::new("sealed").unwrap());
    assert_eq!(pack.bytes.len(), predicted);
    (pack, blocks)
}

#[test]
fn sealed_frames_round_trip_and_hide_the_plaintext() {
    let k = key(1);
    let (pack, blocks) = sealed_pack(&k);
    assert!(
        !contains(&pack.bytes, MARK),
        "the marker is not stored in clear"
    );
    let noise = &blocks[1].1;
    assert!(
        !contains(&pack.bytes, &noise[..64]),
        "nor are incompressible bytes"
    );
    for ((i, data), (b, loc)) in blocks.iter().zip(&pack.locations) {
        assert_eq!(i, b);
        let frame = frame_of(&pack.bytes, loc);
        assert_eq!(frame[5], 0x01, "the encrypted flag");
        let got = decode_entry(frame, *i, loc.raw_crc, Some(&k)).unwrap();
        assert_eq!(&got[..], &data[..], "block {i}");
    }
    // The raw block stored as is costs the seal's overhead only.
    let raw = &pack.locations[1].1;
    assert_eq!(
        raw.len as usize,
        ENTRY_HEADER_LEN + BS as usize + SEAL_OVERHEAD
    );
    let (block_size, id, index) = decode_index_with_key_id(&pack.bytes).unwrap();
    assert_eq!((block_size, id), (BS, Some(k.id())));
    assert!(index.iter().all(|r| r.encrypted && r.raw_crc == 0));
    // An unencrypted pack stays version 1 with no key id.
    let mut plain = PackBuilder::new(BS).unwrap();
    plain.add(0, &marked(MARK, BS as usize)).unwrap();
    let plain = plain.finish(PackId::new("plain").unwrap());
    let (_, id, index) = decode_index_with_key_id(&plain.bytes).unwrap();
    assert_eq!(id, None);
    assert!(!index[0].encrypted);
    let footer = &plain.bytes[plain.bytes.len() - 40..];
    assert_eq!(&footer[8..12], &1u32.to_le_bytes(), "version 1");
}

#[test]
fn tampering_wrong_or_missing_keys_and_moved_frames_are_refused() {
    let k = key(1);
    let (pack, _) = sealed_pack(&k);
    let (block, loc) = pack.locations[0].clone();
    let frame = frame_of(&pack.bytes, &loc);

    // A flipped ciphertext bit with the crc fixed: authentication fails.
    for at in [ENTRY_HEADER_LEN + 30, frame.len() - 1, ENTRY_HEADER_LEN] {
        let mut bent = frame.to_vec();
        bent[at] ^= 0x04;
        fix_crc(&mut bent);
        let err = decode_entry(Bytes::from(bent), block, loc.raw_crc, Some(&k)).unwrap_err();
        assert!(matches!(err, FormatError::Decrypt { .. }), "at {at}: {err}");
    }
    // Without fixing the crc, the crc catches it first (no key needed to tell transit damage).
    let mut bent = frame.to_vec();
    bent[ENTRY_HEADER_LEN + 30] ^= 0x04;
    assert!(matches!(
        decode_entry(Bytes::from(bent), block, loc.raw_crc, Some(&k)),
        Err(FormatError::Checksum { .. })
    ));
    // The wrong key.
    let other = key(2);
    let err = decode_entry(frame.clone(), block, loc.raw_crc, Some(&other)).unwrap_err();
    assert!(
        matches!(&err, FormatError::Decrypt { source, .. } if source.key_id == other.id()),
        "{err}"
    );
    // No key for a sealed frame, a key for a plain frame.
    let err = decode_entry(frame.clone(), block, loc.raw_crc, None).unwrap_err();
    assert!(err.to_string().contains("encrypted and no key"), "{err}");
    let mut plain = PackBuilder::new(BS).unwrap();
    plain.add(block, &marked(MARK, BS as usize)).unwrap();
    let plain = plain.finish(PackId::new("plain").unwrap());
    let ploc = &plain.locations[0].1;
    let err =
        decode_entry(frame_of(&plain.bytes, ploc), block, ploc.raw_crc, Some(&k)).unwrap_err();
    assert!(err.to_string().contains("not encrypted"), "{err}");

    // The frame moved to another block: the header says block 4 and its crc is right, but
    // the block index is bound to the seal.
    let mut moved = frame.to_vec();
    moved[8..16].copy_from_slice(&4u64.to_le_bytes());
    fix_crc(&mut moved);
    let err = decode_entry(Bytes::from(moved), 4, loc.raw_crc, Some(&k)).unwrap_err();
    assert!(matches!(err, FormatError::Decrypt { .. }), "{err}");
    // And the codec flipped (raw <-> zstd) likewise.
    let mut recoded = frame.to_vec();
    recoded[4] ^= 1;
    fix_crc(&mut recoded);
    assert!(decode_entry(Bytes::from(recoded), block, loc.raw_crc, Some(&k)).is_err());
}

/// Compaction copies sealed frames byte for byte into another pack at another offset: they
/// still open (the seal binds the block, not the pack or the offset). A plain builder refuses
/// sealed frames and a sealing builder plain ones.
#[test]
fn sealed_frames_copied_into_another_pack_still_open() {
    let k = key(1);
    let (pack, blocks) = sealed_pack(&k);
    let mut copy = PackBuilder::new(BS).unwrap().with_key(Some(k.clone()));
    copy.add(1, &marked(b"x", BS as usize)).unwrap(); // shifts every offset
    for (block, loc) in pack.locations.iter().rev() {
        copy.add_frame(*block, &frame_of(&pack.bytes, loc), loc.raw_crc)
            .unwrap();
    }
    let copy = copy.finish(PackId::new("copy").unwrap());
    for (block, loc) in copy.locations.iter().skip(1) {
        let want = &blocks.iter().find(|(b, _)| b == block).unwrap().1;
        let got = decode_entry(frame_of(&copy.bytes, loc), *block, loc.raw_crc, Some(&k)).unwrap();
        assert_eq!(&got[..], &want[..]);
        let original = pack.locations.iter().find(|(b, _)| b == block).unwrap();
        assert_ne!(original.1.offset, loc.offset, "it did move");
    }
    let (block, loc) = &pack.locations[0];
    let frame = frame_of(&pack.bytes, loc);
    let mut plain = PackBuilder::new(BS).unwrap();
    let err = plain.add_frame(*block, &frame, loc.raw_crc).unwrap_err();
    assert!(err.to_string().contains("flags"), "{err}");
}

fn sample_manifest(volume: &str) -> Manifest {
    let mut m = Manifest::new(volume, BS, 64 << 20).successor();
    for b in 0..5000u64 {
        m.insert(
            b * 3,
            BlockLocation {
                pack: PackId::new(format!("pack-{}", b % 4)).unwrap(),
                entry: b as u32,
                offset: b * 4096,
                len: 4000,
                raw_crc: 0x5eed_0000 ^ b as u32,
            },
        );
    }
    m
}

#[test]
fn encrypted_manifests_round_trip_and_name_both_key_ids_on_mismatch() {
    let k = key(1);
    let m = sample_manifest("v");
    let bytes = m.encode_with_key(Some(&k)).unwrap();
    assert_eq!(bytes, m.encode_with_key(Some(&k)).unwrap(), "deterministic");
    assert_eq!(bytes[13] & 0x02, 0x02, "encrypted flag");
    assert_eq!(Manifest::decode_with_key(&bytes, Some(&k)).unwrap(), m);
    // A block's raw crc, as stored in a plain manifest's records, is not in the clear.
    let plain = m.encode().unwrap();
    let crc = (0x5eed_0000u32 ^ 17).to_le_bytes();
    let raw_plain = zstd_free(&m, None);
    assert!(
        contains(&raw_plain, &crc),
        "sanity: the plain records hold it"
    );
    assert!(!contains(&zstd_free(&m, Some(&k)), &crc));
    assert_ne!(bytes, plain);

    let other = key(2);
    match Manifest::decode_with_key(&bytes, Some(&other)) {
        Err(FormatError::KeyMismatch { stored, given, .. }) => {
            assert_eq!((stored, given), (Some(k.id()), Some(other.id())));
        }
        other => panic!("{other:?}"),
    }
    let err = Manifest::decode(&bytes).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::KeyMismatch {
                stored: Some(_),
                given: None,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains(&k.id().to_string()), "{err}");
    let err = Manifest::decode_with_key(&plain, Some(&k)).unwrap_err();
    assert!(
        matches!(
            err,
            FormatError::KeyMismatch {
                stored: None,
                given: Some(_),
                ..
            }
        ),
        "{err}"
    );
    let v1 = m.encode_v1().unwrap();
    assert!(matches!(
        Manifest::decode_with_key(&v1, Some(&k)),
        Err(FormatError::KeyMismatch { stored: None, .. })
    ));
}

/// The manifest object followed by every zstd frame found in it, decoded: a value that is in
/// the clear but hidden by compression is still found.
fn zstd_free(m: &Manifest, key: Option<&VolumeKey>) -> Vec<u8> {
    let bytes = m.encode_with_key(key).unwrap();
    let mut out = bytes.to_vec();
    // Every zstd frame inside the object (magic 28 b5 2f fd), decoded.
    let magic = [0x28, 0xb5, 0x2f, 0xfd];
    for at in 0..bytes.len().saturating_sub(4) {
        if bytes[at..at + 4] == magic {
            use std::io::Read;
            let mut d = Vec::new();
            if let Ok(dec) = zstd::stream::read::Decoder::new(&bytes[at..]) {
                let _ = dec.single_frame().read_to_end(&mut d);
            }
            out.extend_from_slice(&d);
        }
    }
    out
}

#[test]
fn tampered_encrypted_manifests_are_refused() {
    let k = key(1);
    let bytes = sample_manifest("v")
        .encode_with_key(Some(&k))
        .unwrap()
        .to_vec();
    // Any flipped byte: a checksum or authentication error, never a manifest.
    for at in [40, 100, bytes.len() / 2, bytes.len() - 20] {
        let mut bent = bytes.clone();
        bent[at] ^= 0x01;
        assert!(
            Manifest::decode_with_key(&bent, Some(&k)).is_err(),
            "flip at {at}"
        );
    }
}

/// Store level: an encrypted volume publishes and loads with its key; another key, no key,
/// or a key for a plain volume is `KeyMismatch` (InvalidInput) naming both ids; blocks read
/// back; GC without the key keeps what is referenced and deletes what is not.
#[tokio::test]
async fn store_with_key_round_trips_and_gc_needs_no_key() {
    for backend in [memory(), local()] {
        let k = key(1);
        let vs = volume(&backend.store, "enc").with_key(Some(k.clone()));
        assert!(vs.load_manifest().await.unwrap().is_none());
        let mut b = PackBuilder::new(BS).unwrap().with_key(vs.key().cloned());
        b.add(1, &marked(MARK, BS as usize)).unwrap();
        let pack = b.finish(PackId::generate(1, 1));
        let mut junk = PackBuilder::new(BS).unwrap().with_key(Some(k.clone()));
        junk.add(2, &marked(MARK, BS as usize)).unwrap();
        let junk = junk.finish(PackId::generate(1, 2));
        vs.upload_packs(&[pack.clone(), junk.clone()])
            .await
            .unwrap();
        let mut m = next_manifest(&empty("enc"), &[&pack]);
        vs.publish_manifest(&mut m).await.unwrap();
        // Publishing again the identical manifest is recognised (deterministic encoding).
        let again = volume(&backend.store, "enc").with_key(Some(k.clone()));
        again.load_manifest().await.unwrap();
        let mut m2 = next_manifest(&m, &[]);
        again.publish_manifest(&mut m2).await.unwrap();
        let mut m2_resent = m2.clone();
        again.publish_manifest(&mut m2_resent).await.unwrap();

        let reader = volume(&backend.store, "enc").with_key(Some(k.clone()));
        let loaded = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(loaded, m2, "{}", backend.name);
        let got = reader.read_block(1, loaded.get(1).unwrap()).await.unwrap();
        assert_eq!(&got[..], &marked(MARK, BS as usize)[..]);

        // Nothing stored holds the marker in clear.
        let all: Vec<_> = backend.store.list(None).try_collect().await.unwrap();
        assert!(all.len() >= 4);
        for meta in &all {
            let bytes = backend
                .store
                .get(&meta.location)
                .await
                .unwrap()
                .bytes()
                .await
                .unwrap();
            assert!(!contains(&bytes, MARK), "{}", meta.location);
        }

        let other = key(2);
        for (given, expect) in [(Some(other.clone()), Some(other.id())), (None, None)] {
            let wrong = volume(&backend.store, "enc").with_key(given);
            let err = wrong.load_manifest().await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
            assert_eq!(err.key_mismatch(), Some((Some(k.id()), expect)), "{err}");
            assert!(err.to_string().contains(&k.id().to_string()), "{err}");
        }
        // A plain volume opened with a key.
        let plain = volume(&backend.store, "plain");
        let mut pb = PackBuilder::new(BS).unwrap();
        pb.add(0, &marked(MARK, BS as usize)).unwrap();
        let pp = pb.finish(PackId::generate(1, 1));
        plain.upload_pack(&pp).await.unwrap();
        let mut pm = next_manifest(&empty("plain"), &[&pp]);
        plain.publish_manifest(&mut pm).await.unwrap();
        let err = volume(&backend.store, "plain")
            .with_key(Some(k.clone()))
            .load_manifest()
            .await
            .unwrap_err();
        assert!(
            matches!(&err, ObjStoreError::KeyMismatch { .. })
                && err.key_mismatch() == Some((None, Some(k.id()))),
            "{err}"
        );

        // GC without the key: the referenced pack stays, the unreferenced one goes.
        let gc = volume(&backend.store, "enc");
        let report = gc
            .gc(GcOptions {
                grace: Duration::ZERO,
                keep_manifests: 1,
                now: Some(std::time::SystemTime::now() + Duration::from_secs(3600)),
                ..GcOptions::default()
            })
            .await
            .unwrap();
        assert_eq!(report.packs_referenced, 1, "{}: {report:?}", backend.name);
        assert_eq!(
            report.packs_deleted,
            vec![junk.id.clone()],
            "{}",
            backend.name
        );
        assert_eq!(
            report.manifests_retained,
            vec![1, 2],
            "gen 1 holds the segment"
        );
        let reader = volume(&backend.store, "enc").with_key(Some(k.clone()));
        let loaded = reader.load_manifest().await.unwrap().unwrap();
        reader.read_block(1, loaded.get(1).unwrap()).await.unwrap();
    }
}
