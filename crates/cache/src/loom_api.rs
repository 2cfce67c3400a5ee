//! The model check's handle on the cache's concurrency core (`--cfg loom` builds only; the
//! model is `tests/gate_model.rs`): the real rotation gate, state map, stripe locks and fill
//! epoch, built as `Cache::open` builds them but without files, and the switches that plant
//! the model's broken variants in that code ([`Faults`], read at the line each one breaks).

use std::fs::File;
use std::sync::{Arc, OnceLock};

use crate::crcs::PageCrcs;
use crate::gate::{Holder, RotationGate, WriteGate};
use crate::state::{self, FillEpoch, Flushed, Run, StateMap, Stripes};
use crate::sync::{ArcUnitGuard, UnitGuard};

pub use crate::gate::{Files, Gate};
pub use crate::loom_faults::{Faults, FillChecks};
pub use crate::state::{BlockInfo, BlockState};

/// State byte bits (`state`).
pub const STATE_MASK: u8 = state::STATE_MASK;
pub const REMOTE: u8 = state::REMOTE;
pub const NO_FILL: u8 = state::NO_FILL;

/// Who takes the write side of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writer {
    Rotate,
    CompleteFlush,
    Evict,
}

/// The write side of the gate, with the changes of [`Files`] the model's steps make.
pub struct WriteGuard<'a>(WriteGate<'a>);

impl std::fmt::Debug for WriteGuard<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("WriteGuard").field(&*self.0).finish()
    }
}

impl WriteGuard<'_> {
    pub fn active_gen(&self) -> u64 {
        self.0.active_gen
    }

    pub fn flushing_gen(&self) -> Option<u64> {
        self.0.flushing_gen
    }

    /// `flush::Cache::rotate`'s change: the active file becomes the flushing one and
    /// generation `new_gen` is active.
    pub fn rotate_to(&mut self, new_gen: u64) {
        let files = &mut *self.0;
        files.flushing = Some(Arc::clone(&files.active));
        files.flushing_gen = Some(files.active_gen);
        files.active_gen = new_gen;
    }

    /// `flush::Cache::complete_flush`'s change: no flushing file.
    pub fn end_flush(&mut self) {
        let files = &mut *self.0;
        files.flushing = None;
        files.flushing_gen = None;
        files.flushing_crcs = None;
    }
}

/// The flushing generation of `files`, if a flush is pending.
pub fn flushing_gen(files: &Files) -> Option<u64> {
    files.flushing_gen
}

/// A held stripe lock (borrowed, as a fill takes it).
#[derive(Debug)]
pub struct StripeGuard<'a>(#[allow(dead_code)] UnitGuard<'a>);

