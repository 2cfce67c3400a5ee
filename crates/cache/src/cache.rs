//! The cache object: open and recovery, the gate, local durability (FLUSH) and checkpoints.
//!
//! Recovery (`Cache::open`), in order:
//! 1. Load the checkpoint (states, file generations, WAL sequence `S`), or start empty.
//! 2. Replay WAL records after `S` until the first torn one (see `wal`). After a reboot (power
//!    loss, kernel crash: the `boot_id` file names another boot, see `boot`) only the records
//!    a durable `Synced` marker covers are applied: the disk may have persisted a record before
//!    the data it points at (a promotion's copy of a Clean or Syncing block, a write's bytes,
//!    a file's growth). Every write a completed FLUSH acknowledged is covered (the FLUSH's WAL
//!    sync wrote the marker); a dropped record's block keeps its previous version, and a Clean
//!    block a dropped record names becomes NotPresent (fetched again: its clean copy may have
//!    been overwritten by a later staging). In the same boot (a process crash) every record
//!    is applied: the page cache kept all bytes written before the crash.
//! 3. Verify blocks filled since the checkpoint against the CRC in their Fill record (a fill
//!    whose bytes did not reach the disk, or lie past the end of `clean.data` because its
//!    growth did not, becomes NotPresent and is fetched again: never an error).
//! 4. Open the active, flushing and clean files; punch the active file under every block that
//!    is not Dirty (bytes of writes whose record was lost must not resurface under a later
//!    partial write of a never-written block, which assumes zeros around it).
//! 5. Write a fresh checkpoint; only then delete data files nobody references (a rotation
//!    whose record was lost, a flushing file whose FlushDone was replayed: in the same boot
//!    that record may be unsynced, and a power loss before the checkpoint is durable makes the
//!    next recovery drop it and need the file again); delete the old WAL segments, store the
//!    boot id, start a new segment. Doing this before any new record is appended guarantees
//!    that a torn tail can never hide later records.
//!
//! The state a reader sees after recovery is the state of the last durable record; every
//! record a completed `flush()` covered is durable, so every acknowledged write survives.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use crate::checkpoint::Checkpoint;
use crate::crash::{CrashHook, CrashPoint, IoOp, NoCrash};
use crate::crcs::{Epochs, PageCrcs};
use crate::error::{CacheError, Result};
#[cfg(test)]
use crate::files::test_inode;
use crate::files::{cover_block, data_path, open_data_file, read_whole};
use crate::gate::{Files, Gate, GateHolds, Holder, RotationGate, WriteGate};
use crate::geometry::{Geometry, LiveGeometry};
use crate::rotation::Rotation;
use crate::state::{BlockInfo, BlockState, FillEpoch, StateMap, Stripes, REMOTE, ROTATED};
use crate::wal::{self, Record, Wal};

pub(crate) use crate::state::STRIPES;
const CLEAN_FILE: &str = "clean.data";

/// Options of [`Cache::open`].
#[derive(Debug, Clone)]
pub struct CacheOptions {
    /// Crash injection (tests); [`NoCrash`] in production.
    pub crash_hook: Arc<dyn CrashHook>,
}

impl Default for CacheOptions {
    fn default() -> Self {
        Self {
            crash_hook: Arc::new(NoCrash),
        }
    }
}

/// Counts of blocks per state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub not_present: u64,
    pub clean: u64,
    pub dirty: u64,
    pub syncing: u64,
    pub remote: u64,
    /// The cache is degraded: an I/O error on its files (full or failing disk) left WAL
    /// records or space-freeing cleanups behind; see [`Cache::degraded`] for the reason.
    pub degraded: bool,
}

/// Memory held by the in-memory maps of a cache (see the cost model in docs/engine/cost.md).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheMemory {
    /// State-map leaves allocated (4096 blocks, 4 KiB each).
    pub state_leaves: u64,
    /// Heap bytes of the state map (top table, mids, leaves, dirty list).
    pub state_bytes: u64,
    /// Chunks of known page CRCs held (32 pages each), active and flushing file.
    pub crc_chunks: u64,
    /// Heap bytes of the CRC stores, approximately.
    pub crc_bytes: u64,
}

