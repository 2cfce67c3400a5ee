//! The invariants every manifest publish is checked against, each a small pure predicate.
//!
//! [`VolumeStore::publish_manifest`](crate::VolumeStore::publish_manifest) is the only
//! conditional put of a manifest in the engine (flush, compaction, claims and
//! releases, resize, takeover, a clone's generation 1 all go through it), and it asks these
//! predicates before the PUT. Each returns the [`Violation`] it found; the publisher turns it
//! into the error the callers already handle (`Fenced`, `InvalidInput`, `MissingPack`).
//!
//! | invariant | what it protects against |
//! |---|---|
//! | [`follows`]: the next generation is exactly latest + 1 | two writers both winning one generation (lower), a gap that hides generations from GC and readers (higher) |
//! | [`continues_owner`]: a publish over an unreleased owner record continues that claim, or is a fresh claim | a handle that holds no claim (a read-only export on another host, an owner-less writer) publishing over the owner and fencing it: every write the owner acknowledged since would be lost |
//! | [`packs_present`]: every pack a new segment names is in the store | a manifest pointing at a pack GC deleted, or an upload that never landed |
//!
//!
//! GC's side of the same contract (a publish never deletes anything), checked by
//! [`VolumeStore::gc`](crate::VolumeStore::gc) on its plan before it deletes anything:
//!
//! | invariant | what it protects against |
//! |---|---|
//! | [`keeps_pinned`]: no manifest a snapshot (or a clone's generation 1) pins is pruned, and no pack a retained manifest references is deleted | a clone or a view of a snapshot whose packs GC deleted: every cold read of it fails, and so does a delete's check that a clone published |

use crate::location::PackId;
use crate::manifest::ManifestOwner;

/// An invariant a publish would break.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// The generation is not newer than the latest manifest: another writer got there first.
    #[error("generation {next} is not newer than the latest manifest ({latest})")]
    NotNewer { latest: u64, next: u64 },
    /// The generation would leave a gap after the latest manifest.
    #[error("generation {next} would leave a gap after the latest manifest ({latest})")]
    Gap { latest: u64, next: u64 },
    /// The latest manifest names an owner that has not released the volume, and this publish
    /// neither continues that claim nor makes a new one.
    #[error(
        "the latest manifest is owned by `{holder}` (claimed at generation {claimed_at}) and this publish does not continue that claim"
    )]
    NotOwner { holder: String, claimed_at: u64 },
    /// The publish carries an owner record that is neither the latest manifest's nor a claim
    /// made by this very generation.
    #[error(
        "owner record `{id}` claimed at generation {claimed_at} is neither the latest manifest's nor a claim of generation {next}"
    )]
    ForgedOwner {
        id: String,
        claimed_at: u64,
        next: u64,
    },
    /// A pack a new segment names is not in the store.
    #[error("pack `{pack}` is not in the store")]
    MissingPack { pack: PackId },
    /// A GC pass would prune the manifest of a pinned generation.
    #[error(
        "generation {generation} is pinned (a snapshot, or a clone's first) but would be pruned"
    )]
    PinnedPruned { generation: u64 },
    /// A GC pass would delete a pack a retained manifest references.
    #[error("pack `{pack}` is referenced by a retained manifest but would be deleted")]
    ReferencedDeleted { pack: PackId },
}

impl Violation {
    /// A fixed phrase for `ObjStoreError::Fenced::reason`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Violation::NotNewer { .. } => "generation is not newer than the latest manifest",
            Violation::Gap { .. } => "generation would leave a gap after the latest manifest",
            Violation::NotOwner { .. } => {
                "the latest manifest names another owner's claim, which this publish does not continue"
            }
            Violation::ForgedOwner { .. } => {
                "the owner record is neither the latest manifest's nor a new claim"
            }
            Violation::MissingPack { .. } => "a pack it names is not in the store",
            Violation::PinnedPruned { .. } => "a GC pass would prune a pinned generation",
            Violation::ReferencedDeleted { .. } => {
                "a GC pass would delete a pack a retained manifest references"
            }
        }
    }
}

