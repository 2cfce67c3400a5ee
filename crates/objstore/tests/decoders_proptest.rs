//! Decoders never panic on arbitrary bytes and reject every damaged encoding.
//! Case count: PROPTEST_CASES (proptest's default, 256, when unset).

use bytes::Bytes;
use glidefs_objstore::format::pack::{decode_entry, decode_footer, decode_index, FOOTER_LEN};
use std::sync::Arc;

use glidefs_objstore::{
    BlockLocation, Manifest, ManifestOwner, PackBuilder, PackId, VolumeKey, SEGMENT_BLOCKS,
};
use proptest::prelude::*;

fn manifest_strategy() -> impl Strategy<Value = Manifest> {
    (
        1u64..1000,
        proptest::collection::btree_map(
            // Up to four segments of the map.
            0u64..4 * SEGMENT_BLOCKS,
            (
                0usize..4,
                any::<u32>(),
                any::<u64>(),
                20u32..100_000,
                any::<u32>(),
            ),
            0..200,
        ),
        // An owner record (format 2 only): id, claimed_at as a fraction of the generation,
        // released.
        proptest::option::of(("[!-~]{1,40}", any::<u64>(), any::<bool>())),
    )
        .prop_map(|(generation, blocks, owner)| {
            let mut m = Manifest::new("vol", 4096, 4096 * 4 * SEGMENT_BLOCKS);
            m.generation = generation;
            m.owner = owner.map(|(id, at, released)| ManifestOwner {
                id,
                claimed_at: 1 + at % generation,
                released,
            });
            for (blk, (pack, entry, offset, len, raw_crc)) in blocks {
                m.insert(
                    blk,
                    BlockLocation {
                        pack: PackId(format!("pack-{pack}").into()),
                        entry,
                        offset,
                        len,
                        raw_crc,
                    },
                );
            }
            m
        })
}

fn pack_strategy() -> impl Strategy<Value = (Vec<(u64, Vec<u8>)>, bool)> {
    (
        proptest::collection::btree_map(
            0u64..10_000,
            // Mix of compressible runs and arbitrary bytes.
            prop_oneof![
                (any::<u8>()).prop_map(|b| vec![b; 512]),
                proptest::collection::vec(any::<u8>(), 512),
            ],
            1..6,
        )
        .prop_map(|m| m.into_iter().collect::<Vec<_>>()),
        any::<bool>(),
    )
}

fn key() -> Arc<VolumeKey> {
    Arc::new(VolumeKey::from_bytes([0x17; 32]))
}

fn build(
    blocks: &[(u64, Vec<u8>)],
    compress: bool,
    key: Option<Arc<VolumeKey>>,
) -> glidefs_objstore::EncodedPack {
    let mut b = PackBuilder::with_level(512, compress.then_some(1))
        .expect("zstd compressor")
        .with_key(key);
    for (blk, data) in blocks {
        b.add(*blk, data).unwrap();
    }
    b.finish(PackId::new("p").unwrap())
}

proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048), block in any::<u64>(), crc in any::<u32>()) {
        let _ = Manifest::decode(&bytes);
        let _ = decode_index(&bytes);
        let _ = decode_footer(&bytes);
        let _ = decode_entry(Bytes::from(bytes.clone()), block, crc, None);
        let k = key();
        let _ = Manifest::decode_with_key(&bytes, Some(&k));
        let _ = decode_entry(Bytes::from(bytes.clone()), block, crc, Some(&k));
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_magic_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512), version in 1u32..3) {
        let mut bytes = b"GLIDMNFT".to_vec();
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&tail);
        prop_assert!(Manifest::decode(&bytes).is_err());
        let mut footer = tail.clone();
        footer.extend_from_slice(b"GLIDPACK");
        footer.extend_from_slice(&tail);
        let _ = decode_index(&footer);
    }

    #[test]
    fn manifests_round_trip_and_any_damage_is_detected(m in manifest_strategy(), cut in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        // Format 2 (written) and format 1 (still read; it has no owner record).
        // And format 2 encrypted.
        let k = key();
        let mut formats = vec![(m.encode().unwrap(), None)];
        if m.owner.is_none() {
            formats.push((m.encode_v1().unwrap(), None));
        }
        formats.push((m.encode_with_key(Some(&k)).unwrap(), Some(&*k)));
        for (bytes, key) in formats {
            prop_assert_eq!(&Manifest::decode_with_key(&bytes, key).unwrap(), &m);
            let cut = cut.index(bytes.len());
            prop_assert!(Manifest::decode_with_key(&bytes[..cut], key).is_err());
            let mut damaged = bytes.to_vec();
            damaged[flip.index(bytes.len())] ^= 1 << bit;
            prop_assert!(Manifest::decode_with_key(&damaged, key).is_err());
        }
    }

    #[test]
    fn pack_entries_round_trip_and_any_damage_is_detected((blocks, compress) in pack_strategy(), sealed in any::<bool>(), pick in any::<prop::sample::Index>(), flip in any::<prop::sample::Index>(), bit in 0u8..8) {
        let k = sealed.then(key);
        let pack = build(&blocks, compress, k.clone());
        let k = k.as_deref();
        let i = pick.index(blocks.len());
        let (blk, loc) = &pack.locations[i];
        let range = loc.offset as usize..(loc.offset + loc.len as u64) as usize;
        let frame = pack.bytes.slice(range.clone());
        prop_assert_eq!(&decode_entry(frame.clone(), *blk, loc.raw_crc, k).unwrap()[..], &blocks[i].1[..]);

        let mut damaged = frame.to_vec();
        damaged[flip.index(frame.len())] ^= 1 << bit;
        prop_assert!(decode_entry(Bytes::from(damaged), *blk, loc.raw_crc, k).is_err());
        prop_assert!(decode_entry(frame.slice(..frame.len() - 1), *blk, loc.raw_crc, k).is_err());

        let (_, index) = decode_index(&pack.bytes).unwrap();
        prop_assert_eq!(index.len(), blocks.len());
        // Damage in the index or footer is detected too.
        let index_start = index.iter().map(|r| r.offset + r.len as u64).max().unwrap() as usize;
        let tail_len = pack.bytes.len() - index_start;
        let mut damaged = pack.bytes.to_vec();
        damaged[index_start + flip.index(tail_len)] ^= 1 << bit;
        prop_assert!(decode_index(&damaged).is_err());
        prop_assert!(decode_footer(&pack.bytes[pack.bytes.len() - FOOTER_LEN..]).is_ok());
    }
}
