//! `open_store("s3://bucket/prefix")` configured only through the environment, against the
//! in-process S3 server. Alone in its binary because it sets process environment variables.

mod common;

use common::*;
use glidefs_objstore::{open_store, VolumeStore, S3_ENDPOINT_ENV};
use glidefs_testkit::{verify_block, S3Server};

#[tokio::test]
async fn s3_url_with_env_credentials_endpoint_and_prefix() {
    let server = S3Server::start().await.unwrap();
    // Only this test runs in this process, so changing the environment races with nothing.
    std::env::set_var("AWS_ACCESS_KEY_ID", &server.access_key);
    std::env::set_var("AWS_SECRET_ACCESS_KEY", &server.secret);
    std::env::set_var("AWS_REGION", &server.region);
    std::env::set_var(S3_ENDPOINT_ENV, &server.endpoint);

    let store = open_store(&format!("s3://{}/tenant-a", server.bucket)).unwrap();
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
    let again = open_store(&format!("s3://{}/tenant-a/", server.bucket)).unwrap();
    let reader = VolumeStore::new(again, "vol", fast_cfg()).unwrap();
    let m = reader.load_manifest().await.unwrap().unwrap();
    for (blk, loc) in m.iter() {
        verify_block(blk, 1, &reader.read_block(blk, loc).await.unwrap()).unwrap();
    }
}