/// The next generation must be exactly `latest + 1` (0 when the volume has no manifest).
pub fn follows(latest: u64, next: u64) -> Result<(), Violation> {
    if next <= latest {
        Err(Violation::NotNewer { latest, next })
    } else if next != latest + 1 {
        Err(Violation::Gap { latest, next })
    } else {
        Ok(())
    }
}

/// Whether `record` is a claim made by the publish of `generation` itself.
fn is_claim(record: &ManifestOwner, generation: u64) -> bool {
    record.claimed_at == generation && !record.released
}

/// The owner record of a publish of `generation` against the latest manifest's `latest`:
/// - a fresh claim (`claimed_at` = `generation`, not released) is always allowed: the open
///   path decides when one may be made (a released or owner-less volume, or a takeover);
/// - over an unreleased claim, the record must be that claim (same id and `claimed_at`,
///   released or not: a release is the owner's last publish);
/// - over a released or absent record, the publish records no owner (a writer without an
///   owner id) or repeats the latest record unchanged.
pub fn continues_owner(
    latest: Option<&ManifestOwner>,
    next: Option<&ManifestOwner>,
    generation: u64,
) -> Result<(), Violation> {
    if next.is_some_and(|n| is_claim(n, generation)) {
        return Ok(());
    }
    let same_claim =
        |l: &ManifestOwner, n: &ManifestOwner| l.id == n.id && l.claimed_at == n.claimed_at;
    match (latest, next) {
        (Some(l), None) if !l.released => Err(Violation::NotOwner {
            holder: l.id.clone(),
            claimed_at: l.claimed_at,
        }),
        (Some(l), Some(n)) if !l.released && !same_claim(l, n) => Err(Violation::NotOwner {
            holder: l.id.clone(),
            claimed_at: l.claimed_at,
        }),
        (Some(l), Some(n)) if l.released && l != n => Err(Violation::ForgedOwner {
            id: n.id.clone(),
            claimed_at: n.claimed_at,
            next: generation,
        }),
        (None, Some(n)) => Err(Violation::ForgedOwner {
            id: n.id.clone(),
            claimed_at: n.claimed_at,
            next: generation,
        }),
        _ => Ok(()),
    }
}

/// Every pack in `named` is `present` (the publisher trusts what it uploaded or the latest
/// manifest references, and HEADs the rest); the smallest missing one is reported.
pub fn packs_present<'a>(
    named: impl IntoIterator<Item = &'a PackId>,
    present: impl Fn(&PackId) -> bool,
) -> Result<(), Violation> {
    match named.into_iter().filter(|p| !present(p)).min() {
        Some(pack) => Err(Violation::MissingPack { pack: pack.clone() }),
        None => Ok(()),
    }
}