/// A held stripe lock (owned, as a write ticket keeps it).
#[derive(Debug)]
pub struct OwnedStripeGuard(#[allow(dead_code)] ArcUnitGuard);

/// The gate, the state map, the stripe locks and the fill epoch of one cache.
#[derive(Debug)]
pub struct Core {
    gate: RotationGate,
    states: StateMap,
    stripes: Stripes,
    epoch: FillEpoch,
}

impl Core {
    /// A cache of `bytes.len()` blocks (at most one leaf) whose state bytes are `bytes`
    /// (persisted bits, as a checkpoint loads them), generation 0 active, no flush pending.
    pub fn new(faults: Faults, bytes: &[u8]) -> Self {
        let n = bytes.len() as u64;
        assert!(n <= state::LEAF_BLOCKS, "the model's blocks fit one leaf");
        let runs: Vec<Run> = (0..n)
            .filter(|&b| bytes[b as usize] != 0)
            .map(|b| Run {
                first: b,
                count: 1,
                bits: bytes[b as usize],
            })
            .collect();
        let mut states = StateMap::from_runs(n, &runs);
        states.faults = faults;
        // The leaf exists before any model thread runs: its allocation (a std `OnceLock`)
        // must not race, loom cannot see it.
        states.set_bits(0, state::REFERENCED);
        states.clear_bits(0, state::REFERENCED);
        let file = null_file();
        let files = Files {
            active: Arc::clone(&file),
            active_gen: 0,
            flushing: None,
            flushing_gen: None,
            clean: file,
            crcs: Arc::new(PageCrcs::default()),
            flushing_crcs: None,
        };
        Self {
            gate: RotationGate::new(files),
            states,
            stripes: Stripes::new(),
            epoch: FillEpoch::new(),
        }
    }

    // ---- the gate (`gate::RotationGate`, `Cache::{enter, try_enter, write_gate}`) ----

    pub fn enter(&self) -> Gate {
        self.gate.enter()
    }

    pub fn try_enter(&self) -> Option<Gate> {
        self.gate.try_enter()
    }

    /// A brief read of the files (`self.gate.read()` in the real code): `(active, flushing)`
    /// generations.
    pub fn current_gens(&self) -> (u64, Option<u64>) {
        let g = self.gate.read();
        (g.active_gen, g.flushing_gen)
    }

    pub fn write_gate(&self, who: Writer) -> WriteGuard<'_> {
        WriteGuard(self.gate.write(match who {
            Writer::Rotate => Holder::Rotate,
            Writer::CompleteFlush => Holder::CompleteFlush,
            Writer::Evict => Holder::Evict,
        }))
    }

    // ---- the state map (`state::StateMap`) ----

    pub fn raw(&self, b: u64) -> u8 {
        self.states.raw(b)
    }

    pub fn info(&self, b: u64) -> BlockInfo {
        self.states.get(b)
    }

    /// `write::Cache::turn_dirty`'s change.
    pub fn set_dirty(&self, b: u64) {
        self.states.set_state(b, BlockState::Dirty);
    }

    /// `StateMap::rotate`.
    pub fn rotate(&self) -> Vec<u64> {
        self.states.rotate()
    }

    /// `StateMap::complete_rotated` of a staged block.
    pub fn complete_rotated(&self, b: u64) {
        self.states.complete_rotated(b, Flushed::Staged);
    }

    /// `StateMap::evict_clean`.
    pub fn evict_clean(&self, victims: &mut Vec<u64>) {
        self.states.evict_clean(victims);
    }

    /// `StateMap::end_eviction`.
    pub fn end_eviction(&self, b: u64) {
        self.states.end_eviction(b);
    }

    /// `StateMap::fillable`: call it holding the block's stripe lock.
    pub fn fillable(&self, b: u64, token: u64) -> bool {
        self.states.fillable(b, &self.epoch, token)
    }

    /// `StateMap::filled`.
    pub fn filled(&self, b: u64) {
        self.states.filled(b);
    }

    // ---- the fill epoch and the stripe locks ----

    /// `Cache::fill_token`.
    pub fn fill_token(&self) -> u64 {
        self.epoch.get()
    }

    pub fn bump_epoch(&self) {
        self.epoch.bump();
    }

    /// The stripe lock of block `b` as a fill takes it.
    pub fn lock_stripe(&self, b: u64) -> StripeGuard<'_> {
        StripeGuard(self.stripes[state::stripe_of(b)].lock())
    }

    /// The stripe lock of block `b` as `prepare_write` takes it (`LockMode::Wait`).
    pub fn lock_stripe_arc(&self, b: u64) -> OwnedStripeGuard {
        OwnedStripeGuard(self.stripes[state::stripe_of(b)].lock_arc())
    }

    /// The stripe lock of block `b` as `prepare_write` tries it (`LockMode::Try`).
    pub fn try_lock_stripe_arc(&self, b: u64) -> Option<OwnedStripeGuard> {
        self.stripes[state::stripe_of(b)]
            .try_lock_arc()
            .map(OwnedStripeGuard)
    }
}

/// The file every model gate's `Files` points at (the model keeps its bytes elsewhere).
fn null_file() -> Arc<File> {
    static NULL: OnceLock<Arc<File>> = OnceLock::new();
    Arc::clone(
        NULL.get_or_init(|| Arc::new(File::open("/dev/null").expect("the model opens /dev/null"))),
    )
}
