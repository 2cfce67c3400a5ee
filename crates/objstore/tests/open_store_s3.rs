//! `open_store("s3://bucket/prefix")` configured through `AWS_*` settings and an endpoint, as
//! glidefs passes them from its environment, against the in-process S3 server; and what its
//! PUTs carry on the wire (unsigned payload, checksum header), seen through a recording proxy.

mod common;

use std::sync::Arc;

use common::proxy::{header, put_heads, Proxy};
use common::*;
use glidefs_objstore::{open_store, S3Checksum, S3Options, UnsignedPayload, VolumeStore};
use glidefs_testkit::{noise, verify_block, S3Server};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};

#[tokio::test]
async fn s3_url_with_credentials_endpoint_and_prefix() {
    let server = S3Server::start().await.unwrap();
    let s3 = S3Options {
        endpoint: Some(server.endpoint.clone()),
        settings: server.aws_settings(),
        ..S3Options::default()
    };
    let store = open_store(&format!("s3://{}/tenant-a", server.bucket), &s3).unwrap();
    let vs = VolumeStore::new(store, "vol", fast_cfg()).unwrap();
    vs.load_manifest().await.unwrap();
    let pack = pattern_pack(&[1, 2], 1, 0);
    vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
    vs.publish_manifest(&mut next_manifest(&empty("vol"), &[&pack]))
        .await
        .unwrap();

    // The objects sit under the prefix inside the bucket directory of the server.
    let root = server
        .dir
        .path()
        .join(&server.bucket)
        .join("tenant-a/volumes/vol");
    assert!(root.join("manifest/00000000000000000001").is_file());
    assert!(root.join(format!("packs/{}.pack", pack.id)).is_file());

    let reader = VolumeStore::new(server.object_store().unwrap(), "vol", fast_cfg()).unwrap();
    assert!(
        reader.load_manifest().await.unwrap().is_none(),
        "unprefixed view of the bucket has no volume `vol`"
    );
    let again = open_store(&format!("s3://{}/tenant-a/", server.bucket), &s3).unwrap();
    let reader = VolumeStore::new(again, "vol", fast_cfg()).unwrap();
    let m = reader.load_manifest().await.unwrap().unwrap();
    for (blk, loc) in m.iter() {
        verify_block(blk, 1, &reader.read_block(blk, loc).await.unwrap()).unwrap();
    }
}

/// A fresh S3 server, a proxy in front of it, and a store that talks to it through the proxy
/// with these integrity choices.
async fn through_proxy(
    unsigned: UnsignedPayload,
    checksum: S3Checksum,
) -> (S3Server, Proxy, Arc<dyn ObjectStore>) {
    let server = S3Server::start().await.unwrap();
    let proxy = Proxy::start(server.addr()).await;
    let s3 = S3Options {
        endpoint: Some(proxy.endpoint.clone()),
        settings: server.aws_settings(),
        unsigned_payload: unsigned,
        checksum,
    };
    let store = open_store(&format!("s3://{}", server.bucket), &s3).unwrap();
    (server, proxy, store)
}

/// Given a plain-http endpoint and each unsigned-payload / checksum choice, when a volume's
/// pack and manifest and a raw object are written and read back, then the bytes match and
/// every PUT carried what the choice asks for (the server verified whatever it was sent:
/// the body's SHA-256 when signed, its CRC64NVME when that header is present).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsigned_payload_forced_over_http_round_trips_and_is_what_the_wire_carries() {
    for (unsigned, checksum, want_unsigned, want_crc) in [
        (UnsignedPayload::On, S3Checksum::Off, true, false),
        (UnsignedPayload::On, S3Checksum::Crc64nvme, true, true),
        (UnsignedPayload::Auto, S3Checksum::Auto, false, false),
    ] {
        let case = format!("{unsigned:?}/{checksum:?}");
        let (server, proxy, store) = through_proxy(unsigned, checksum).await;

        let vs = VolumeStore::new(store.clone(), "vol", fast_cfg()).unwrap();
        vs.load_manifest().await.unwrap();
        let pack = pattern_pack(&[0, 5, 9], 1, 0);
        vs.upload_packs(std::slice::from_ref(&pack)).await.unwrap();
        vs.publish_manifest(&mut next_manifest(&empty("vol"), &[&pack]))
            .await
            .unwrap();
        let raw = noise(7, (3 << 20) + 17);
        let path = Path::from("raw/object");
        store
            .put(&path, PutPayload::from(raw.clone()))
            .await
            .unwrap();

        // Read back through a client that never saw the proxy.
        let reader = VolumeStore::new(server.object_store().unwrap(), "vol", fast_cfg()).unwrap();
        let m = reader.load_manifest().await.unwrap().unwrap();
        assert_eq!(m.iter().count(), 3, "{case}");
        for (blk, loc) in m.iter() {
            verify_block(blk, 1, &reader.read_block(blk, loc).await.unwrap()).unwrap();
        }
        let got = server.object_store().unwrap().get(&path).await.unwrap();
        assert!(
            got.bytes().await.unwrap() == raw[..],
            "{case}: raw object bytes"
        );

        let heads = put_heads(&proxy.sent);
        assert!(
            heads.len() >= 3,
            "{case}: pack, manifest, raw PUTs seen: {heads:?}"
        );
        for head in &heads {
            let sha = header(head, "x-amz-content-sha256").unwrap_or_default();
            if want_unsigned {
                assert_eq!(sha, "unsigned-payload", "{case}: {head}");
            } else {
                assert!(
                    sha.len() == 64 && sha.bytes().all(|b| b.is_ascii_hexdigit()),
                    "{case}: a signed body's SHA-256: {head}"
                );
            }
            let crc = header(head, "x-amz-checksum-crc64nvme");
            assert_eq!(crc.is_some(), want_crc, "{case}: {head}");
        }
    }
}

