//! Deferred commits cannot deadlock behind the runtime (see `commit`), and what they
//! complete survives a kill. Found by review: when such a commit was queued on the blocking
//! pool, 512 slow-path requests parked on the gate (behind a rotation) or on the commit's own
//! stripe filled the pool, and the commit never ran.
//!
//! These tests drive the target the way the queue loop does (the `Harness`), one OS thread
//! per outstanding request (each stands in for the loop's slot waiting for the answer).
//! The fixture is leaked on purpose: a deadlocked runtime could not be dropped.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_volume::cache::{
    BlockState, FaultEffect, FaultOn, IoOp as CacheIoOp, LockMode, WritePrep,
};
use glidefs_volume::Volume;
use ublk_core::testing::{run_chunks, Harness};
use ublk_core::IoOp;

use super::tests::{config, fixture_with, io, Fixture, BS};
use super::write::write_action;

/// tokio's default `max_blocking_threads` (what `runtime::serving` and `main` use).
const TOKIO_DEFAULT_POOL: usize = 512;
/// Hang guard: how long a commit that needs nothing but its own thread may take.
const HANG: Duration = Duration::from_secs(30);

/// A fixture with one queue of `depth` tags, leaked (a deadlocked runtime cannot be
/// dropped).
fn leaked_fixture(depth: u16) -> &'static Fixture {
    let store = Arc::new(object_store::memory::InMemory::new());
    Box::leak(Box::new(fixture_with(store, None, depth)))
}

/// What the other outstanding requests wait for on their pool threads.
#[derive(Clone, Copy)]
enum Waiters {
    /// A flush-to-store (the flusher) rotates while W1 is in flight: the rotation queues on
    /// the gate's write side, so every later request fails `try_enter`, goes to the slow
    /// path and parks a pool thread in `enter()`.
    GateBehindRotation,
    /// No rotation: later 4 KiB writes to W1's block find its stripe locked (W1's ticket)
    /// and park pool threads in `prepare_write(.., Wait)`.
    StripeOfW1,
}

/// W1, a full-block WRITE to a never-written block (its commit turns the block Dirty, so
/// `after_write` defers it to the commit thread), is dispatched inline and its data lands; meanwhile
/// `waiters` other WRITEs are outstanding and waiting (see [`Waiters`]); then W1's chunk
/// completes and the loop calls `after_write`. Returns W1's final result; fails when it did
/// not come within [`HANG`].
fn w1_result(kind: Waiters, waiters: usize) -> i32 {
    let f = leaked_fixture(u16::try_from(waiters + 1).unwrap());
    let cache = f.volume.cache();
    const X: u64 = 3;

    // W1 inline: gate + ticket (stripe of X locked), its data lands in the active file.
    let w1 = io(IoOp::Write, X * BS, BS as u32, 0);
    let gate = cache.try_enter().unwrap();
    let WritePrep::Ready(ticket) = cache
        .prepare_write(&gate, w1.offset, BS, LockMode::Try)
        .unwrap()
    else {
        panic!("a full-block write to a fresh block is ready inline");
    };
    let (chunks, keep) = write_action(&w1, gate, ticket);
    let mut data = vec![0x5Au8; BS as usize];
    run_chunks(&w1, &chunks, &mut data).unwrap();

    if let Waiters::GateBehindRotation = kind {
        // The flusher's periodic flush-to-store: its rotate queues on the write gate.
        let v = Arc::clone(&f.volume);
        drop(f.rt.spawn(async move { v.sync_to_store().await }));
        let t0 = Instant::now();
        while cache.try_enter().is_some() {
            assert!(t0.elapsed() < HANG, "the rotation never queued on the gate");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    // The other outstanding requests, each on its own "loop slot" thread.
    for i in 0..waiters {
        let tag = u16::try_from(i + 1).unwrap();
        let off = match kind {
            Waiters::GateBehindRotation => (8 + (i as u64 % 8)) * BS + 4096,
            Waiters::StripeOfW1 => X * BS + 4096 * (i as u64 % 16),
        };
        std::thread::spawn(move || {
            let mut lp = Harness::default();
            let mut buf = vec![i as u8; 4096];
            let _ = lp.run(&f.target, io(IoOp::Write, off, 4096, tag), &mut buf);
        });
    }
    // Let them reach their pool threads (setup only; never the assertion).
    let t0 = Instant::now();
    while f.target.in_flight() < waiters && t0.elapsed() < HANG {
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_secs(2));

    // W1's chunk completed: the loop calls after_write (commit deferred).
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lp = Harness::default();
        lp.next();
        let _ = tx.send(lp.land_write(&f.target, w1, BS as i32, Some(keep)));
    });
    match rx.recv_timeout(HANG) {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => panic!("harness: {e}"),
        Err(_) => panic!(
            "W1 (landed, its commit deferred) got no answer in {HANG:?}; \
             block {X} is {:?}; {} deferred requests of the queue still in flight; \
             nothing on this queue can ever complete",
            cache.block_info(X).state,
            f.target.in_flight(),
        ),
    }
}

