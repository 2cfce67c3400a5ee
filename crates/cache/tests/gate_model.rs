//! Deterministic model check (loom) of the rotation gate and the block-state protocol.
//!
//! Run it with the crate built for loom (without `--cfg loom` this file is empty):
//!
//! ```text
//! RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
//!     cargo test -p glidefs-cache --release --test gate_model
//! ```
//!
//! Real code, through `glidefs_cache::loom_api::Core`: the rotation gate (`gate.rs`: the
//! `RotationGate` and its `Gate` guards over a fair, writer-preferring rwlock), the state map
//! (`state.rs::StateMap`: the state bytes with REMOTE / NO_FILL / ROTATED, their atomic
//! orderings, the dirty list) and its transitions (`rotate`, `complete_rotated`,
//! `evict_clean`, `end_eviction`, `fillable`, `filled`), the stripe locks and the fill
//! epoch. Under `--cfg loom`, `src/sync.rs` gives that code loom's atomics and locks built
//! from loom's `Mutex` + `Condvar`, so loom explores every interleaving of the real
//! accesses up to a preemption bound.
//!
//! Modelled (files):
//! - `gate_model/cache.rs`: the cache files and the object store's copy as loom atomics (a
//!   page holds a version number), the real core, the invariants;
//! - `gate_model/steps.rs`: the order of the cache's steps and their file I/O, each naming
//!   the real function it restates;
//! - `gate_model/actors.rs`: the requests of the ublk target (crates/ublk/src/volume_target)
//!   and the volume's jobs (crates/volume) built from those steps.
//!
//! Invariants, checked in every explored interleaving:
//! 1. a read returns, per page, the version of the last write completed before it began or
//!    a newer one (never an older version, never zeros for a written page): "stale read";
//! 2. when every actor is done, state + file (or object store copy) give each page its last
//!    written version ("lost write"), and a Clean block's clean copy is the object store's;
//! 3. no deadlock (loom fails the model when every thread is blocked: "deadlock").
//!
//! Faithful to the code rather than to the usual summary of it: `read_for_flush` reads the
//! flushing file under a read gate and is where a block reaches the clean file (staged while
//! still Syncing); `complete_flush` only changes states; `rotate`, `complete_flush` and
//! `evict_to` (`sync_log`) each take a brief read of the gate besides the write gate; a fill
//! also checks the epoch (`FillToken`: bumped by eviction and flush completion), not only
//! NotPresent / NO_FILL; eviction punches and clears NO_FILL after the write gate.
//!
//! Left out (see also docs/engine/verification.md, "The gate model"): the WAL,
//! checkpoints, crashes, page CRCs; requests of more than one block and shared stripes;
//! CLOCK order and the budget check; fetch coalescing; the admin lock (one flusher); the
//! runtime is one thread.
//!
//! Every scenario runs against the faithful code (must pass) and, with one switch of
//! [`Variant`] flipped, against a broken one that must fail with the named invariant. The
//! switches of [`Faults`] are planted in the real code (`loom_api::Faults`, read by
//! `StateMap::complete_rotated` and `StateMap::fillable`); the others break the model's steps.
//!
//! Threads share the model through `std::sync::Arc`, not loom's: when loom reports a
//! deadlock the detecting thread unwinds, and a loom `Arc` dropped then panics again (abort).

#![cfg(loom)]

#[path = "gate_model/actors.rs"]
mod actors;
#[path = "gate_model/cache.rs"]
mod cache;
#[path = "gate_model/steps.rs"]
mod steps;

use glidefs_cache::loom_api::{Faults, FillChecks};
use loom::thread;
use std::sync::Arc;

use actors::{dispatch_write, read, sync_to_store, write, Deferred, Runtime};
use cache::{Cache, Init, Span};