/// Given pack PUTs whose bodies are damaged in transit (one byte flipped by a proxy) and each
/// integrity choice, then:
/// - signed (SHA-256 of the body) or unsigned with a CRC64NVME header: the server refuses each
///   damaged PUT (400 BadDigest, retried like any refused request): while every attempt is
///   damaged `upload_packs` fails, so nothing naming the pack is published; once one attempt
///   goes through clean the pack is stored and every block reads back intact;
/// - unsigned with no checksum: nothing can tell, the damaged pack is stored on the first try,
///   and a read of its blocks fails as `Corrupt` (frame CRCs) rather than returning wrong
///   bytes. This is why `auto` sends unsigned bodies only over TLS (or to AWS with a CRC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pack_body_damaged_in_transit_is_refused_or_caught_on_read() {
    use glidefs_objstore::ErrorKind;
    use std::sync::atomic::Ordering;
    for (unsigned, checksum, refused) in [
        (UnsignedPayload::Off, S3Checksum::Off, true),
        (UnsignedPayload::On, S3Checksum::Crc64nvme, true),
        (UnsignedPayload::On, S3Checksum::Off, false),
    ] {
        let case = format!("{unsigned:?}/{checksum:?}");
        let (server, proxy, store) = through_proxy(unsigned, checksum).await;
        let cfg = fast_cfg();
        let vs = VolumeStore::new(store, "vol", cfg.clone()).unwrap();
        vs.load_manifest().await.unwrap();
        let reader = VolumeStore::new(server.object_store().unwrap(), "vol", fast_cfg()).unwrap();
        let pack = pattern_pack(&[0, 5, 9], 1, 0);
        let pack_puts = || {
            put_heads(&proxy.sent)
                .iter()
                .filter(|h| h.contains(".pack "))
                .count()
        };
        if refused {
            // Every attempt damaged: the upload fails after all its retries.
            proxy.damage.store(usize::MAX, Ordering::Release);
            let e = vs
                .upload_packs(std::slice::from_ref(&pack))
                .await
                .expect_err(&format!("{case}: every damaged body must be refused"));
            let attempts = cfg.max_retries as usize + 1;
            assert_eq!(pack_puts(), attempts, "{case}: {e}");
            assert_eq!(proxy.damaged.load(Ordering::Acquire), attempts, "{case}");
            // A flush publishes nothing after a failed upload (and tries again later).
            assert!(reader.load_manifest().await.unwrap().is_none(), "{case}");
            proxy.damaged.store(0, Ordering::Release);
        }
        // One damaged attempt: refused and retried clean, or stored as is.
        let before = pack_puts();
        proxy.damage.store(1, Ordering::Release);
        vs.upload_packs(std::slice::from_ref(&pack))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(proxy.damaged.load(Ordering::Acquire), 1, "{case}");
        let want = if refused { 2 } else { 1 };
        assert_eq!(pack_puts() - before, want, "{case}: PUTs of the pack");
        vs.publish_manifest(&mut next_manifest(&empty("vol"), &[&pack]))
            .await
            .unwrap();
        let m = reader.load_manifest().await.unwrap().unwrap();
        let mut caught = 0;
        for (blk, loc) in m.iter() {
            match reader.read_block(blk, loc).await {
                Ok(bytes) => verify_block(blk, 1, &bytes).unwrap(),
                Err(e) => {
                    assert!(!refused, "{case}: block {blk}: {e}");
                    assert_eq!(e.kind(), ErrorKind::Corrupt, "{case}: block {blk}: {e}");
                    caught += 1;
                }
            }
        }
        assert_eq!(
            caught > 0,
            !refused,
            "{case}: damaged blocks caught on read"
        );
    }
}
