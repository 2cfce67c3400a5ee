//! Warm sets (`glidefs_objstore::WarmSet`): record the blocks a volume reads first, and fetch
//! a recorded set ahead of the guest when a volume (or a clone of it) attaches.
//!
//! Recording ([`Volume::record_warm_set`](crate::Volume::record_warm_set)): from the call on,
//! every read the volume is told of (`Volume::note_read`: each READ of the ublk target, before
//! it is served, hit or miss) adds its blocks to a [`Recorder`], each block once, in the order
//! first read, until the window ends or the set holds its most blocks; then the set is stored
//! beside the manifests (one PUT, replacing the volume's set). The recorder is lock-free (a
//! set of the blocks seen, sized by the blocks it keeps, and a slot array claimed with one
//! `fetch_add`), as the queue loop threads call it on every READ; with no recording running
//! a READ pays one relaxed load.
//! One recording at a time per volume.
//!
//! Warming ([`Volume::warm`](crate::Volume::warm)): the stored set's blocks that are cold now
//! (`NotPresent` and in the store: never a block written here, whose state is Dirty or later
//! Clean) are looked up in the manifest, sorted in packs' order (pack, then offset: frames
//! back to back in a pack come in one ranged GET of at most `MAX_RUN_BLOCKS` blocks) and
//! fetched through the fetcher, as readahead is (same fill token, same fill: a block written
//! while its fetch is in flight is not overwritten, see `fetch`), within a byte budget, with
//! at most `gets` GETs in flight, so the guest's own cold reads always find the store's
//! connections free beside them. A guest read of a block being warmed joins its fetch; one
//! of a block not started yet fetches it itself (and the warm skips it when its turn comes).
//! Ordering and the budget are per wave of `gets` runs: each wave looks again at which
//! blocks are still cold (the manifest's read lock is taken per lookup, as a fetch takes it).
//! A block whose fill was refused (the fill epoch moved: a flush completed, a block was
//! evicted) is fetched once more in a second pass.
//!
//! Neither changes what a read returns: the set is a hint (see `glidefs_objstore::warmset`).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_cache::BlockState;
use glidefs_objstore::{BlockLocation, WarmSet, MAX_WARM_BLOCKS};
use parking_lot::{Mutex, RwLock};

use crate::error::{Result, VolumeError};
use crate::fetch::{Fetcher, MAX_RUN_BLOCKS};
use crate::shared::Shared;

/// Longest recording window.
pub const MAX_WARM_WINDOW: Duration = Duration::from_secs(3600);

/// What a recording keeps (see [`crate::Volume::record_warm_set`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordOptions {
    /// How long it records, from the call (1 s ..= [`MAX_WARM_WINDOW`]).
    pub window: Duration,
    /// It ends earlier once it holds this many blocks (1 ..= `MAX_WARM_BLOCKS`).
    pub max_blocks: usize,
}

impl RecordOptions {
    /// Why these options are refused, if they are.
    pub fn check(&self) -> Result<(), String> {
        if self.window < Duration::from_secs(1) || self.window > MAX_WARM_WINDOW {
            return Err(format!(
                "a warm-set recording window of {:?} (it takes 1 s to {} s)",
                self.window,
                MAX_WARM_WINDOW.as_secs()
            ));
        }
        if self.max_blocks == 0 || self.max_blocks > MAX_WARM_BLOCKS {
            return Err(format!(
                "a warm set of at most {} blocks (it takes 1 to {MAX_WARM_BLOCKS})",
                self.max_blocks
            ));
        }
        Ok(())
    }
}

/// The blocks read during one recording, each once, in first-read order (lock-free).
///
/// Its memory is bounded by the blocks it keeps, not by the volume (a 256 TiB volume of 4 KiB
/// blocks has 2^36 of them; found by review: a bitmap of the volume cost 8 GiB there): the
/// blocks seen are an open-addressing set of `block + 1` in at least twice as many slots as
/// it keeps, inserted with one CAS and linear probing; it never fills, as no block is added
/// once `max_blocks` were claimed (concurrent readers overshoot by at most one each).
#[derive(Debug)]
pub(crate) struct Recorder {
    /// The set of blocks seen: `block + 1` per slot (0: free).
    seen: Box<[AtomicU64]>,
    /// `block + 1` per slot, in the order claimed (0: claimed, not stored yet, or free).
    order: Box<[AtomicU64]>,
    /// Slots claimed (may pass `order.len()`: those claims found the recorder full).
    claimed: AtomicUsize,
    blocks: u64,
    started: Instant,
    window: Duration,
}

