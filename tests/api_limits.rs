//! The descriptor reserve of `daemon::limits` with creates that run side by side
//! (`manager::inflight`). A target of its own: it lowers this process's `RLIMIT_NOFILE`.

mod api_support;

use std::sync::Arc;
use std::time::Duration;

use glidefs::daemon::limits::{open_fds, out_of_fds, volume_need, RESERVE};
use glidefs::daemon::manager::ManagerError;
use glidefs::model::CreateVolume;
use serde_json::json;

use api_support::daemon::{assemble, cache_dirs, file_store};
use api_support::exporters::{FakeDevices, SlowDevices};

/// The soft `RLIMIT_NOFILE` now, and sets it to `soft` (the hard limit unchanged).
fn set_soft_limit(soft: u64) -> u64 {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain libc calls on a local struct.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut r), 0);
        let before = r.rlim_cur;
        r.rlim_cur = soft;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &r), 0);
        before
    }
}

fn request(name: &str, queues: u16) -> CreateVolume {
    serde_json::from_value(json!({"name": name, "size": "4M", "queues": queues})).unwrap()
}

/// The limit leaves room for exactly `FIT` volumes of 2 queues above the reserve: one create
/// at a time (the old serial code), the 7th is refused with `too_many_open_files` and the
/// daemon keeps its 32 descriptors for removes and flushes. Nine creates side by side each
/// pass `check_headroom` before any of them holds its descriptors (the device step is slow),
/// so together they must not eat the reserve; and a create that did not fit must leave
/// nothing behind (its name creatable again once there is room).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn creates_side_by_side_keep_the_descriptor_reserve() {
    const QUEUES: u16 = 2;
    const FIT: u64 = 6;
    let dir = tempfile::tempdir().unwrap();
    let layer = Arc::new(SlowDevices {
        delay: Duration::from_millis(300),
        devices: FakeDevices {
            hold_fds: true,
            ..FakeDevices::default()
        },
        ..SlowDevices::default()
    });
    let mut d = assemble(dir.path(), file_store(dir.path()), layer.clone()).await;
    let manager = d.manager().clone();
    // Warm up whatever opens lazily (store, blocking pool) so the count below is the rest.
    manager.create(&request("warm", QUEUES)).await.unwrap();
    manager.remove("warm", false, false).await.unwrap();

    let need = volume_need(QUEUES);
    let open = open_fds().expect("/proc/self/fd");
    let limit = open + RESERVE + FIT * need;
    let original = set_soft_limit(limit);
    let n = FIT + 3;
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let m = manager.clone();
            tokio::spawn(async move { m.create(&request(&format!("f{i}"), QUEUES)).await })
        })
        .collect();
    let mut created = Vec::new();
    let mut refused = Vec::new();
    let mut problems = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let name = format!("f{i}");
        match t.await.unwrap() {
            Ok(_) => created.push(name),
            // Refused by the check, or `EMFILE` on the way (the API answers both with
            // `too_many_open_files`).
            Err(ManagerError::TooManyOpenFiles { .. }) => refused.push(name),
            Err(e) if out_of_fds(&e).is_some() => refused.push(name),
            Err(e) => {
                problems.push(format!("create {name}: not a clean refusal: {e}"));
                refused.push(name);
            }
        }
    }
    let now = open_fds().unwrap();
    println!(
        "limit {limit} (open before {open}, {need} per volume): {} created, {} refused, {now} open after",
        created.len(),
        refused.len()
    );
    if now + RESERVE > limit {
        problems.push(format!(
            "{} creates side by side passed the headroom check: {now} of {limit} descriptors open, only {} free, fewer than the reserve of {RESERVE} (one at a time, {FIT} fit)",
            created.len(),
            limit - now
        ));
    }
    set_soft_limit(original);
    // Room again: every name that did not fit is creatable (no claim, no cache left over).
    for name in &created {
        manager.remove(name, false, false).await.unwrap();
    }
    for name in &refused {
        if let Err(e) = manager.create(&request(name, QUEUES)).await {
            problems.push(format!("create {name} again after it did not fit: {e}"));
        }
    }
    println!("cache dirs at the end: {:?}", cache_dirs(&d.cfg));
    d.stop().await;
    assert!(problems.is_empty(), "{problems:#?}");
}