/// A GC plan keeps what pinned generations need: no generation in `pinned` is among the
/// `pruned` manifests, and no pack in `doomed` is `referenced` by a retained manifest (the
/// smallest offender is reported).
pub fn keeps_pinned(
    pinned: &[u64],
    pruned: &[u64],
    referenced: impl Fn(&PackId) -> bool,
    doomed: &[PackId],
) -> Result<(), Violation> {
    if let Some(&generation) = pruned.iter().filter(|g| pinned.contains(g)).min() {
        return Err(Violation::PinnedPruned { generation });
    }
    match doomed.iter().filter(|p| referenced(p)).min() {
        Some(pack) => Err(Violation::ReferencedDeleted { pack: pack.clone() }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, claimed_at: u64, released: bool) -> ManifestOwner {
        ManifestOwner {
            id: id.into(),
            claimed_at,
            released,
        }
    }

    #[test]
    fn follows_accepts_only_latest_plus_one() {
        assert_eq!(follows(0, 1), Ok(()));
        assert_eq!(follows(7, 8), Ok(()));
        assert_eq!(
            follows(7, 7),
            Err(Violation::NotNewer { latest: 7, next: 7 })
        );
        assert_eq!(
            follows(7, 3),
            Err(Violation::NotNewer { latest: 7, next: 3 })
        );
        assert_eq!(follows(7, 9), Err(Violation::Gap { latest: 7, next: 9 }));
        assert_eq!(follows(0, 2), Err(Violation::Gap { latest: 0, next: 2 }));
    }

    #[test]
    fn the_owner_continues_and_releases_its_claim() {
        let a = rec("a", 3, false);
        assert_eq!(continues_owner(Some(&a), Some(&a), 9), Ok(()));
        assert_eq!(
            continues_owner(Some(&a), Some(&rec("a", 3, true)), 9),
            Ok(())
        );
    }

    #[test]
    fn a_publish_without_the_claim_is_refused_over_an_unreleased_owner() {
        let a = rec("a", 3, false);
        let not_owner = Err(Violation::NotOwner {
            holder: "a".into(),
            claimed_at: 3,
        });
        // A read-only export or an owner-less writer (item 1 of issue 45).
        assert_eq!(continues_owner(Some(&a), None, 9), not_owner);
        // Another owner's record that is not a claim of this generation.
        assert_eq!(
            continues_owner(Some(&a), Some(&rec("b", 3, false)), 9),
            not_owner
        );
        // The same id with another claim generation (a stale handle of a reclaimed volume).
        assert_eq!(
            continues_owner(Some(&a), Some(&rec("a", 2, false)), 9),
            not_owner
        );
    }

    #[test]
    fn a_fresh_claim_is_always_allowed() {
        let a = rec("a", 3, false);
        assert_eq!(
            continues_owner(Some(&a), Some(&rec("b", 9, false)), 9),
            Ok(())
        );
        assert_eq!(continues_owner(None, Some(&rec("b", 1, false)), 1), Ok(()));
        assert_eq!(
            continues_owner(Some(&rec("a", 3, true)), Some(&rec("a", 9, false)), 9),
            Ok(())
        );
    }

    #[test]
    fn after_a_release_or_without_owners_no_record_is_needed() {
        assert_eq!(continues_owner(Some(&rec("a", 3, true)), None, 9), Ok(()));
        assert_eq!(continues_owner(None, None, 9), Ok(()));
    }

    #[test]
    fn a_record_that_is_neither_inherited_nor_claimed_is_forged() {
        let forged = |id: &str, at| {
            Err(Violation::ForgedOwner {
                id: id.into(),
                claimed_at: at,
                next: 9,
            })
        };
        assert_eq!(
            continues_owner(None, Some(&rec("b", 4, false)), 9),
            forged("b", 4)
        );
        assert_eq!(
            continues_owner(Some(&rec("a", 3, true)), Some(&rec("b", 4, false)), 9),
            forged("b", 4)
        );
        // A released record never becomes unreleased again without a new claim.
        assert_eq!(
            continues_owner(Some(&rec("a", 3, true)), Some(&rec("a", 3, false)), 9),
            forged("a", 3)
        );
    }

    #[test]
    fn packs_present_names_the_smallest_missing_pack() {
        let p = |s: &str| PackId(s.into());
        let named = [p("c"), p("a"), p("b")];
        assert_eq!(packs_present(&named, |_| true), Ok(()));
        assert_eq!(
            packs_present(&named, |id| &*id.0 == "a"),
            Err(Violation::MissingPack { pack: p("b") })
        );
        assert_eq!(packs_present(&[], |_| false), Ok(()));
    }

    #[test]
    fn keeps_pinned_refuses_a_pruned_pinned_generation() {
        let none = |_: &PackId| false;
        assert_eq!(keeps_pinned(&[3, 7], &[1, 2, 4], none, &[]), Ok(()));
        assert_eq!(keeps_pinned(&[], &[1, 2], none, &[]), Ok(()));
        assert_eq!(
            keeps_pinned(&[3, 7], &[1, 7, 3], none, &[]),
            Err(Violation::PinnedPruned { generation: 3 })
        );
    }

    #[test]
    fn keeps_pinned_refuses_deleting_a_referenced_pack() {
        let (a, b, c) = (
            PackId::generate(1, 1),
            PackId::generate(1, 2),
            PackId::generate(1, 3),
        );
        let referenced = |p: &PackId| *p == b || *p == c;
        assert_eq!(
            keeps_pinned(&[1], &[2], referenced, std::slice::from_ref(&a)),
            Ok(())
        );
        assert_eq!(
            keeps_pinned(&[1], &[2], referenced, &[a, c.clone(), b.clone()]),
            Err(Violation::ReferencedDeleted { pack: b.min(c) })
        );
    }
}
