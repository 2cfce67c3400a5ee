//! API tests of warm sets (`GET`/`DELETE /v1/volumes/{name}/warmset`, `POST
//! .../warmset/record`) on a daemon without devices, the guest's reads made through the volume
//! itself (as a ublk READ tells the recording): a recording keeps the blocks read and stores
//! them; a second one at the same time is refused; bad requests change nothing; a clone made
//! afterwards gets the set and its attach warms exactly those blocks, which then read back
//! the origin's data; dropping the origin's set leaves the clone's copy. (The recorder and the
//! warm themselves: `crates/volume/tests/volume_warm.rs`.)

mod api_support;

use std::time::{Duration, Instant};

use glidefs::model::WarmSetInfo;
use hyper::Method;
use serde_json::json;

use api_support::daemon::{assert_error, start, text, Daemon};

const BS: u64 = 128 << 10;

async fn warm_info(d: &Daemon, name: &str) -> WarmSetInfo {
    d.client.warm_set(name).await.unwrap()
}

/// Polls `name`'s warm-set state (bounded) until `done` holds.
async fn wait_for(
    d: &Daemon,
    name: &str,
    what: &str,
    done: impl Fn(&WarmSetInfo) -> bool,
) -> WarmSetInfo {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let w = warm_info(d, name).await;
        if done(&w) {
            return w;
        }
        assert!(
            Instant::now() < until,
            "timed out waiting for {what}: {w:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn block_data(b: u64) -> Vec<u8> {
    (0..BS)
        .map(|i| (i as u8) ^ (b as u8).wrapping_mul(31))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_set_is_stored_copied_to_a_clone_and_warms_its_attach() {
    let dir = tempfile::tempdir().unwrap();
    let d = start(dir.path()).await;
    d.create(json!({"name": "img", "size": "4M"})).await;
    let img = d.volume("img");
    for b in 0..32 {
        img.write(b * BS, &block_data(b)).await.unwrap();
    }
    d.client.flush("img").await.unwrap();
    assert_eq!(warm_info(&d, "img").await.stored, None);

    // Bad requests change nothing.
    let path = "/v1/volumes/img/warmset/record";
    for (body, code) in [
        (json!({"seconds": 0}), "invalid_warm_set"),
        (json!({"seconds": 3601}), "invalid_warm_set"),
        (json!({"max_blocks": 0}), "invalid_warm_set"),
        (json!({"max_blocks": 524_289}), "invalid_warm_set"),
        (json!({"bogus": 1}), "bad_request"),
    ] {
        let r = d.req(Method::POST, path, Some(body.clone())).await;
        assert_error(&r, 400, code, &body.to_string());
    }
    assert_eq!(warm_info(&d, "img").await.recording, None);
    let r = d
        .req(
            Method::POST,
            "/v1/volumes/nope/warmset/record",
            Some(json!({})),
        )
        .await;
    assert_error(&r, 404, "not_found", "record on a missing volume");

    // A recording of at most 4 blocks; a second one at the same time is refused.
    let r = d
        .req(
            Method::POST,
            path,
            Some(json!({"seconds": 30, "max_blocks": 4})),
        )
        .await;
    assert_eq!(r.status, 200, "{}", text(&r));
    let w: WarmSetInfo = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(w.recording.as_ref().map(|r| r.max_blocks), Some(4), "{w:?}");
    let r = d.req(Method::POST, path, Some(json!({}))).await;
    assert_error(&r, 409, "warm_set_recording", "a second recording");
    let mut buf = vec![0u8; BS as usize];
    for b in [5, 1, 5, 9, 2, 30] {
        img.read(b * BS, &mut buf).await.unwrap();
    }
    // The outcome is recorded after the PUT: the set may be in the store a moment before.
    let w = wait_for(&d, "img", "the recording to be stored", |w| {
        w.recording.is_none() && w.stored.is_some() && w.last_recording.is_some()
    })
    .await;
    let stored = w.stored.unwrap();
    assert_eq!((stored.blocks, stored.block_size), (4, BS as u32));
    assert_eq!(
        w.last_recording.map(|r| (r.blocks, r.error)),
        Some((4, None))
    );

    // A clone made now gets the set, and its attach fetches exactly those 4 blocks.
    d.client.snapshot_create("img", "s").await.unwrap();
    d.create(json!({"name": "c", "from": "img@s"})).await;
    let w = wait_for(&d, "c", "the clone's warm", |w| w.last_warm.is_some()).await;
    assert_eq!(w.stored.as_ref().map(|s| s.blocks), Some(4), "{w:?}");
    let warm = w.last_warm.unwrap();
    assert_eq!(
        (
            warm.set_blocks,
            warm.fetched_blocks,
            warm.skipped,
            warm.failed
        ),
        (4, 4, 0, 0),
        "{warm:?}"
    );
    assert!(warm.gets >= 1 && warm.fetched_bytes > 0, "{warm:?}");
    let c = d.volume("c");
    for b in [5, 1, 9, 2] {
        assert_ne!(
            c.block_info(b).state,
            glidefs_volume::cache::BlockState::NotPresent,
            "block {b} warmed"
        );
        c.read(b * BS, &mut buf).await.unwrap();
        assert!(buf == block_data(b), "block {b} of the clone");
    }
    assert_eq!(
        c.block_info(30).state,
        glidefs_volume::cache::BlockState::NotPresent,
        "a block outside the set stays in the store"
    );

    // Dropping the origin's set leaves the clone's copy.
    let r = d.req(Method::DELETE, "/v1/volumes/img/warmset", None).await;
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(warm_info(&d, "img").await.stored, None);
    assert_eq!(warm_info(&d, "c").await.stored.map(|s| s.blocks), Some(4));
}
