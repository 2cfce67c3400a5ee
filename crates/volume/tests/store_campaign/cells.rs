//! One cell of the store fault campaign: set up a volume without faults, arm the fault, run
//! the phase, lift the fault, check the invariant (see `volume_store_campaign.rs`).

use std::sync::Arc;
use std::time::Duration;

use glidefs_objstore::{StoreConfig, VolumeStore};
use glidefs_testkit::{pattern, Op};
use glidefs_volume::Volume;

use super::*;

/// What one cell saw.
#[derive(Debug)]
pub struct Outcome {
    pub fired: u64,
    /// Calls the phase made, per target (pack PUTs told from manifest PUTs by a probe).
    pub calls: [u64; TARGETS.len()],
    pub phase_error: Option<String>,
    pub invariant: Result<(), String>,
}

/// Published generations 1 (every block), 2 (every block again: generation 1's packs are
/// garbage) and 3 (some pages).
pub async fn setup(v: &Volume, oracle: &mut Oracle) -> Result<(), String> {
    for generation in 1..=2 {
        for b in 0..BLOCKS {
            write_block(v, oracle, b, generation).await?;
        }
        v.sync_to_store().await.map_err(|e| e.to_string())?;
    }
    for page in (0..PAGES).step_by(3 * PAGES_PER_BLOCK) {
        write_page(v, oracle, page, 3).await?;
    }
    write_block(v, oracle, 1, 3).await?;
    v.sync_to_store().await.map_err(|e| e.to_string())?;
    Ok(())
}

/// Dirty writes of generation 4: the second page of every other block.
pub async fn dirty(v: &Volume, oracle: &mut Oracle) -> Result<(), String> {
    for b in (0..BLOCKS).step_by(2) {
        write_page(v, oracle, b as usize * PAGES_PER_BLOCK + 1, 4).await?;
    }
    Ok(())
}

/// Races `phase` against the first held call; on a hold, runs `meanwhile`, then releases.
/// Returns the phase's result.
pub async fn with_hold<T: Send + 'static>(
    env: &Env,
    phase: tokio::task::JoinHandle<T>,
    meanwhile: impl std::future::Future<Output = Result<(), String>>,
) -> Result<T, String> {
    let mut phase = phase;
    let plan = env.plan.clone();
    tokio::select! {
        r = &mut phase => return r.map_err(|e| format!("phase task: {e}")),
        _ = plan.wait_held(1) => {}
    }
    let during = meanwhile.await;
    env.plan.release_held();
    let r = phase.await.map_err(|e| format!("phase task: {e}"))?;
    during.map(|()| r)
}

/// Runs one cell on `env`.
pub async fn run_cell(env: Env, phase: Phase, target: Option<Target>, kind: Kind) -> Outcome {
    let mut oracle = Oracle::new();
    let budget = if phase == Phase::Evict {
        EVICT_BUDGET
    } else {
        u64::MAX
    };
    let prepared = async {
        let v = env.open(budget).await?;
        setup(&v, &mut oracle).await?;
        match phase {
            Phase::Flush | Phase::Gc => dirty(&v, &mut oracle).await?,
            Phase::Open => {
                dirty(&v, &mut oracle).await?;
                v.flush().await.map_err(|e| e.to_string())?;
                v.close().await.map_err(|e| e.to_string())?;
            }
            Phase::ColdRead | Phase::Evict => {
                v.evict_to(0).await.map_err(|e| e.to_string())?;
            }
        }
        Ok::<_, String>(v)
    }
    .await;
    let v = match prepared {
        Ok(v) => v,
        Err(e) => {
            return Outcome {
                fired: 0,
                calls: [0; TARGETS.len()],
                phase_error: None,
                invariant: Err(format!("setup without faults failed: {e}")),
            }
        }
    };
    let v = if phase == Phase::Open {
        drop(v);
        None
    } else {
        Some(v)
    };

    let fired_before = env.plan.faults_fired();
    let ops = [Op::Put, Op::Get, Op::List, Op::Delete, Op::Head];
    let calls_before = ops.map(|op| env.plan.calls(op));
    kind.arm(&env.plan, target);
    let (v, phase_error) = run_phase(&env, phase, kind, v, &mut oracle).await;
    let fired = env.plan.faults_fired() - fired_before;
    let v = match v {
        Some(v) if kind == Kind::LostThenRestart => {
            v.kill().await;
            None
        }
        v => v,
    };
    let [put, get, list, delete, head] = {
        let mut i = 0;
        ops.map(|op| {
            i += 1;
            env.plan.calls(op) - calls_before[i - 1]
        })
    };
    // Only the probe's rule marks pack PUTs; elsewhere they count with manifest PUTs.
    let packs = if kind == Kind::Probe { fired } else { put };
    let calls = [packs, put - packs.min(put), get, list, delete, head];
    env.lift();
    let invariant = check_invariant(&env, v, &mut oracle).await;
    Outcome {
        fired,
        calls,
        phase_error,
        invariant,
    }
}

