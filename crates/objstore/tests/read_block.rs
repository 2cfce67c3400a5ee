//! Ranged block reads: exactly one entry is fetched and every byte is verified.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use glidefs_objstore::{ErrorKind, PackBuilder, PackId, VolumeStore};
use glidefs_testkit::{noise, verify_block, Fault, FaultRule, FaultyStore, Op};
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

async fn setup() -> (Arc<FaultyStore>, VolumeStore, glidefs_objstore::EncodedPack) {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let vs = VolumeStore::new(faulty.clone() as Arc<dyn ObjectStore>, "v", fast_cfg()).unwrap();
    let pack = pattern_pack(&[10, 11, 12, 13], 3, 0);
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    (faulty, vs, pack)
}

fn pack_path(pack: &glidefs_objstore::EncodedPack) -> Path {
    Path::from(format!("volumes/v/packs/{}.pack", pack.id))
}

#[tokio::test]
async fn read_fetches_only_the_entry_and_returns_the_block() {
    let (faulty, vs, pack) = setup().await;
    let before = faulty.counts();
    let (blk, loc) = &pack.locations[2];
    let data = vs.read_block(*blk, loc).await.unwrap();
    verify_block(*blk, 3, &data).unwrap();
    let after = faulty.counts();
    assert_eq!(after.calls(Op::Get) - before.calls(Op::Get), 1);
    assert_eq!(
        after.get_bytes - before.get_bytes,
        loc.len as u64,
        "one ranged GET"
    );
    assert!((loc.len as usize) < pack.bytes.len() / 2);
}

#[tokio::test]
async fn a_flipped_byte_in_the_stored_pack_is_corrupt() {
    let (faulty, vs, pack) = setup().await;
    let (blk, loc) = pack.locations[1].clone();
    // Flip one byte in each region of the entry: header, payload start, payload end.
    for at in [0u64, 5, 9, 17, 25, loc.len as u64 - 1] {
        let mut bytes = pack.bytes.to_vec();
        bytes[(loc.offset + at) as usize] ^= 0x20;
        faulty
            .inner()
            .put(&pack_path(&pack), PutPayload::from(Bytes::from(bytes)))
            .await
            .unwrap();
        let err = vs.read_block(blk, &loc).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Corrupt, "byte {at}: {err}");
        assert!(err.to_string().contains(pack.id.as_str()), "{err}");
    }
    // Other entries of the damaged pack are unaffected (last damage was in entry 1 only).
    let (blk0, loc0) = &pack.locations[0];
    verify_block(*blk0, 3, &vs.read_block(*blk0, loc0).await.unwrap()).unwrap();
}

#[tokio::test]
async fn a_bit_flipped_in_transit_is_refetched() {
    let (faulty, vs, pack) = setup().await;
    let (blk, loc) = &pack.locations[0];
    faulty.inject(
        FaultRule::new(Fault::FlipBit { byte: 40 })
            .ops(&[Op::Get])
            .times(1),
    );
    let data = vs.read_block(*blk, loc).await.unwrap();
    verify_block(*blk, 3, &data).unwrap();
    assert_eq!(faulty.counts().calls(Op::Get), 2);
    faulty.inject(
        FaultRule::new(Fault::FlipBit { byte: 40 })
            .ops(&[Op::Get])
            .times(2),
    );
    assert_eq!(
        vs.read_block(*blk, loc).await.unwrap_err().kind(),
        ErrorKind::Corrupt
    );
}

#[tokio::test]
async fn wrong_block_wrong_crc_and_bad_ranges_are_refused() {
    let (faulty, vs, pack) = setup().await;
    let (blk, loc) = pack.locations[0].clone();
    let err = vs.read_block(blk + 1, &loc).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Corrupt, "misdirected read: {err}");

    let mut bad_crc = loc.clone();
    bad_crc.raw_crc ^= 1;
    assert_eq!(
        vs.read_block(blk, &bad_crc).await.unwrap_err().kind(),
        ErrorKind::Corrupt
    );

    let mut shifted = loc.clone();
    shifted.offset += 1;
    assert_eq!(
        vs.read_block(blk, &shifted).await.unwrap_err().kind(),
        ErrorKind::Corrupt
    );

    let mut missing = loc.clone();
    missing.pack = PackId::new("nope").unwrap();
    assert_eq!(
        vs.read_block(blk, &missing).await.unwrap_err().kind(),
        ErrorKind::NotFound
    );

    // A transient GET failure is retried transparently.
    faulty.inject(FaultRule::new(Fault::Transient).ops(&[Op::Get]).times(2));
    verify_block(blk, 3, &vs.read_block(blk, &loc).await.unwrap()).unwrap();
}

#[tokio::test]
async fn incompressible_and_zero_blocks_round_trip_on_s3() {
    let backend = s3().await;
    let vs = volume(&backend.store, "v");
    let mut b = PackBuilder::new(BS).expect("zstd compressor");
    let noise = noise(0x1234_5678, BS as usize);
    b.add(0, &noise).unwrap();
    b.add(1, &vec![0u8; BS as usize]).unwrap();
    let pack = b.finish(PackId::generate(1, 0));
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    let got0 = vs.read_block(0, &pack.locations[0].1).await.unwrap();
    let got1 = vs.read_block(1, &pack.locations[1].1).await.unwrap();
    assert_eq!(&got0[..], &noise[..]);
    assert_eq!(&got1[..], &vec![0u8; BS as usize][..]);
}

#[tokio::test]
async fn a_run_of_back_to_back_frames_is_one_get() {
    let (faulty, vs, pack) = setup().await;
    let before = faulty.counts();
    let run = &pack.locations[1..4];
    let data = vs.read_run(run).await.unwrap();
    assert_eq!(data.len(), 3);
    for ((blk, _), d) in run.iter().zip(&data) {
        verify_block(*blk, 3, d).unwrap();
    }
    let after = faulty.counts();
    assert_eq!(after.calls(Op::Get) - before.calls(Op::Get), 1);
    let span: u64 = run.iter().map(|(_, l)| u64::from(l.len)).sum();
    assert_eq!(
        after.get_bytes - before.get_bytes,
        span,
        "exactly the run's frames"
    );
}

#[tokio::test]
async fn a_run_with_a_flipped_bit_refetches_only_that_block() {
    let (faulty, vs, pack) = setup().await;
    // Byte 40 of the span is inside the first frame: that block alone is read again.
    faulty.inject(
        FaultRule::new(Fault::FlipBit { byte: 40 })
            .ops(&[Op::Get])
            .times(1),
    );
    let data = vs.read_run(&pack.locations[0..3]).await.unwrap();
    for ((blk, _), d) in pack.locations[0..3].iter().zip(&data) {
        verify_block(*blk, 3, d).unwrap();
    }
    assert_eq!(faulty.counts().calls(Op::Get), 2);
}

#[tokio::test]
async fn a_run_that_is_not_back_to_back_is_refused() {
    let (faulty, vs, pack) = setup().await;
    let gappy = vec![pack.locations[0].clone(), pack.locations[2].clone()];
    let err = vs.read_run(&gappy).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert!(err.to_string().contains("does not follow"), "{err}");
    assert_eq!(faulty.counts().calls(Op::Get), 0);
}