impl Recorder {
    pub(crate) fn new(blocks: u64, opts: RecordOptions) -> Self {
        let slots = (opts.max_blocks.max(1) * 2).next_power_of_two();
        Self {
            seen: (0..slots).map(|_| AtomicU64::new(0)).collect(),
            order: (0..opts.max_blocks).map(|_| AtomicU64::new(0)).collect(),
            claimed: AtomicUsize::new(0),
            blocks,
            started: Instant::now(),
            window: opts.window,
        }
    }

    /// Adds `block` to the blocks seen; whether it is new.
    fn first_sight(&self, block: u64) -> bool {
        let key = block + 1;
        let mask = self.seen.len() - 1;
        // Fibonacci hashing: consecutive blocks land far apart.
        let mut i = (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20) as usize & mask;
        for _ in 0..self.seen.len() {
            match self.seen[i].compare_exchange(0, key, Relaxed, Relaxed) {
                Ok(_) => return true,
                Err(k) if k == key => return false,
                Err(_) => i = (i + 1) & mask,
            }
        }
        false
    }

    /// Notes a read of blocks `first..=last`.
    pub(crate) fn note(&self, first: u64, last: u64) {
        for b in first..=last.min(self.blocks.saturating_sub(1)) {
            if self.claimed.load(Relaxed) >= self.order.len() {
                return;
            }
            if !self.first_sight(b) {
                continue;
            }
            let slot = self.claimed.fetch_add(1, Relaxed);
            match self.order.get(slot) {
                Some(s) => s.store(b + 1, Relaxed),
                None => return,
            }
        }
    }

    /// Whether the recording is over: its window passed or it holds its most blocks.
    pub(crate) fn done(&self) -> bool {
        self.claimed.load(Relaxed) >= self.order.len() || self.started.elapsed() >= self.window
    }

    /// Blocks recorded so far.
    pub(crate) fn len(&self) -> usize {
        self.claimed.load(Relaxed).min(self.order.len())
    }

    /// The blocks recorded, in first-read order (a slot claimed by a read still storing it is
    /// left out).
    pub(crate) fn blocks(&self) -> Vec<u64> {
        self.order[..self.len()]
            .iter()
            .map(|s| s.load(Relaxed))
            .filter(|&b| b != 0)
            .map(|b| b - 1)
            .collect()
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// When the window ends, from now.
    pub(crate) fn remaining(&self) -> Duration {
        self.window.saturating_sub(self.started.elapsed())
    }
}

/// What one warm did (see [`crate::Volume::warm`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmReport {
    /// Blocks the stored set names (0: no set, or one of another block size).
    pub set_blocks: u64,
    /// Of those, blocks that were already here (written or cached), fetched meanwhile by
    /// the guest, named twice or past the volume's end: not fetched by the warm.
    pub skipped: u64,
    /// Blocks the warm fetched.
    pub fetched_blocks: u64,
    /// Bytes it fetched (stored frames: what the GETs moved).
    pub fetched_bytes: u64,
    /// Ranged GETs it made.
    pub gets: u64,
    /// Blocks left out because the byte budget was spent.
    pub over_budget: u64,
    /// Blocks whose fetch failed, or whose fill was refused twice (a flush completed or a
    /// block was evicted meanwhile): the guest's own read fetches them again.
    pub failed: u64,
    /// How long it took, in milliseconds.
    pub took_ms: u64,
    /// Why the warm stopped early or did nothing, if it did.
    pub note: Option<String>,
}

/// A recording in progress, as shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordingStatus {
    /// Blocks recorded so far.
    pub blocks: u64,
    /// Seconds since it started.
    pub elapsed_secs: u64,
    /// Seconds until its window ends.
    pub remaining_secs: u64,
    /// The most blocks it keeps.
    pub max_blocks: u64,
}

/// The outcome of the last recording.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedStatus {
    /// Blocks stored (0 when the store refused the set: see `error`).
    pub blocks: u64,
    /// Why the set could not be stored, if it could not.
    pub error: Option<String>,
}

