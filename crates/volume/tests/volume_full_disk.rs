//! A volume on a nearly full cache disk: a FLUSH that made every write durable succeeds even
//! when the checkpoint it triggers cannot get space for a new WAL segment.

mod common;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use glidefs_cache::{CrashHook, CrashPoint, IoOp};
use glidefs_volume::Volume;

use common::*;

/// Refuses a new WAL segment's space reservation while armed (less than its reserve free).
#[derive(Debug, Default)]
struct NoRoomForASegment {
    armed: AtomicBool,
}

impl CrashHook for NoRoomForASegment {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<io::Error> {
        (op == IoOp::WalReserve && self.armed.load(Ordering::SeqCst))
            .then(|| io::Error::new(io::ErrorKind::StorageFull, "injected ENOSPC"))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_succeeds_when_its_checkpoint_finds_no_room() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(NoRoomForASegment::default());
    let mut cfg = config(dir.path());
    cfg.crash_hook = hook.clone();
    cfg.checkpoint_records = 4;
    let store = mem();
    let v = Volume::open(cfg.clone(), store.clone()).await.unwrap();
    hook.armed.store(true, Ordering::SeqCst);
    let bs = u64::from(BS);
    for b in 0..8u64 {
        v.write(b * bs, &vec![b as u8 + 1; 4096]).await.unwrap();
    }
    v.flush()
        .await
        .expect("a FLUSH whose data is durable succeeds although its checkpoint failed");
    // What the FLUSH acknowledged survives a crash.
    v.kill().await;
    drop(v);
    hook.armed.store(false, Ordering::SeqCst);
    let v = Volume::open(cfg, store).await.unwrap();
    for b in 0..8u64 {
        let mut buf = vec![0; 4096];
        v.read(b * bs, &mut buf).await.unwrap();
        assert!(buf.iter().all(|&x| x == b as u8 + 1), "block {b}");
    }
}