/// Runs the phase under the armed fault: returns the volume (when open) and the phase's
/// error, if it failed. Data read during the phase is checked at once (a read that returns
/// must return acknowledged data even under faults): such a mismatch is returned as the
/// phase error prefixed with `WRONG DATA`.
pub async fn run_phase(
    env: &Env,
    phase: Phase,
    kind: Kind,
    v: Option<Arc<Volume>>,
    oracle: &mut Oracle,
) -> (Option<Arc<Volume>>, Option<String>) {
    let hold = kind == Kind::Hold;
    match phase {
        Phase::Open => match env.open(u64::MAX).await {
            Ok(v) => (Some(v), None),
            Err(e) => (None, Some(e)),
        },
        Phase::Flush => {
            let v = v.expect("open");
            let task = {
                let v = v.clone();
                tokio::spawn(async move {
                    v.sync_to_store()
                        .await
                        .map(|_| ())
                        .map_err(|e| e.to_string())
                })
            };
            (Some(v), flush_under(env, task, hold).await.err())
        }
        Phase::ColdRead => {
            let v = v.expect("open");
            let r = if hold {
                cold_read_race(env, &v, oracle).await
            } else {
                cold_reads(&v, oracle).await
            };
            (Some(v), r.err())
        }
        Phase::Evict => {
            let v = v.expect("open");
            let r = if hold {
                evict_write_race(env, &v, oracle).await
            } else {
                evict_writes(env, &v, oracle, false).await
            };
            (Some(v), r.err())
        }
        Phase::Gc => {
            let v = v.expect("open");
            let task = tokio::spawn(gc_pass(env.store.clone()));
            let r = if hold {
                // The volume flushes while the GC pass hangs.
                let v2 = v.clone();
                with_hold(env, task, async move {
                    v2.sync_to_store()
                        .await
                        .map(|_| ())
                        .map_err(|e| format!("flush during the gc pass: {e}"))
                })
                .await
            } else {
                task.await.map_err(|e| e.to_string())
            };
            (Some(v), r.and_then(|r| r.map(|_| ())).err())
        }
    }
}