/// A volume's warm-set state (in `Shared`).
#[derive(Debug, Default)]
pub(crate) struct WarmState {
    /// Set while a recording runs: the only thing a READ looks at otherwise.
    pub(crate) recording: AtomicBool,
    pub(crate) recorder: RwLock<Option<Arc<Recorder>>>,
    pub(crate) last_recording: Mutex<Option<RecordedStatus>>,
    pub(crate) last_warm: Mutex<Option<WarmReport>>,
    /// The warm running, if one is (aborted by `close` and `kill`).
    pub(crate) warming: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The recording's task, if one runs (aborted by `close` and `kill`).
    pub(crate) recording_task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl WarmState {
    /// Notes a read of blocks `first..=last` in the recording, if one runs (never blocks: a
    /// recorder being installed or taken away misses this read).
    pub(crate) fn note(&self, first: u64, last: u64) {
        if !self.recording.load(Relaxed) {
            return;
        }
        if let Some(guard) = self.recorder.try_read() {
            if let Some(r) = guard.as_ref() {
                r.note(first, last);
            }
        }
    }

    /// The recording in progress, if one is.
    pub(crate) fn recording_status(&self) -> Option<RecordingStatus> {
        let r = self.recorder.read().clone()?;
        Some(RecordingStatus {
            blocks: r.len() as u64,
            elapsed_secs: r.elapsed().as_secs(),
            remaining_secs: r.remaining().as_secs(),
            max_blocks: r.order.len() as u64,
        })
    }

    /// Aborts the warm and the recording in progress, if any (nothing is stored).
    pub(crate) fn stop(&self) {
        self.recording.store(false, Relaxed);
        self.recorder.write().take();
        for task in [
            self.warming.lock().take(),
            self.recording_task.lock().take(),
        ]
        .into_iter()
        .flatten()
        {
            task.abort();
        }
    }
}

/// Builds the set a finished recording stores.
pub(crate) fn finished_set(r: &Recorder, block_size: u32) -> WarmSet {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    WarmSet::new(block_size, now, r.elapsed().as_secs(), r.blocks())
}

/// All a volume says of its warm set besides the set itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmStatus {
    /// The recording in progress, if one is.
    pub recording: Option<RecordingStatus>,
    /// How the last recording of this handle ended, if one did.
    pub last_recording: Option<RecordedStatus>,
    /// Whether a warm runs now.
    pub warming: bool,
    /// What the last warm of this handle did, once it finished.
    pub last_warm: Option<WarmReport>,
}

/// Ends the recording `r` (it is taken away first: later reads are not noted) and stores its
/// set; what happened is also kept as the volume's last recording. Stores nothing when `r`
/// is not the volume's recording any more (a drop took it away: `Volume::drop_warm_set`
/// waits for a store already under way instead) or the volume was closed meanwhile.
pub(crate) async fn store_recording(v: &Shared, r: &Arc<Recorder>) -> Option<RecordedStatus> {
    {
        let mut slot = v.warm.recorder.write();
        if !slot.as_ref().is_some_and(|mine| Arc::ptr_eq(mine, r)) {
            return None;
        }
        v.warm.recording.store(false, Relaxed);
        slot.take();
    }
    if v.is_closed() || v.cache.is_dead() {
        return None;
    }
    let set = finished_set(r, v.cfg.block_size);
    let blocks = set.blocks.len() as u64;
    let status = match v.store.put_warm_set(&set).await {
        Ok(()) => {
            tracing::info!(volume = %v.cfg.name, blocks, window_secs = set.window_secs, "warm set recorded");
            RecordedStatus {
                blocks,
                error: None,
            }
        }
        Err(e) => {
            tracing::warn!(volume = %v.cfg.name, blocks, error = %e, "storing the warm set failed");
            RecordedStatus {
                blocks: 0,
                error: Some(format!(
                    "storing the warm set of {blocks} blocks failed: {e}"
                )),
            }
        }
    };
    *v.warm.last_recording.lock() = Some(status.clone());
    Some(status)
}