/// The local write cache of one volume. Share it as `Arc<Cache>`.
#[derive(Debug)]
pub struct Cache {
    pub(crate) dir: PathBuf,
    /// Block size and volume size; the size grows with `grow` (see the `grow` module).
    pub(crate) shape: LiveGeometry,
    pub(crate) gate: RotationGate,
    pub(crate) states: StateMap,
    /// Non-exclusive write epochs per stripe (see `crcs`).
    pub(crate) epochs: Epochs,
    pub(crate) wal: Wal,
    pub(crate) stripes: Stripes,
    /// The clean file (also `Files::clean`; it never changes). Fills write it without the
    /// gate, under the block's stripe lock (see `evict`).
    pub(crate) clean: Arc<File>,
    pub(crate) hook: Arc<dyn CrashHook>,
    /// Latched by `die`. Shared with write tickets: one dropped uncommitted touches no file
    /// once it is set (see `write`).
    pub(crate) dead: Arc<AtomicBool>,
    /// Set by an I/O error, cleared by a sync that leaves nothing behind (see `space`).
    pub(crate) degraded: AtomicBool,
    pub(crate) last_io_error: Mutex<Option<String>>,
    /// Cleanups waiting for their WAL records to be durable (see `space`).
    pub(crate) deferred: Mutex<crate::files::Deferred>,
    /// Set once by `fence`: writes and rotations are refused, reads go on.
    fenced: OnceLock<String>,
    /// Bumped by eviction and flush completion; a fill fetched under an older epoch is dropped.
    pub(crate) epoch: FillEpoch,
    pub(crate) pending: Mutex<Option<Arc<Rotation>>>,
    /// Serialises rotate / complete_flush / evict / checkpoint (the slow, write-gate paths).
    pub(crate) admin: Mutex<()>,
    pub(crate) clock_hand: AtomicU64,
    /// WAL sequence covered by the last checkpoint.
    checkpoint_seq: AtomicU64,
    /// Unit tests: inode numbers of the data files `sync_files` synced, in order.
    #[cfg(test)]
    pub(crate) synced_inodes: Mutex<Vec<u64>>,
}

/// Whether a block of these state bits belongs to the pending rotation: Syncing, or promoted
/// to Dirty since (`ROTATED`, see `state`).
fn in_rotation(bits: u8) -> bool {
    bits & ROTATED != 0 || BlockInfo::from_bits(bits).state == BlockState::Syncing
}

/// What replay tracks besides the state map.
#[derive(Debug)]
struct Replay {
    active_gen: u64,
    flushing_gen: Option<u64>,
    /// Blocks moved to Syncing (by the checkpoint or a Rotate record) and not completed.
    syncing: Vec<u64>,
    /// Blocks filled since the checkpoint, with the CRC of their Fill record.
    fills: Vec<(u64, u32)>,
    /// Syncing blocks the next FlushDone leaves NotPresent (their staging failed).
    unstaged: std::collections::HashSet<u64>,
    /// Blocks the next FlushDone leaves NotPresent without a remote copy (published unmapped).
    unmapped: std::collections::HashSet<u64>,
}

