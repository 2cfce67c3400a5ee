//! `open_store("s3://bucket/prefix")` configured through `AWS_*` settings and an endpoint, as
//! glidefs passes them from its environment, against the in-process S3 server.

mod common;

use common::*;
use glidefs_objstore::{open_store, S3Options, VolumeStore};
use glidefs_testkit::{verify_block, S3Server};

#[tokio::test]
async fn s3_url_with_credentials_endpoint_and_prefix() {
    let server = S3Server::start().await.unwrap();
    let s3 = S3Options {
        endpoint: Some(server.endpoint.clone()),
        settings: vec![
            ("AWS_ACCESS_KEY_ID".into(), server.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), server.secret.clone()),
            ("AWS_REGION".into(), server.region.clone()),
        ],
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