/// Warms the volume from its stored set (see the module docs): the report, or why the set
/// could not be read.
pub(crate) async fn warm(v: &Shared, budget: u64, gets: usize) -> Result<WarmReport> {
    let t0 = Instant::now();
    let set = v
        .store
        .warm_set()
        .await
        .map_err(|e| VolumeError::store("get warm set", &v.cfg.name, e))?;
    let mut report = match set {
        None => WarmReport {
            note: Some("the volume has no warm set".into()),
            ..WarmReport::default()
        },
        Some(set) if set.block_size != v.cfg.block_size => WarmReport {
            note: Some(format!(
                "the warm set names blocks of {} bytes, the volume's are {} bytes: not used",
                set.block_size, v.cfg.block_size
            )),
            ..WarmReport::default()
        },
        Some(set) => warm_blocks(&v.fetcher, &set.blocks, budget, gets).await,
    };
    report.took_ms = u64::try_from(t0.elapsed().as_millis()).unwrap_or(u64::MAX);
    tracing::info!(volume = %v.cfg.name, report = ?report, "warm finished");
    Ok(report)
}

/// Fetches the blocks of `blocks` that are cold now, in packs' order, at most `gets` GETs
/// at a time, within `budget` bytes of frames (see the module docs). A block fetched whose
/// fill was refused (a flush completed or a block was evicted meanwhile: the fill epoch
/// moved) is fetched once more in a second pass.
pub(crate) async fn warm_blocks(
    fetcher: &Arc<Fetcher>,
    blocks: &[u64],
    budget: u64,
    gets: usize,
) -> WarmReport {
    let num_blocks = fetcher.cache.geometry().num_blocks();
    // Each block once (a set is stored that way; one from elsewhere may not be).
    let mut unique = std::collections::HashSet::with_capacity(blocks.len());
    let wanted: Vec<u64> = blocks
        .iter()
        .copied()
        .filter(|&b| b < num_blocks && unique.insert(b))
        .collect();
    let mut report = WarmReport {
        set_blocks: blocks.len() as u64,
        skipped: (blocks.len() - wanted.len()) as u64,
        ..WarmReport::default()
    };
    let mut pass = Pass {
        fetcher,
        budget,
        gets: gets.max(1),
        spent: 0,
    };
    let mut order = pass.locate(&wanted, &mut report);
    for second in [false, true] {
        let refused = pass.run(&order, &mut report).await;
        if refused.is_empty() {
            break;
        }
        if second {
            report.failed += refused.len() as u64;
            break;
        }
        order = pass.locate(&refused, &mut report);
    }
    report
}

/// One warm's passes over its blocks (`warm_blocks`).
struct Pass<'a> {
    fetcher: &'a Arc<Fetcher>,
    budget: u64,
    gets: usize,
    /// Bytes of frames fetched so far.
    spent: u64,
}