/// A flush-to-store rotates while a 64 KiB write W1 is in flight, and 512 other requests
/// (8 queues x 64, the default depth) arrive meanwhile: each parks a pool thread in
/// `enter()` behind the rotation, which waits for W1's gate. W1's commit must still run.
#[test]
fn a_deferred_commit_runs_beside_a_full_blocking_pool() {
    let r = w1_result(Waiters::GateBehindRotation, TOKIO_DEFAULT_POOL);
    assert_eq!(r, BS as i32);
}

/// Without any rotation: 512 writes to W1's block wait for its stripe lock on the pool;
/// W1's commit (the holder of that lock) must still run.
#[test]
fn a_deferred_commit_runs_beside_its_own_stripe_waiters() {
    let r = w1_result(Waiters::StripeOfW1, TOKIO_DEFAULT_POOL);
    assert_eq!(r, BS as i32);
}

// The WAL rule survives the deferred commit: a completed write's record is in the file.

/// Reopens the volume's directory after a simulated kill -9 (same boot) and reads `len`
/// bytes at `off`.
fn reopen_and_read(
    dir: &std::path::Path,
    store: Arc<object_store::memory::InMemory>,
    off: u64,
    len: usize,
) -> (Vec<u8>, BlockState) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let v = rt.block_on(Volume::open(config(dir), store)).unwrap();
    let mut buf = vec![0u8; len];
    rt.block_on(v.read(off, &mut buf)).unwrap();
    let st = v.cache().block_info(off / BS).state;
    (buf, st)
}

#[test]
fn completed_writes_survive_kill_after_deferred_commits_and_wal_enospc() {
    let hook = Arc::new(FaultOn::new(CacheIoOp::WalWrite, FaultEffect::NoSpace));
    let store = Arc::new(object_store::memory::InMemory::new());
    let Fixture {
        rt,
        volume,
        target,
        dir,
    } = fixture_with(store.clone(), Some(hook.clone()), 4);
    // Block 2 Clean (flushed to the store, kept in the cache), block 5 fresh.
    let clean = vec![0x11u8; BS as usize];
    rt.block_on(async {
        volume.write(2 * BS, &clean).await.unwrap();
        volume.sync_to_store().await.unwrap();
    });
    assert_eq!(volume.cache().block_info(2).state, BlockState::Clean);
    let mut lp = Harness::default();
    // 1. Full-block write to the Clean block: inline prepare, deferred commit.
    let mut a = vec![0xA1u8; BS as usize];
    assert_eq!(
        lp.run(&target, io(IoOp::Write, 2 * BS, BS as u32, 0), &mut a),
        Ok(BS as i32)
    );
    // 2. WAL full: a write turning block 5 Dirty fails; the block turns Dirty anyway.
    hook.arm();
    let mut b = vec![0xB2u8; BS as usize];
    let r = lp.run(&target, io(IoOp::Write, 5 * BS, BS as u32, 1), &mut b);
    assert_eq!(r, Ok(-libc::EIO));
    assert_eq!(volume.cache().block_info(5).state, BlockState::Dirty);
    // 3. A write to that now-Dirty block must not complete inline while its record is only
    //    buffered.
    let mut c = vec![0xC3u8; 4096];
    let r = lp.run(&target, io(IoOp::Write, 5 * BS, 4096, 2), &mut c);
    assert_eq!(
        r,
        Ok(-libc::EIO),
        "completed while its block's Dirty record is buffered"
    );
    // 4. Space back: the next write to block 5 writes the record out and completes.
    hook.disarm();
    let mut d = vec![0xD4u8; 4096];
    assert_eq!(
        lp.run(&target, io(IoOp::Write, 5 * BS + 8192, 4096, 3), &mut d),
        Ok(4096)
    );
    // kill -9 (same boot): buffered records are dropped, written ones stay.
    rt.block_on(volume.kill());
    drop(target);
    drop(volume);
    let (got, st) = reopen_and_read(dir.path(), store.clone(), 2 * BS, BS as usize);
    assert_eq!(st, BlockState::Dirty);
    assert!(
        got == a,
        "the completed deferred-commit write to block 2 was lost"
    );
    let (got, st) = reopen_and_read(dir.path(), store, 5 * BS + 8192, 4096);
    assert_eq!(st, BlockState::Dirty);
    assert!(got == d, "the completed write to block 5 was lost");
    rt.shutdown_background();
}