/// Applies one replayed record to the (not yet shared) state map. O(blocks it names): a
/// Rotate takes the map's dirty set, a FlushDone the blocks the last Rotate moved.
fn apply(rec: Record, states: &StateMap, r: &mut Replay) {
    let len = states.len();
    let state_of = |b: u64| states.get(b).state;
    match rec {
        Record::Dirty { first, count } => {
            let end = first.saturating_add(u64::from(count));
            for b in first..end.min(len) {
                states.set_state(b, BlockState::Dirty);
            }
            r.fills.retain(|(b, _)| !(first..end).contains(b));
        }
        Record::Rotate { new_gen } => {
            for b in states.take_dirty() {
                if state_of(b) == BlockState::Dirty {
                    states.change(b, BlockState::Syncing, ROTATED, 0);
                    r.syncing.push(b);
                }
            }
            r.flushing_gen = Some(r.active_gen);
            r.active_gen = new_gen;
        }
        Record::FlushDone { .. } => {
            let unstaged = std::mem::take(&mut r.unstaged);
            let unmapped = std::mem::take(&mut r.unmapped);
            for b in std::mem::take(&mut r.syncing) {
                states.clear_bits(b, ROTATED);
                if unmapped.contains(&b) {
                    // No pack holds it: never REMOTE, whatever its state now.
                    states.clear_bits(b, REMOTE);
                    if state_of(b) == BlockState::Syncing {
                        states.set_state(b, BlockState::NotPresent);
                    }
                } else if state_of(b) == BlockState::Syncing {
                    let state = if unstaged.contains(&b) {
                        BlockState::NotPresent
                    } else {
                        BlockState::Clean
                    };
                    states.set_bits(b, REMOTE);
                    states.set_state(b, state);
                }
            }
            r.flushing_gen = None;
        }
        Record::Unstaged { block } => {
            r.unstaged.insert(block);
        }
        Record::Unmapped { block } => {
            r.unmapped.insert(block);
        }
        Record::Fill { block, crc } => {
            if block < len && state_of(block) == BlockState::NotPresent {
                states.set_bits(block, REMOTE);
                states.set_state(block, BlockState::Clean);
                r.fills.push((block, crc));
            }
        }
        Record::Evict { block } => {
            if block < len {
                if state_of(block) == BlockState::Clean {
                    states.set_state(block, BlockState::NotPresent);
                }
                r.fills.retain(|(b, _)| *b != block);
            }
        }
        Record::Synced { .. } => {}
    }
}

/// How many of the replayed records (those after checkpoint sequence `cp_seq`) recovery may
/// trust. In the boot that wrote them, all: the page cache kept every byte written before a
/// process crash. After a reboot, only those a durable [`Record::Synced`] marker covers: the
/// data of a later record may not have reached the disk although the record did.
fn trusted_records(records: &[Record], cp_seq: u64, same_boot: bool) -> usize {
    if same_boot {
        return records.len();
    }
    let upto = records
        .iter()
        .filter_map(|r| match r {
            Record::Synced { upto } => Some(*upto),
            _ => None,
        })
        .max()
        .unwrap_or(cp_seq);
    usize::try_from(upto.saturating_sub(cp_seq))
        .unwrap_or(usize::MAX)
        .min(records.len())
}

/// Untrusted records are not applied; in addition every Clean block one of them names loses
/// its local copy: a later flush may have staged newer bytes over that clean copy (unsynced,
/// so now a mix). It is REMOTE: the store holds the trusted version. Dirty and Syncing blocks
/// keep their trusted state: their bytes were synced before the marker that trusts them, and
/// no later write changed them in place (a promotion writes the active file, a later
/// rotation's file is discarded with its record).
fn drop_untrusted(untrusted: &[Record], states: &StateMap, r: &mut Replay) {
    let mut drop_clean = |b: u64| {
        if b < states.len() && states.get(b).state == BlockState::Clean {
            states.set_state(b, BlockState::NotPresent);
            r.fills.retain(|(f, _)| *f != b);
        }
    };
    for rec in untrusted {
        match *rec {
            Record::Dirty { first, count } => {
                let end = first.saturating_add(u64::from(count)).min(states.len());
                (first..end).for_each(&mut drop_clean);
            }
            Record::Fill { block, .. } | Record::Evict { block } => drop_clean(block),
            Record::Rotate { .. }
            | Record::FlushDone { .. }
            | Record::Synced { .. }
            | Record::Unstaged { .. }
            | Record::Unmapped { .. } => {}
        }
    }
}