impl Pass<'_> {
    fn cold(&self, b: u64) -> bool {
        let info = self.fetcher.cache.block_info(b);
        info.state == BlockState::NotPresent && info.remote
    }

    /// Where the manifest names the blocks of `blocks` that are cold now (the others are
    /// counted skipped), in packs' order. One lookup per read lock, as a fetch takes it.
    fn locate(&self, blocks: &[u64], report: &mut WarmReport) -> Vec<(BlockLocation, u64)> {
        let mut order: Vec<(BlockLocation, u64)> = blocks
            .iter()
            .filter(|&&b| self.cold(b))
            .filter_map(|&b| self.fetcher.manifest.read().get(b).cloned().map(|l| (l, b)))
            .collect();
        report.skipped += (blocks.len() - order.len()) as u64;
        order.sort_by(|(a, _), (b, _)| (&a.pack, a.offset).cmp(&(&b.pack, b.offset)));
        order
    }

    /// Fetches `order` in waves of at most `gets` runs; the blocks fetched whose fill was
    /// refused (still cold after their fetch).
    async fn run(&mut self, order: &[(BlockLocation, u64)], report: &mut WarmReport) -> Vec<u64> {
        let mut refused = Vec::new();
        let mut next = 0;
        while next < order.len() {
            // Before the locations are looked up (see `fetch`).
            let token = self.fetcher.cache.fill_token();
            let mut wave: Vec<(u64, BlockLocation)> = Vec::new();
            let (mut runs, mut run_len) = (0, 0);
            while next < order.len() {
                let b = order[next].1;
                let now = self.fetcher.manifest.read().get(b).cloned();
                let Some(loc) = now.filter(|_| self.cold(b)) else {
                    // Written here, fetched by the guest or unmapped since the first look.
                    report.skipped += 1;
                    next += 1;
                    continue;
                };
                let follows = run_len < MAX_RUN_BLOCKS
                    && wave.last().is_some_and(|(_, p)| {
                        p.pack == loc.pack && p.offset + u64::from(p.len) == loc.offset
                    });
                if !follows {
                    if runs == self.gets {
                        break;
                    }
                    runs += 1;
                    run_len = 0;
                }
                if self.spent + u64::from(loc.len) > self.budget {
                    report.over_budget += (order.len() - next) as u64;
                    next = order.len();
                    break;
                }
                self.spent += u64::from(loc.len);
                run_len += 1;
                wave.push((b, loc));
                next += 1;
            }
            let planned = wave.len() as u64;
            let launched = self.fetcher.launch(token, wave);
            let started: u64 = launched.iter().map(|l| l.run.len() as u64).sum();
            // Left out by `launch`: already in flight for the same location (a guest read).
            report.skipped += planned - started;
            report.gets += launched.len() as u64;
            report.fetched_bytes += launched.iter().map(|l| l.bytes).sum::<u64>();
            let outcomes =
                futures::future::join_all(launched.iter().map(|l| l.outcome.clone())).await;
            for (l, outcome) in launched.iter().zip(outcomes) {
                match outcome {
                    Ok(fetched) => {
                        for (b, one) in l.run.iter().zip(fetched) {
                            match one {
                                Err(_) => report.failed += 1,
                                Ok(_) if self.cold(*b) => refused.push(*b),
                                Ok(_) => report.fetched_blocks += 1,
                            }
                        }
                    }
                    Err(_) => report.failed += l.run.len() as u64,
                }
            }
        }
        refused
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(max_blocks: usize) -> RecordOptions {
        RecordOptions {
            window: Duration::from_secs(60),
            max_blocks,
        }
    }

    #[test]
    fn records_each_block_once_in_first_read_order_up_to_its_most() {
        let r = Recorder::new(100, opts(5));
        r.note(7, 8);
        r.note(3, 3);
        r.note(7, 9);
        r.note(99, 120); // past the end: only block 99
        assert_eq!(r.blocks(), vec![7, 8, 3, 9, 99]);
        assert!(r.done(), "full");
        r.note(50, 60);
        assert_eq!(r.blocks(), vec![7, 8, 3, 9, 99]);
        assert_eq!(r.len(), 5);
    }

    #[test]
    fn concurrent_readers_record_every_block_once() {
        let r = Arc::new(Recorder::new(4096, opts(4096)));
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    for i in 0..4096u64 {
                        let b = (i * 7 + t * 13) % 4096;
                        r.note(b, b);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut got = r.blocks();
        assert_eq!(got.len(), 4096);
        got.sort_unstable();
        assert!(got.iter().copied().eq(0..4096));
    }

    #[test]
    fn options_are_checked() {
        assert!(opts(10).check().is_ok());
        let e = opts(0).check().unwrap_err();
        assert!(e.contains("at most 0 blocks"), "{e}");
        let e = opts(MAX_WARM_BLOCKS + 1).check().unwrap_err();
        assert!(e.contains("1 to"), "{e}");
        let e = RecordOptions {
            window: Duration::from_millis(10),
            max_blocks: 1,
        }
        .check()
        .unwrap_err();
        assert!(e.contains("window"), "{e}");
    }

    #[test]
    fn a_state_without_a_recording_notes_nothing() {
        let s = WarmState::default();
        s.note(1, 2);
        assert_eq!(s.recording_status(), None);
        let r = Arc::new(Recorder::new(16, opts(16)));
        *s.recorder.write() = Some(r.clone());
        s.note(1, 2);
        assert!(r.blocks().is_empty(), "the flag is off");
        s.recording.store(true, Relaxed);
        s.note(1, 2);
        assert_eq!(r.blocks(), vec![1, 2]);
        assert_eq!(s.recording_status().unwrap().blocks, 2);
        s.stop();
        s.note(3, 3);
        assert_eq!(r.blocks(), vec![1, 2]);
        assert_eq!(s.recording_status(), None);
    }
}
