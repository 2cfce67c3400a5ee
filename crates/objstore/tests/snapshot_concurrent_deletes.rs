//! Two deletes of one snapshot at once (issue 45 item 5, found by a fresh-eyes review; each
//! test failed before the fix): the refused one lifted the shared `deleting` marker the other
//! relied on, so a view registered, or a clone passed its final check, on a snapshot the
//! other delete then removed. Each delete now has a marker of its own.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::snapshots::*;
use common::*;
use glidefs_objstore::SnapshotProblem;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use object_store::ObjectStore;

/// Two deletes of v@s1 run at once (an operator's retry after a timeout, a purge and a
/// delete, two hosts). The `deleting` marker is one object shared by both, and a *refused*
/// delete removes it (`unpin`, "refused ... delete marker").
/// 1. D1 writes the marker, lists the views (none), and is about to delete the record.
/// 2. View V (host B) PUTs its registration; its check is not run yet.
/// 3. D2 writes the marker, lists the views, sees V live: refused `Attached`, and deletes
///    the marker.
/// 4. V checks: no marker, the record at generation 1: registered.
/// 5. D1 deletes the record and the marker: done.
///
/// V is registered and open on a snapshot that is gone; GC collects generation 1's pack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delete_leaves_the_marker_a_concurrent_delete_relies_on() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    // What V serves (a view loads its map before it registers).
    let m1 = origin.fetch_manifest(1).await.unwrap();

    // 1. D1 stalls at its record DELETE (after its view listing).
    faulty.inject(
        FaultRule::new(Fault::Stall(Duration::from_millis(1500)))
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/record")
            .times(1),
    );
    let d1 = {
        let vs = volume(&store, "v");
        tokio::spawn(async move { vs.delete_snapshot("s1").await })
    };
    while faulty.plan().faults_fired() == 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // 2. V registers: its PUT lands, its marker check is held.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Get])
            .path_contains("snapshots/s1/deleting")
            .times(1),
    );
    let view = {
        let vs = volume(&store, "v");
        tokio::spawn(async move { vs.register_view("s1", 1, "host-b/1", "/b").await })
    };
    tokio::time::timeout(Duration::from_secs(10), faulty.plan().wait_held(1))
        .await
        .expect("held");
    // 3. D2 is refused because of V, and removes the marker.
    let d2 = volume(&store, "v").delete_snapshot("s1").await;
    assert!(
        matches!(
            d2.as_ref().err().and_then(problem),
            Some(SnapshotProblem::Attached { .. })
        ),
        "D2: {d2:?}"
    );
    // 4. V's check runs (D1 still stalled).
    faulty.release_held();
    let registered = view.await.unwrap();
    // 5. D1 resumes.
    let d1 = d1.await.unwrap();
    origin.gc(collect_all()).await.unwrap();
    let (blk, loc) = m1.iter().next().unwrap();
    let read = origin.read_block(blk, loc).await.map(|_| ());
    assert!(
        registered.is_err() || d1.is_err(),
        "view V registered ({registered:?}) on v@s1 while delete D1 succeeded ({:?}); \
         V's read of generation 1 after GC: {read:?}",
        d1.as_ref().map(|r| r.generation)
    );
}

/// The same interleaving with a clone in place of the view. The creation looks at s1 before
/// D1's marker (no delete yet), its registration PUT lands after D1 listed the clones (none);
/// it publishes generation 1; D2 is refused (`HasClones`) and removes the marker D1 still
/// relies on; the creation's final check finds the record and no marker: created. D1 then
/// deletes the record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_delete_lets_no_clone_pass_its_check_during_a_concurrent_delete() {
    let faulty = Arc::new(FaultyStore::new(memory().store));
    let store: Arc<dyn ObjectStore> = faulty.clone();
    let origin = volume(&store, "v");
    two_generations(&origin).await;
    let held = |n| {
        let f = faulty.clone();
        async move {
            tokio::time::timeout(Duration::from_secs(10), f.plan().wait_held(n))
                .await
                .expect("held")
        }
    };

    // The creation looked at s1 and is held at its registration PUT.
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("snapshots/s1/clones/c")
            .times(1),
    );
    let creating = {
        let (c, o) = (volume(&store, "c"), volume(&store, "v"));
        tokio::spawn(async move { c.create_clone(&o, "s1", None).await.map(|_| ()) })
    };
    held(1).await;
    // D1: marker, clone listing (none), view listing; stalls at its record DELETE.
    faulty.inject(
        FaultRule::new(Fault::Stall(Duration::from_millis(2000)))
            .ops(&[Op::Delete])
            .path_contains("snapshots/s1/record")
            .times(1),
    );
    let fired = faulty.plan().faults_fired();
    let d1 = {
        let vs = volume(&store, "v");
        tokio::spawn(async move { vs.delete_snapshot("s1").await })
    };
    while faulty.plan().faults_fired() == fired {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The creation goes on to its final check, which is held (its marker GET).
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Get])
            .path_contains("snapshots/s1/deleting")
            .times(1),
    );
    let fired = faulty.plan().faults_fired();
    faulty.release_held();
    // The marker GET is held (not the registration PUT, still counted until it wakes).
    while faulty.plan().faults_fired() == fired {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    held(1).await;
    let d2 = volume(&store, "v").delete_snapshot("s1").await;
    faulty.release_held();
    let created = tokio::time::timeout(Duration::from_secs(10), creating)
        .await
        .expect("creation ends")
        .unwrap();
    let d1 = d1.await.unwrap();
    origin.gc(collect_all()).await.unwrap();
    let c = volume(&store, "c");
    let m = c.fetch_manifest(1).await;
    let read = match &m {
        Ok(m) => {
            let (blk, loc) = m.iter().next().unwrap();
            c.read_block(blk, loc)
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        }
        Err(e) => Err(e.to_string()),
    };
    assert!(
        created.is_err() || d1.is_err(),
        "clone `c` created ({created:?}) while D1 deleted v@s1 ({:?}; D2: {:?}); \
         reading `c` after GC of `v`: {read:?}",
        d1.as_ref().map(|r| r.generation),
        d2.as_ref().err().and_then(problem)
    );
}
