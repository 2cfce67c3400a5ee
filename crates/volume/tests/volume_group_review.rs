//! Tests from the fresh-eyes review of the group commit to the store (`group.rs`): a sync
//! failing while another caller arrives (safe as written), and a leader whose sync panics
//! (every later FLUSH hung, before the leader's drop guard: fixed).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use glidefs_testkit::{Fault, FaultRule, FaultyStore, Op};
use glidefs_volume::cache::{CrashHook, CrashPoint};
use glidefs_volume::Durability;

/// A "bug" in the flush path: the first sync to reach its pack upload panics (any panic on
/// that path: an `unwrap` in a dependency, an arithmetic overflow in a debug build, an
/// allocation failure...). Once.
#[derive(Debug, Default)]
struct PanicOnce {
    fired: AtomicBool,
}

impl CrashHook for PanicOnce {
    fn should_crash(&self, point: CrashPoint) -> bool {
        if point == CrashPoint::BeforePackUpload && !self.fired.swap(true, Ordering::SeqCst) {
            panic!("review: a panic inside sync_to_store (group leader task)");
        }
        false
    }
}

/// Contract attacked (`group.rs` module docs): "The leader is a task of its own, so a caller
/// that stops waiting never leaves the others without one" — a leader that *ends abnormally*
/// does. `lead_group` clears `leading` only on its orderly exit; when its task panics (or is
/// aborted), `leading` stays `true` and no later `flush_to_store` spawns a leader, while the
/// watch sender lives on in the volume, so every waiter's `wait_for` never returns: the
/// FLUSH that was in flight and every FLUSH after it hang forever (the guest's I/O
/// stalls; with plain `sync_to_store` the panic would reach its one caller as an error).
///
/// Expected: the FLUSH during which the sync panicked fails (or at least returns), and the
/// next FLUSH succeeds. Fails now: the first `flush_to_store` times out (and so would the
/// second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_sync_fails_its_flushes_and_the_next_flush_leads_again() {
    let store = mem();
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.durability = Durability::Store;
    cfg.crash_hook = Arc::new(PanicOnce::default());
    let v = glidefs_volume::Volume::open(cfg, store.clone())
        .await
        .unwrap();
    v.write(0, &vec![7u8; BS as usize]).await.unwrap();

    let first = tokio::time::timeout(Duration::from_secs(3), v.flush_durable()).await;
    let second = tokio::time::timeout(Duration::from_secs(3), v.flush_durable()).await;
    let figures = v.group_figures();
    assert!(
        first.is_ok() && matches!(second, Ok(Ok(()))),
        "after a panic in the group's sync: first FLUSH {}, second FLUSH {} \
         (group figures {figures:?}: the leader died with `leading` still set)",
        match &first {
            Ok(r) => format!("returned {r:?}"),
            Err(_) => "HUNG (3 s)".into(),
        },
        match &second {
            Ok(r) => format!("returned {r:?}"),
            Err(_) => "HUNG (3 s)".into(),
        },
    );
}

/// Checked safe (passes): a caller that arrives while a sync runs needs the NEXT sync (the
/// running one rotated before its write completed), so that sync's *failure* does not
/// answer it, and the next sync's success covers its write (re-publishing the failed
/// sync's pending rotation first). Epoch 1's pack upload is held while the caller writes and
/// arrives; epoch 1 then fails at its manifest PUT; the caller's FLUSH must succeed and a
/// fresh host must read its write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_arriving_during_a_failing_sync_is_served_by_the_next() {
    let mem = mem();
    let faulty = Arc::new(FaultyStore::new(mem.clone()));
    let store: Arc<dyn object_store::ObjectStore> = faulty.clone();
    let dir = tempfile::tempdir().unwrap();
    let v = open(dir.path(), store.clone()).await;
    let a = vec![1u8; BSU];
    v.write(0, &a).await.unwrap();
    faulty.inject(
        FaultRule::new(Fault::Hold)
            .ops(&[Op::Put])
            .path_contains("/packs/")
            .times(1),
    );
    faulty.inject(
        FaultRule::new(Fault::Permanent)
            .ops(&[Op::Put])
            .path_contains("manifest/")
            .times(1),
    );
    let first = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    faulty.wait_held(1).await;
    let b = vec![2u8; BSU];
    v.write(u64::from(BS), &b).await.unwrap();
    let second = {
        let v = v.clone();
        tokio::spawn(async move { v.flush_to_store().await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    faulty.release_held();
    let r1 = first.await.unwrap();
    let r2 = second.await.unwrap();
    assert_eq!(
        faulty.plan().faults_fired(),
        2,
        "the hold and the failed manifest PUT fired"
    );
    assert!(r2.is_ok(), "the later caller: {r2:?} (first: {r1:?})");
    assert_eq!(
        v.group_figures().syncs,
        2,
        "epoch 1 failed, epoch 2 served the caller"
    );
    v.kill().await;
    let fresh = tempfile::tempdir().unwrap();
    let w = open(fresh.path(), mem.clone()).await;
    assert_eq!(read_range(&w, 0, BSU).await, a);
    assert_eq!(read_range(&w, u64::from(BS), BSU).await, b);
    w.close().await.unwrap();
}