/// Lets everything that can run finish: with paused time a sleep ends only once every other
/// task waits (on a held call, say) and no blocking work is in flight.
pub async fn settle() {
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Awaits a flush task; with a hold, runs a GC pass while the flush's call hangs (an upload
/// or publish that takes longer than the GC grace), after the flush's other calls are done.
pub async fn flush_under(
    env: &Env,
    task: tokio::task::JoinHandle<Result<(), String>>,
    hold: bool,
) -> Result<(), String> {
    if !hold {
        return task.await.map_err(|e| e.to_string())?;
    }
    let raw = env.raw.clone();
    with_hold(env, task, async move {
        settle().await;
        gc_pass(raw).await.map(|_| ())
    })
    .await?
}

/// Sequential reads of two half blocks each (a stream: readahead fetches runs), then the
/// whole volume.
pub async fn cold_reads(v: &Volume, oracle: &mut Oracle) -> Result<(), String> {
    let half = PAGES_PER_BLOCK / 2;
    let mut first_error = None;
    for first in (0..PAGES).step_by(half) {
        match read_range(v, first, half).await {
            Ok(buf) => oracle
                .check(first, &buf, "cold read under the fault")
                .map_err(|e| format!("WRONG DATA {e}"))?,
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match read_range(v, 0, PAGES).await {
        Ok(buf) => oracle
            .check(0, &buf, "whole cold read under the fault")
            .map_err(|e| format!("WRONG DATA {e}"))?,
        Err(e) => {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Read R1 of block 0 hangs in its GET; meanwhile block 0 is rewritten (generation 7),
/// flushed and evicted, and read R2 starts; then R1's GET goes on. R2 began after the write
/// completed: it must return generation 7.
pub async fn cold_read_race(env: &Env, v: &Arc<Volume>, oracle: &mut Oracle) -> Result<(), String> {
    let block_pages = PAGES_PER_BLOCK;
    let r1 = {
        let v = v.clone();
        tokio::spawn(async move { read_range(&v, 0, block_pages).await })
    };
    let mut r1 = r1;
    let plan = env.plan.clone();
    tokio::select! {
        r = &mut r1 => {
            // Never held (the target is not a GET).
            let buf = r.map_err(|e| e.to_string())??;
            return oracle.check(0, &buf, "cold read").map_err(|e| format!("WRONG DATA {e}"));
        }
        _ = plan.wait_held(1) => {}
    }
    let before = oracle.clone();
    write_block(v, oracle, 0, 7).await?;
    v.sync_to_store().await.map_err(|e| e.to_string())?;
    v.evict_to(0).await.map_err(|e| e.to_string())?;
    let r2 = {
        let v = v.clone();
        tokio::spawn(async move { read_range(&v, 0, block_pages).await })
    };
    // Let R2 reach the fetcher before R1's GET goes on.
    settle().await;
    env.plan.release_held();
    let b1 = r1.await.map_err(|e| e.to_string())??;
    let b2 = r2.await.map_err(|e| e.to_string())??;
    // R1 overlapped the write: old or new.
    let mut either = oracle.clone();
    for p in 0..block_pages {
        for &g in &before.0[p] {
            either.maybe(p, g);
        }
    }
    either
        .check(0, &b1, "read R1 (concurrent with the rewrite)")
        .map_err(|e| format!("WRONG DATA {e}"))?;
    oracle
        .check(
            0,
            &b2,
            "read R2 (began after the rewrite was flushed and evicted)",
        )
        .map_err(|e| format!("WRONG DATA {e}"))
}

/// Partial writes into every (evicted) block, then a flush that evicts under the budget
/// (with a hold: see `flush_under`).
pub async fn evict_writes(
    env: &Env,
    v: &Arc<Volume>,
    oracle: &mut Oracle,
    hold: bool,
) -> Result<(), String> {
    let mut first_error = None;
    for b in 0..BLOCKS as usize {
        if let Err(e) = write_page(v, oracle, b * PAGES_PER_BLOCK + 2, 5).await {
            first_error.get_or_insert(e);
        }
    }
    let task = {
        let v = v.clone();
        tokio::spawn(async move {
            v.sync_to_store()
                .await
                .map(|_| ())
                .map_err(|e| format!("flush: {e}"))
        })
    };
    if let Err(e) = flush_under(env, task, hold).await {
        first_error.get_or_insert(e);
    }
    first_error.map_or(Ok(()), Err)
}

/// Partial write W1 into evicted block 2 hangs in its GET; meanwhile W2 rewrites the block
/// whole (generation 9); then W1 goes on. Either order is a valid outcome for page 0 of the
/// block, the rest is generation 9. Then `evict_writes`, whose flush a hold on another call
/// hits.
pub async fn evict_write_race(
    env: &Env,
    v: &Arc<Volume>,
    oracle: &mut Oracle,
) -> Result<(), String> {
    let page = 2 * PAGES_PER_BLOCK;
    let w1 = {
        let v = v.clone();
        let data = pattern((page * PAGE) as u64, 8, PAGE);
        tokio::spawn(async move { v.write((page * PAGE) as u64, &data).await })
    };
    let mut w1 = w1;
    let plan = env.plan.clone();
    let held = tokio::select! {
        r = &mut w1 => Some(r),
        _ = plan.wait_held(1) => None,
    };
    let w1_result = match held {
        Some(r) => r.map_err(|e| e.to_string())?,
        None => {
            write_block(v, oracle, 2, 9).await?;
            env.plan.release_held();
            w1.await.map_err(|e| e.to_string())?
        }
    };
    match w1_result {
        Ok(()) => oracle.maybe(page, 8),
        Err(e) => return Err(format!("partial write W1: {e}")),
    }
    // A hold on another call hits this flush (as in the `flush` phase).
    evict_writes(env, v, oracle, true).await
}

/// The invariant after the fault was lifted (see the module docs).
pub async fn check_invariant(
    env: &Env,
    v: Option<Arc<Volume>>,
    oracle: &mut Oracle,
) -> Result<(), String> {
    let v = match v {
        Some(v) => v,
        None => env
            .open(u64::MAX)
            .await
            .map_err(|e| format!("open after the store came back: {e}"))?,
    };
    if let Some(f) = v.fenced() {
        return Err(format!("fenced itself: {f}"));
    }
    check_all(&v, oracle, "hot read after the fault").await?;
    v.sync_to_store()
        .await
        .map_err(|e| format!("flush after the store came back: {e}"))?;
    let stats = v.stats().await.cache;
    if stats.dirty + stats.syncing != 0 {
        return Err(format!(
            "flush after the store came back left dirty={} syncing={}",
            stats.dirty, stats.syncing
        ));
    }
    let vs = VolumeStore::new(env.raw.clone(), NAME, StoreConfig::default()).unwrap();
    let m = vs
        .load_manifest()
        .await
        .map_err(|e| format!("load manifest: {e}"))?
        .ok_or("no manifest after a flush")?;
    for id in m.referenced_packs() {
        if !vs.pack_exists(id).await.map_err(|e| e.to_string())? {
            return Err(format!("manifest {} names missing pack {id}", m.generation));
        }
    }
    v.evict_to(0).await.map_err(|e| e.to_string())?;
    check_all(&v, oracle, "cold read after the fault").await?;
    v.close().await.map_err(|e| format!("close: {e}"))?;
    drop(v);
    let v = env
        .open(u64::MAX)
        .await
        .map_err(|e| format!("reopen of the cache: {e}"))?;
    if let Some(f) = v.fenced() {
        return Err(format!("reopened cache is fenced: {f}"));
    }
    check_all(&v, oracle, "reopened cache").await?;
    v.close().await.map_err(|e| format!("close: {e}"))?;
    drop(v);
    let fresh = cache_dir();
    let v = Volume::open(env.config(fresh.path(), None, u64::MAX), env.raw.clone())
        .await
        .map_err(|e| format!("open from the store in a fresh cache: {e}"))?;
    check_all(&v, oracle, "fresh cache").await
}