/// The switches that break the protocol; `Variant::default()` is the real one.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Variant {
    /// Broken variants planted in the real code: `complete_flush` without the Syncing check
    /// (`complete_unchecked`), fills without some of their checks (`fill`).
    faults: Faults,
    /// Promote-before-write (`write.rs::Cache::prepare`).
    promote: Promote,
    /// Broken: a read's chunks use a gate other than the one its plan was made under.
    stale_plan: bool,
    /// Broken: a cold read stages its fetched bytes in the active file, not in scratch.
    stage_in_active: bool,
    /// Broken: the guest's FLUSH runs on the loop thread (which holds the gates of its
    /// in-flight writes) instead of being deferred.
    flush_on_loop: bool,
    /// Not a broken protocol: makes a write that fails with -EIO because it did not settle
    /// a model failure (a liveness check; the real request fails, the data never landed).
    eio_is_failure: bool,
    /// Broken (liveness): a partial write retries right after a fetch whose fill an eviction
    /// refused, instead of waiting for the eviction to end (`Volume::fetch_for_write`).
    retry_at_once: bool,
}

/// Where a partial write's promotion runs (`prepare_write` in the real code).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Promote {
    #[default]
    BeforeData,
    /// Broken: after the data landed (at commit): the copy overwrites the new data.
    AfterData,
    /// Broken: never: the rest of the block is missing from the active file.
    Skip,
}

/// A scenario and the preemption bound it is explored with.
type Scenario = (usize, fn(Variant));

const WRITE_RACES_FLUSH: Scenario = (2, write_races_flush);
const PARTIAL_WRITE_OF_A_REMOTE_BLOCK_RACES_EVICTION: Scenario =
    (3, partial_write_of_a_remote_block_races_eviction);
const READS_RACE_ROTATION_AND_EVICTION: Scenario = (3, reads_race_rotation_and_eviction);
const COLD_READ_RACES_WRITE_AND_FLUSH: Scenario = (2, cold_read_races_write_and_flush);
const COLD_READ_RACES_FLUSH_AND_EVICTION: Scenario = (3, cold_read_races_flush_and_eviction);
const LOOP_THREAD_FLUSH: Scenario = (3, loop_thread_flush);

/// Explores every interleaving of `scenario` (up to its preemption bound) under `v`.
fn explore(v: Variant, (preemptions, scenario): Scenario) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(preemptions);
    builder.check(move || scenario(v));
}

fn spawn(c: &Arc<Cache>, f: impl FnOnce(&Cache) + Send + 'static) -> thread::JoinHandle<()> {
    let c = Arc::clone(c);
    thread::spawn(move || f(&c))
}

/// A partial write races a flush of the same (Dirty) block: depending on the interleaving
/// the write finds the block Dirty, Syncing (promotion from the flushing file) or Clean
/// (promotion from the clean file), then reads it back; another reader reads it meanwhile.
fn write_races_flush(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Dirty([1, 1]), Init::Empty]));
    let w = spawn(&c, |c| {
        write(c, 0, Span::Page(0), 2);
        read(c, 0);
    });
    let r = spawn(&c, |c| {
        read(c, 0);
    });
    let f = spawn(&c, |c| {
        sync_to_store(c);
    });
    w.join().unwrap();
    r.join().unwrap();
    f.join().unwrap();
    c.check_final();
}

/// A partial write of a remote-only block (`NeedsFetch`: fetch, fill, retry, promote from the
/// clean file) races a flush of the other block and an eviction of every Clean block: fills
/// can be refused (epoch, NO_FILL) and the block can be evicted between attempts.
fn partial_write_of_a_remote_block_races_eviction(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Dirty([1, 1]), Init::Remote([1, 1])]));
    let w = spawn(&c, |c| {
        write(c, 1, Span::Page(1), 2);
        read(c, 1);
    });
    let f = spawn(&c, |c| {
        sync_to_store(c);
        c.evict();
    });
    w.join().unwrap();
    f.join().unwrap();
    c.check_final();
}

/// Reads race a flush (rotation) and an eviction: a Dirty block moves to the flushing file
/// and then to the clean file, a Clean block is punched and becomes remote-only.
fn reads_race_rotation_and_eviction(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Dirty([1, 1]), Init::Clean([1, 1])]));
    let r = spawn(&c, |c| {
        read(c, 0);
        read(c, 1);
    });
    let f = spawn(&c, |c| {
        sync_to_store(c);
        c.evict();
    });
    r.join().unwrap();
    f.join().unwrap();
    c.check_final();
}

