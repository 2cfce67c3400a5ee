//! The broken variants of the gate model planted in the real code (`--cfg loom` only): a
//! [`Faults`] value lives in the state map, and each switch is read at the one line it
//! breaks. The model (`tests/gate_model.rs`) sets them through `loom_api`.

/// Broken variants planted in the real code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Faults {
    /// `StateMap::complete_rotated` takes every rotated block for still Syncing.
    pub complete_unchecked: bool,
    /// The checks `StateMap::fillable` makes.
    pub fill: FillChecks,
}

/// What `StateMap::fillable` checks before a fill stores a fetched block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FillChecks {
    /// The real code: the epoch (`FillToken`), NotPresent and NO_FILL clear.
    #[default]
    All,
    /// Broken: neither NotPresent nor NO_FILL.
    EpochOnly,
    /// Broken: no NO_FILL check.
    EpochAndNotPresent,
    /// Broken: the token is ignored.
    StateOnly,
}

impl Faults {
    /// `fillable`'s three findings, with the checks this variant skips passed.
    pub(crate) fn fill(
        &self,
        epoch_ok: bool,
        not_present: bool,
        no_fill: bool,
    ) -> (bool, bool, bool) {
        match self.fill {
            FillChecks::All => (epoch_ok, not_present, no_fill),
            FillChecks::EpochOnly => (epoch_ok, true, false),
            FillChecks::EpochAndNotPresent => (epoch_ok, not_present, false),
            FillChecks::StateOnly => (true, not_present, no_fill),
        }
    }
}