// Review (commit pool): one volume's hung WAL write must not stop another volume's commits.

/// A cache whose WAL write(2) hangs on the commit threads (a cache disk in error recovery, a
/// write stuck behind its file system) until released; other threads write normally.
#[derive(Debug, Default)]
struct HungWal {
    armed: std::sync::atomic::AtomicBool,
    /// Commits that reached the hung write(2).
    entered: std::sync::atomic::AtomicUsize,
    released: parking_lot::Mutex<bool>,
    wake: parking_lot::Condvar,
}

impl HungWal {
    fn release(&self) {
        *self.released.lock() = true;
        self.wake.notify_all();
    }
}

impl glidefs_volume::cache::CrashHook for HungWal {
    fn should_crash(&self, _point: glidefs_volume::cache::CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: CacheIoOp) -> Option<std::io::Error> {
        use std::sync::atomic::Ordering::SeqCst;
        let on_commit_thread = std::thread::current()
            .name()
            .is_some_and(|n| n.starts_with("commit-"));
        if op == CacheIoOp::WalWrite && on_commit_thread && self.armed.load(SeqCst) {
            self.entered.fetch_add(1, SeqCst);
            let mut released = self.released.lock();
            while !*released {
                self.wake.wait(&mut released);
            }
        }
        None
    }
}

/// As many volumes as the commit pool has threads each have one commit stuck in a hung WAL
/// write; a healthy volume (its own directory, its WAL fine) then writes a fresh block (its
/// commit turns the block Dirty, so it is deferred). With a commit thread per target (before
/// the pool) it completed at once; with the pool every commit thread is parked in another
/// volume's write(2) and the healthy volume's write (and every request behind its gate or
/// stripes, and its `stop`'s drain) waits for as long as the other volumes' disk hangs.
#[test]
fn a_volume_commits_while_other_volumes_wal_writes_hang() {
    use std::sync::atomic::Ordering::SeqCst;
    let stuck = super::commit::pool_threads();
    let hook = Arc::new(HungWal::default());
    let hung: Vec<&'static Fixture> = (0..stuck)
        .map(|_| {
            let store = Arc::new(object_store::memory::InMemory::new());
            let hook: Arc<dyn glidefs_volume::cache::CrashHook> = hook.clone();
            &*Box::leak(Box::new(fixture_with(store, Some(hook), 4)))
        })
        .collect();
    let healthy = leaked_fixture(4);
    hook.armed.store(true, SeqCst);
    for f in hung {
        std::thread::spawn(move || {
            let mut lp = Harness::default();
            let mut buf = vec![0x77u8; BS as usize];
            let _ = lp.run(&f.target, io(IoOp::Write, 3 * BS, BS as u32, 0), &mut buf);
        });
    }
    let t0 = Instant::now();
    while hook.entered.load(SeqCst) < stuck {
        assert!(
            t0.elapsed() < HANG,
            "the hung volumes' commits never started"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lp = Harness::default();
        let mut buf = vec![0x5Au8; BS as usize];
        let _ = tx.send(lp.run(
            &healthy.target,
            io(IoOp::Write, 5 * BS, BS as u32, 0),
            &mut buf,
        ));
    });
    let got = rx.recv_timeout(Duration::from_secs(10));
    // Let the pool go on for the other tests of this process before judging.
    hook.release();
    match got {
        Ok(r) => assert_eq!(r, Ok(BS as i32)),
        Err(_) => panic!(
            "a healthy volume's write got no answer in 10 s: all {stuck} commit threads are \
             parked in the WAL write(2) of {stuck} other volumes (block 5 is {:?})",
            healthy.volume.block_info(5).state
        ),
    }
}
