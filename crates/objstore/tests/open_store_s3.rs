//! `open_store("s3://bucket/prefix")` configured through `AWS_*` settings and an endpoint, as
//! glidefs passes them from its environment, against the in-process S3 server; and what its
//! PUTs carry on the wire (unsigned payload, checksum header), seen through a recording proxy.

mod common;

use std::sync::Arc;

use common::*;
use glidefs_objstore::{open_store, S3Checksum, S3Options, UnsignedPayload, VolumeStore};
use glidefs_testkit::{noise, verify_block, S3Server};
use object_store::path::Path;
use object_store::{ObjectStoreExt, PutPayload};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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

/// The bytes each client connection sent, in the order the connections were accepted.
type Sent = Arc<parking_lot::Mutex<Vec<Arc<parking_lot::Mutex<Vec<u8>>>>>>;

/// A TCP proxy in front of `upstream` (`host:port`) that keeps every byte clients send;
/// returns its `http://` endpoint.
async fn recording_proxy(upstream: std::net::SocketAddr) -> (String, Sent) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let sent: Sent = Arc::default();
    let conns = sent.clone();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let log = Arc::new(parking_lot::Mutex::new(Vec::new()));
            conns.lock().push(log.clone());
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    return;
                };
                let (mut c_read, mut c_write) = client.split();
                let (mut s_read, mut s_write) = tokio::io::split(server);
                let up = async {
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = c_read.read(&mut buf).await?;
                        if n == 0 {
                            return s_write.shutdown().await;
                        }
                        log.lock().extend_from_slice(&buf[..n]);
                        s_write.write_all(&buf[..n]).await?;
                    }
                };
                let down = tokio::io::copy(&mut s_read, &mut c_write);
                let _: (std::io::Result<()>, std::io::Result<u64>) = tokio::join!(up, down);
            });
        }
    });
    (endpoint, sent)
}

/// The request heads (lower-cased) of every PUT the proxy saw.
fn put_heads(sent: &Sent) -> Vec<String> {
    let mut heads = Vec::new();
    for conn in sent.lock().iter() {
        let bytes = conn.lock();
        let mut rest = &bytes[..];
        while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&rest[..end + 4]).to_ascii_lowercase();
            let body: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            rest = &rest[(end + 4 + body).min(rest.len())..];
            if head.starts_with("put ") {
                heads.push(head);
            }
        }
    }
    heads
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
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
        let server = S3Server::start().await.unwrap();
        let (endpoint, sent) = recording_proxy(server.addr()).await;
        let s3 = S3Options {
            endpoint: Some(endpoint),
            settings: server.aws_settings(),
            unsigned_payload: unsigned,
            checksum,
        };
        let store = open_store(&format!("s3://{}", server.bucket), &s3).unwrap();

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

        let heads = put_heads(&sent);
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