/// A cold read of a remote-only block races a full-block write of it, while a flush of the
/// other block bumps the fill epoch (so fills can be refused and pieces stay remote).
fn cold_read_races_write_and_flush(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Remote([1, 1]), Init::Dirty([1, 1])]));
    let r = spawn(&c, |c| {
        read(c, 0);
    });
    let w = spawn(&c, |c| {
        write(c, 0, Span::Full, 2);
    });
    let f = spawn(&c, |c| {
        sync_to_store(c);
    });
    r.join().unwrap();
    w.join().unwrap();
    f.join().unwrap();
    c.check_final();
}

/// A cold read's fetch races a newer version's whole life: written, flushed, evicted.
fn cold_read_races_flush_and_eviction(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Remote([1, 1]), Init::Empty]));
    let r = spawn(&c, |c| {
        read(c, 0);
    });
    let w = spawn(&c, |c| {
        write(c, 0, Span::Full, 2);
        sync_to_store(c);
        c.evict();
    });
    r.join().unwrap();
    w.join().unwrap();
    c.check_final();
}

/// The ublk loop thread dispatches a WRITE inline (its gate held until the completion is
/// committed) and then receives a FLUSH, while a flush to the store wants the write gate.
/// `target/mod.rs::dispatch` defers FLUSH to the runtime (`Inner::defer`); the loop thread
/// never waits for the gate.
fn loop_thread_flush(v: Variant) {
    let c = Arc::new(Cache::new(v, [Init::Dirty([1, 1]), Init::Empty]));
    let rt = Arc::new(Runtime::new());
    let l = {
        let rt = Arc::clone(&rt);
        spawn(&c, move |c| {
            let flush = |c: &Cache| {
                if c.v.flush_on_loop {
                    c.flush(); // broken: `Cache::flush` on the loop thread
                } else {
                    rt.defer(Deferred::Flush);
                }
            };
            match dispatch_write(c, 0, Span::Page(0), 2) {
                Some(in_flight) => {
                    flush(c); // the FLUSH arrives while the write is in flight
                    in_flight.complete(c);
                }
                None => {
                    rt.defer(Deferred::Write(0, Span::Page(0), 2));
                    flush(c);
                }
            }
            rt.defer(Deferred::Stop);
        })
    };
    let s = spawn(&c, |c| {
        sync_to_store(c);
    });
    let d = {
        let rt = Arc::clone(&rt);
        spawn(&c, move |c| rt.run(c))
    };
    l.join().unwrap();
    s.join().unwrap();
    d.join().unwrap();
    c.check_final();
}

// ---- the real protocol: every invariant holds ----

#[test]
fn write_races_flush_holds() {
    explore(Variant::default(), WRITE_RACES_FLUSH);
}

#[test]
fn partial_write_of_a_remote_block_races_eviction_holds() {
    explore(
        Variant::default(),
        PARTIAL_WRITE_OF_A_REMOTE_BLOCK_RACES_EVICTION,
    );
}

#[test]
fn reads_race_rotation_and_eviction_hold() {
    explore(Variant::default(), READS_RACE_ROTATION_AND_EVICTION);
}

#[test]
fn cold_read_races_write_and_flush_holds() {
    explore(Variant::default(), COLD_READ_RACES_WRITE_AND_FLUSH);
}

#[test]
fn cold_read_races_flush_and_eviction_holds() {
    explore(Variant::default(), COLD_READ_RACES_FLUSH_AND_EVICTION);
}

#[test]
fn loop_thread_flush_holds() {
    explore(Variant::default(), LOOP_THREAD_FLUSH);
}

// ---- broken protocols: loom must find the violation ----

/// No promotion: a partial write to a Syncing block leaves the rest of the block as the
/// fresh active file's zeros.
#[test]
#[should_panic(expected = "stale read")]
fn without_promote_before_write_a_read_sees_zeros() {
    let v = Variant {
        promote: Promote::Skip,
        ..Variant::default()
    };
    explore(v, WRITE_RACES_FLUSH);
}

/// Promotion after the data landed: the old bytes overwrite the new ones (the write is
/// rolled back).
#[test]
#[should_panic(expected = "stale read")]
fn promote_after_the_data_rolls_the_write_back() {
    let v = Variant {
        promote: Promote::AfterData,
        ..Variant::default()
    };
    explore(v, WRITE_RACES_FLUSH);
}