impl Cache {
    /// Opens (or creates) the cache in `dir` and recovers the acknowledged state.
    pub fn open(dir: &Path, geo: Geometry, opts: CacheOptions) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| CacheError::io("create_dir", dir, e))?;
        let cp = Checkpoint::load(dir, &geo)?;
        let (states, mut replay, seq) = match cp {
            Some(cp) => {
                let states = StateMap::from_runs(geo.num_blocks(), &cp.states);
                // The pending rotation's blocks: marked `ROTATED` (Syncing, or promoted
                // since). A checkpoint from before the mark has only its Syncing ones, which
                // get the mark here (the blocks promoted out of it: see `checkpoint`).
                let syncing: Vec<u64> = cp
                    .states
                    .iter()
                    .filter(|r| in_rotation(r.bits))
                    .flat_map(|r| r.first..r.first + r.count)
                    .collect();
                for &b in &syncing {
                    states.set_bits(b, ROTATED);
                }
                let replay = Replay {
                    active_gen: cp.active_gen,
                    flushing_gen: cp.flushing_gen,
                    syncing,
                    fills: Vec::new(),
                    unstaged: Default::default(),
                    unmapped: Default::default(),
                };
                (states, replay, cp.seq)
            }
            None => {
                let replay = Replay {
                    active_gen: 1,
                    flushing_gen: None,
                    syncing: Vec::new(),
                    fills: Vec::new(),
                    unstaged: Default::default(),
                    unmapped: Default::default(),
                };
                (StateMap::new(geo.num_blocks()), replay, 0)
            }
        };
        let (records, last_seq) = wal::replay(dir, seq)?;
        let boot_id = crate::boot::current();
        let same_boot = crate::boot::same_boot(dir, &boot_id)?;
        let (trusted, untrusted) = records.split_at(trusted_records(&records, seq, same_boot));
        for &rec in trusted {
            apply(rec, &states, &mut replay);
        }
        if !untrusted.is_empty() {
            tracing::warn!(
                dir = %dir.display(),
                dropped = untrusted.len(),
                "reboot since the last open: WAL records no sync covered are dropped"
            );
            drop_untrusted(untrusted, &states, &mut replay);
        }
        let (active_gen, flushing_gen) = (replay.active_gen, replay.flushing_gen);
        let active = open_data_file(&data_path(dir, active_gen))?;
        let flushing = match flushing_gen {
            Some(g) => {
                let p = data_path(dir, g);
                if !p.exists() {
                    return Err(CacheError::Corrupt {
                        path: p,
                        what: "flushing file referenced by the log is missing".into(),
                    });
                }
                Some(Arc::new(open_data_file(&p)?))
            }
            None => None,
        };
        let clean_path = dir.join(CLEAN_FILE);
        let clean = open_data_file(&clean_path)?;
        // Step 3: a Fill record whose bytes are not on disk must not serve garbage.
        let mut buf = vec![0u8; geo.block_size() as usize];
        for &(block, crc) in &replay.fills {
            // A fill past the end of the file (its growth never reached the disk) fails
            // verification like one whose bytes are wrong: the block is remote, so it is
            // simply fetched again.
            let whole = read_whole(&clean, &mut buf, block * geo.bs())
                .map_err(|e| CacheError::io("pread", &clean_path, e))?;
            if !whole || crc32c::crc32c(&buf) != crc {
                tracing::warn!(
                    block,
                    "filled block failed verification on recovery; dropping it"
                );
                states.set_state(block, BlockState::NotPresent);
            }
        }
        // A Dirty or Syncing block past the end of its file means the filesystem lost synced
        // bytes; they read as zeros rather than failing every read and flush of the volume.
        let bs = geo.bs();
        cover_block(
            &active,
            &data_path(dir, active_gen),
            states.dirty_blocks().last().copied(),
            bs,
        )?;
        if let (Some(f), Some(g)) = (&flushing, flushing_gen) {
            let last = replay
                .syncing
                .iter()
                .copied()
                .filter(|&b| in_rotation(states.raw(b)))
                .max();
            cover_block(f, &data_path(dir, g), last, bs)?;
        }
        // Step 4: bytes of lost writes may sit in the active file under blocks that are not
        // Dirty; a later partial write to such a never-written block must see zeros around it.
        // O(dirty blocks): the gaps between them (the dirty set names them), up to the end of
        // the file (nothing lies beyond it; and a range past the filesystem's largest file
        // size would be refused).
        let active_path = data_path(dir, active_gen);
        let file_end = active
            .metadata()
            .map_err(|e| CacheError::io("stat", &active_path, e))?
            .len();
        let mut from = 0u64;
        for b in states
            .dirty_blocks()
            .into_iter()
            .chain(std::iter::once(geo.num_blocks()))
        {
            let end = (b * bs).min(file_end);
            if end > from * bs {
                crate::sys::punch_hole(&active, from * bs, end - from * bs)
                    .map_err(|e| CacheError::io("punch hole", &active_path, e))?;
            }
            from = b + 1;
        }
        // Step 5: new checkpoint, then drop old segments, then a fresh segment.
        for f in [Some(&active), flushing.as_deref(), Some(&clean)]
            .into_iter()
            .flatten()
        {
            f.sync_data()
                .map_err(|e| CacheError::io("fdatasync", dir, e))?;
        }
        let cp = Checkpoint {
            seq: last_seq,
            active_gen,
            flushing_gen,
            states: states.runs(),
        };
        cp.write(dir, &geo)?;
        // Step 5 (after the checkpoint is durable): unreferenced data files. Not earlier: in
        // the same boot replay applies records no sync covered (a FlushDone, a Rotate), and if
        // the power fails before the new checkpoint is durable, recovery after the reboot
        // drops those records and needs the file again.
        let rd = std::fs::read_dir(dir).map_err(|e| CacheError::io("read_dir", dir, e))?;
        for entry in rd.flatten() {
            let name = entry.file_name();
            let Some(g) = name
                .to_str()
                .and_then(|s| s.strip_prefix("data."))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            if g != active_gen && Some(g) != flushing_gen {
                let p = entry.path();
                std::fs::remove_file(&p).map_err(|e| CacheError::io("remove", &p, e))?;
            }
        }
        let old_segments = wal::list_segments(dir)?;
        for seg in &old_segments {
            let p = wal::segment_path(dir, *seg);
            std::fs::remove_file(&p).map_err(|e| CacheError::io("remove", &p, e))?;
        }
        // The boot that writes the next records (durable before the first of them); its
        // directory fsync makes the removals above durable too.
        crate::boot::store(dir, &boot_id)?;
        let next_segment = old_segments.last().copied().unwrap_or(0) + 1;
        let wal = Wal::create(
            dir,
            next_segment,
            last_seq + 1,
            wal::reserve_bytes(geo.num_blocks()),
            opts.crash_hook.clone(),
        )?;

        let mut syncing = replay.syncing;
        syncing.retain(|&b| in_rotation(states.raw(b)));
        syncing.sort_unstable();
        syncing.dedup();
        let pending = flushing_gen.map(|gen| Arc::new(Rotation::recovered(gen, syncing)));
        let clean = Arc::new(clean);
        let files = Files {
            active: Arc::new(active),
            active_gen,
            flushing,
            flushing_gen,
            clean: clean.clone(),
            crcs: Arc::new(PageCrcs::default()),
            flushing_crcs: None,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            shape: LiveGeometry::new(geo),
            gate: RotationGate::new(files),
            states,
            epochs: Epochs::new(STRIPES),
            wal,
            stripes: Stripes::new(),
            clean,
            hook: opts.crash_hook,
            dead: Arc::new(AtomicBool::new(false)),
            degraded: AtomicBool::new(false),
            last_io_error: Mutex::new(None),
            deferred: Mutex::new(crate::files::Deferred::default()),
            fenced: OnceLock::new(),
            epoch: FillEpoch::new(),
            pending: Mutex::new(pending),
            admin: Mutex::new(()),
            clock_hand: AtomicU64::new(0),
            checkpoint_seq: AtomicU64::new(last_seq),
            #[cfg(test)]
            synced_inodes: Mutex::new(Vec::new()),
        })
    }

    /// The current geometry (the size grows with [`Cache::grow`]; one atomic load).
    pub fn geometry(&self) -> Geometry {
        self.shape.get()
    }

    /// The current geometry (crate-internal shorthand of [`Cache::geometry`]).
    pub(crate) fn geo(&self) -> Geometry {
        self.shape.get()
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Enters the gate without waiting; `None` when a rotation holds or waits for it.
    /// Safe on the ublk loop thread.
    pub fn try_enter(&self) -> Option<Gate> {
        self.gate.try_enter()
    }

    /// Enters the gate, waiting for a rotation if needed. Never on the ublk loop thread, and
    /// never while the calling thread already holds a [`Gate`].
    pub fn enter(&self) -> Gate {
        self.gate.enter()
    }

    /// Takes the write side of the gate (stalls all I/O until dropped); the hold is timed.
    pub(crate) fn write_gate(&self, who: Holder) -> WriteGate<'_> {
        self.gate.write(who)
    }

    /// How long rotation, flush completion, eviction and checkpoints held the write gate
    /// (last and longest hold each): the I/O stalls they caused. O(1), no lock.
    pub fn gate_holds(&self) -> GateHolds {
        self.gate.holds()
    }

    pub(crate) fn check_gate(&self, gate: &Gate) {
        debug_assert!(self.gate.owns(gate), "gate belongs to another cache");
    }

    /// State of one block.
    pub fn block_info(&self, block: u64) -> BlockInfo {
        self.states.get(block)
    }

    /// Marks blocks that have a durable copy in the object store (from the manifest at open).
    pub fn set_remote(&self, blocks: impl IntoIterator<Item = u64>) {
        for b in blocks {
            if b < self.states.len() {
                self.states.set_bits(b, REMOTE);
            }
        }
    }

    /// Clears the remote bit of every block not in `mapped` (ascending: a manifest's blocks),
    /// at open, before anything is served: a cache whose store another writer published to
    /// since (a stale reopen) may know blocks as remote that the newer manifest maps nowhere
    /// (unmapped by that writer); left set, a read of such a block would fetch a location
    /// that does not exist. O(allocated leaves + `mapped`). Returns how many it cleared; the
    /// change is in memory only until the next [`Cache::checkpoint`].
    pub fn clear_remote_except(&self, mapped: impl IntoIterator<Item = u64>) -> u64 {
        let mut cleared = 0;
        let mut mapped = mapped.into_iter().peekable();
        for run in self.states.runs() {
            if run.bits & REMOTE == 0 {
                continue;
            }
            for b in run.first..run.first + run.count {
                while mapped.next_if(|&m| m < b).is_some() {}
                if mapped.peek() != Some(&b) {
                    self.states.clear_bits(b, REMOTE);
                    cleared += 1;
                }
            }
        }
        cleared
    }

    /// Clears the remote bit of each of `blocks` (past the end: ignored): the store maps
    /// them nowhere any more (a read-only export adopting a newer manifest that unmapped
    /// them). In memory only until the next [`Cache::checkpoint`].
    pub fn clear_remote(&self, blocks: impl IntoIterator<Item = u64>) {
        for b in blocks {
            if b < self.states.len() {
                self.states.clear_bits(b, REMOTE);
            }
        }
    }

    /// Blocks per state, O(1): counters the state map keeps on every transition (see
    /// `state`), not a scan; takes no lock. While transitions are in flight the numbers may
    /// be off by those transitions (as a scan's would be).
    pub fn stats(&self) -> CacheStats {
        let c = self.states.counts();
        let [not_present, clean, dirty, syncing] = c.per_state;
        CacheStats {
            not_present,
            clean,
            dirty,
            syncing,
            remote: c.remote,
            degraded: self.degraded.load(Ordering::Acquire),
        }
    }

    /// Memory of the state map and CRC stores. Takes the gate briefly (a read lock): not on
    /// the ublk loop thread, not while holding a [`Gate`].
    pub fn memory(&self) -> CacheMemory {
        let g = self.gate.read();
        let crcs = std::iter::once(&g.crcs).chain(g.flushing_crcs.as_ref());
        let (crc_chunks, crc_bytes) = crcs.fold((0, 0), |(n, b), c| {
            (n + c.chunks() as u64, b + c.heap_bytes())
        });
        CacheMemory {
            state_leaves: self.states.leaves(),
            state_bytes: self.states.heap_bytes(),
            crc_chunks,
            crc_bytes,
        }
    }

    pub(crate) fn alive(&self) -> Result<()> {
        if self.dead.load(Ordering::Acquire) {
            Err(CacheError::Dead)
        } else {
            Ok(())
        }
    }

    /// Refuses every later write (`prepare_write`, `write`) and rotation, for good: another
    /// writer owns the volume. Reads, fills and eviction of Clean blocks go on. The first
    /// reason is kept.
    pub fn fence(&self, reason: impl Into<String>) {
        let _ = self.fenced.set(reason.into());
    }

    /// Why writes are refused, once `fence` was called.
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.get().map(String::as_str)
    }

    /// Fails with `Fenced` once the volume was fenced.
    pub(crate) fn writable(&self) -> Result<()> {
        self.alive()?;
        match self.fenced.get() {
            Some(reason) => Err(CacheError::Fenced {
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Whether an injected crash or a fatal error killed this cache.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// A crash point: dies there when the hook says so.
    pub fn crash_point(&self, point: CrashPoint) -> Result<()> {
        if self.hook.should_crash(point) {
            self.die();
            return Err(CacheError::Crashed(point));
        }
        Ok(())
    }

    /// Latches the cache dead: no further writes reach the disk, buffered WAL records are
    /// dropped (what a killed process leaves behind).
    pub fn die(&self) {
        self.dead.store(true, Ordering::Release);
        self.wal.kill();
    }

    /// The last appended WAL record and the data files holding the data of every record up to
    /// it, read under one read gate (see `Wal::sync_with`): no rotation or flush completion
    /// can log its record and swap the files between the two.
    fn current_files(&self) -> (u64, Vec<Arc<File>>) {
        let g = self.gate.read();
        let upto = self.wal.last_seq();
        let mut v = vec![g.active.clone(), g.clean.clone()];
        v.extend(g.flushing.clone());
        (upto, v)
    }

    /// fdatasync of data files. A failure latches the cache dead (see `space`: the kernel may
    /// have dropped the pages, and no later sync could prove them durable).
    pub(crate) fn sync_files(&self, files: &[Arc<File>]) -> Result<()> {
        for f in files {
            let r = crate::crash::check(&*self.hook, IoOp::DataSync).and_then(|()| f.sync_data());
            if let Err(e) = r {
                let e = CacheError::io("fdatasync", &self.dir, e);
                tracing::error!(error = %e, "data file sync failed; the cache is dead");
                *self.last_io_error.lock() = Some(e.to_string());
                self.degraded.store(true, Ordering::Release);
                self.die();
                return Err(e);
            }
            #[cfg(test)]
            self.synced_inodes.lock().push(test_inode(f));
        }
        Ok(())
    }

    /// The block device's FLUSH: every write completed before this call is durable on local
    /// disk (data files, then WAL) when it returns. Concurrent callers share syncs (group
    /// commit). Takes the gate briefly: never call it while holding a [`Gate`] or on the ublk
    /// loop thread.
    ///
    /// The data files are looked up when the sync *begins*, not when `flush` is entered: a
    /// caller covered by this sync may have written into an active file that a rotation
    /// created after we entered (any file a covered write landed in is then still the active
    /// or flushing file, or its blocks were staged into the clean file and synced by
    /// `complete_flush`). They are looked up together with the last record the sync's
    /// `Synced` marker covers: after a power loss recovery rebuilds the files of exactly that
    /// record, so a FlushDone logged after the lookup must not be covered (its flushing file
    /// was not synced), and one logged before it must be (see `Wal::sync_with`).
    ///
    /// A WAL write or sync failure (full disk) fails this FLUSH only: the records stay
    /// appended and a later FLUSH writes and syncs them (see `space`).
    pub fn flush(&self) -> Result<()> {
        self.alive()?;
        let r = self.wal.sync_with(
            || self.current_files(),
            |files| {
                self.sync_files(&files)?;
                self.crash_point(CrashPoint::BeforeWalSync)
            },
        );
        self.note(r)?;
        self.after_sync();
        self.crash_point(CrashPoint::AfterWalSync)
    }

    /// Makes every appended WAL record durable, the current data files first (the records
    /// point at their bytes: a durable Dirty record over unsynced data would read as zeros
    /// after a power loss, even for the pages a promotion copied). On a WAL failure the
    /// records stay appended (see `space`).
    pub(crate) fn sync_log(&self) -> Result<()> {
        let r = self
            .wal
            .sync_with(|| self.current_files(), |files| self.sync_files(&files));
        self.note(r)?;
        self.after_sync();
        Ok(())
    }

    /// Writes a checkpoint of the state map and drops the WAL segments it covers.
    ///
    /// Under the write gate only the WAL segment switches (sequence `S`) and the file
    /// generations are read: O(1), whatever the volume size. The state map is read after the
    /// gate is released (O(allocated leaves), see `state`), so it may already show changes of
    /// records after `S`, which replay applies again, harmlessly:
    /// - rotation, flush completion and eviction cannot run (they take `admin`, held here);
    /// - every record up to `S` has changed its state before the switch (a write commits
    ///   under a read gate), except a fill caught between its record and its state change,
    ///   which is forgotten (fetched again later), as before;
    /// - a write or fill after `S` wrote its data before its state changed, and the data files
    ///   are synced after the snapshot, so a Dirty or Clean state the snapshot saw points at
    ///   durable bytes (the write then survives a crash even if its record does not).
    pub fn checkpoint(&self) -> Result<()> {
        let _admin = self.admin.lock();
        self.checkpoint_locked(&self.geo())
    }

    /// [`Cache::checkpoint`] under the admin lock the caller holds, recording `geo` (the
    /// current geometry, or the one `grow` moves to once this checkpoint is durable).
    pub(crate) fn checkpoint_locked(&self, geo: &Geometry) -> Result<()> {
        self.alive()?;
        // Refused on a full disk (no reserve): the current segment keeps its reserve.
        let reserve = wal::reserve_bytes(geo.num_blocks());
        let next = self.note(self.wal.prepare_segment(self.wal.segment() + 1, reserve))?;
        let (seq, active_gen, flushing_gen, old_wal, old_path, files) = {
            let g = self.write_gate(Holder::Checkpoint);
            let (old, old_path, seq) = self.wal.switch_to(next)?;
            let mut files = vec![g.active.clone(), g.clean.clone()];
            files.extend(g.flushing.clone());
            (seq, g.active_gen, g.flushing_gen, old, old_path, files)
        };
        let cp = Checkpoint {
            seq,
            active_gen,
            flushing_gen,
            states: self.states.runs(),
        };
        self.crash_point(CrashPoint::BeforeCheckpoint)?;
        self.sync_files(&files)?;
        self.note(self.wal.sync_retired(&old_wal, &old_path))?;
        self.note(cp.write(&self.dir, geo))?;
        // Every retired segment's records are covered now (switched away before `seq`).
        self.wal.drop_retired();
        self.checkpoint_seq.store(cp.seq, Ordering::Release);
        self.crash_point(CrashPoint::AfterCheckpoint)?;
        let current = self.wal.segment();
        for seg in wal::list_segments(&self.dir)? {
            if seg < current {
                let p = wal::segment_path(&self.dir, seg);
                std::fs::remove_file(&p).map_err(|e| CacheError::io("remove", &p, e))?;
            }
        }
        Ok(())
    }

    /// Sequence number of the last WAL record appended.
    pub fn wal_seq(&self) -> u64 {
        self.wal.last_seq()
    }

    /// WAL records appended since the last checkpoint (what a restart would replay).
    pub fn records_since_checkpoint(&self) -> u64 {
        self.wal
            .last_seq()
            .saturating_sub(self.checkpoint_seq.load(Ordering::Acquire))
    }

    /// Whether a FLUSH should also write a checkpoint: `every` records since the last one
    /// (the caller's replay bound), or half the current segment's reserve, whichever comes
    /// first: this bounds the segment's size. The room left for the records that free space
    /// on a full disk (one per block at most: an Evict for a Clean block, an Unstaged for a
    /// Syncing one) is kept by the WAL itself, whatever the FLUSHes do (see
    /// `wal::reserve_bytes`).
    pub fn checkpoint_due(&self, every: u64) -> bool {
        let reserve = wal::reserve_bytes(self.geo().num_blocks()) / wal::RECORD_BYTES as u64;
        self.records_since_checkpoint() >= every.min(reserve / 2)
    }

    pub(crate) fn stripe(&self, block: u64) -> usize {
        crate::state::stripe_of(block)
    }
}