/// `complete_flush` without the Syncing check turns a block written during the upload back
/// into its uploaded (older) version.
#[test]
#[should_panic(expected = "lost write")]
fn complete_flush_without_the_state_check_loses_a_write() {
    let v = Variant {
        faults: Faults {
            complete_unchecked: true,
            ..Faults::default()
        },
        ..Variant::default()
    };
    explore(v, WRITE_RACES_FLUSH);
}

/// A plan executed under another gate: a rotation (fresh active file) or an eviction (punched
/// clean block) between planning and reading returns zeros.
#[test]
#[should_panic(expected = "stale read")]
fn a_read_plan_used_under_another_gate_reads_zeros() {
    let v = Variant {
        stale_plan: true,
        ..Variant::default()
    };
    explore(v, READS_RACE_ROTATION_AND_EVICTION);
}

/// A fill that does not check NotPresent stores the fetched (older) bytes as Clean over a
/// block that was written meanwhile.
#[test]
#[should_panic(expected = "lost write")]
fn fill_without_the_state_check_clobbers_a_write() {
    let v = Variant {
        faults: Faults {
            fill: FillChecks::EpochOnly,
            ..Faults::default()
        },
        ..Variant::default()
    };
    explore(v, COLD_READ_RACES_WRITE_AND_FLUSH);
}

/// Cold-read bytes staged in the active file clobber a concurrent write of the block.
#[test]
#[should_panic(expected = "lost write")]
fn cold_read_staged_in_the_active_file_clobbers_a_write() {
    let v = Variant {
        stage_in_active: true,
        ..Variant::default()
    };
    explore(v, COLD_READ_RACES_WRITE_AND_FLUSH);
}

/// A fill that ignores the epoch stores a version fetched before the block was rewritten,
/// flushed and evicted.
#[test]
#[should_panic(expected = "lost write")]
fn fill_without_the_epoch_check_resurrects_an_old_version() {
    let v = Variant {
        faults: Faults {
            fill: FillChecks::StateOnly,
            ..Faults::default()
        },
        ..Variant::default()
    };
    explore(v, COLD_READ_RACES_FLUSH_AND_EVICTION);
}

/// A fill that ignores NO_FILL lands before the eviction's hole punch: the block is Clean
/// over a hole.
#[test]
#[should_panic(expected = "stale read")]
fn fill_without_the_no_fill_check_is_punched_away() {
    let v = Variant {
        faults: Faults {
            fill: FillChecks::EpochAndNotPresent,
            ..Faults::default()
        },
        ..Variant::default()
    };
    explore(v, COLD_READ_RACES_FLUSH_AND_EVICTION);
}

/// FLUSH taking the gate on the loop thread while that thread holds an in-flight write's
/// gate, with a rotation queued on the fair lock: every thread waits.
#[test]
#[should_panic(expected = "deadlock")]
fn flush_on_the_loop_thread_deadlocks_behind_a_queued_rotation() {
    let v = Variant {
        flush_on_loop: true,
        ..Variant::default()
    };
    explore(v, LOOP_THREAD_FLUSH);
}

// ---- liveness: a partial write racing an eviction settles ----

/// A partial write of a remote-only block whose eviction sits between its write gate and its
/// hole punch (NO_FILL set; the real `evict_to` also syncs the data files and the WAL in that
/// window): the fill of every fetch is refused until the punch ends. The write waits for the
/// eviction (`Volume::fetch_for_write`), so it settles within its attempts. This model found
/// the gap: the write used to retry at once and fail with -EIO (next test); the volume test
/// `volume_races::a_partial_write_during_an_eviction_waits_for_it` shows it on the real code.
#[test]
fn a_partial_write_during_an_eviction_settles() {
    let v = Variant {
        eio_is_failure: true,
        ..Variant::default()
    };
    explore(v, PARTIAL_WRITE_OF_A_REMOTE_BLOCK_RACES_EVICTION);
}

/// The old retry loop: fetch, refused fill, retry at once, out of attempts: -EIO.
#[test]
#[should_panic(expected = "write did not settle")]
fn retrying_at_once_during_an_eviction_fails_with_eio() {
    let v = Variant {
        eio_is_failure: true,
        retry_at_once: true,
        ..Variant::default()
    };
    explore(v, PARTIAL_WRITE_OF_A_REMOTE_BLOCK_RACES_EVICTION);
}
