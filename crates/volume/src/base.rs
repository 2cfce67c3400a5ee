//! Which manifest generation the local cache is built on (`<cache dir>/store.base`).
//!
//! A cache holds Clean copies of stored blocks and Dirty blocks not yet published, both
//! relative to the manifest generation it last saw ("base"). When another writer publishes a
//! newer generation (a takeover on another host) while this cache sat closed, reopening it
//! must neither publish the local Dirty blocks over the winner's data (split brain) nor serve
//! the local Clean copies, which may be stale.
//!
//! File format (text, replaced atomically: tmp + fsync + rename + directory fsync):
//! ```text
//! base <generation>
//! publishing <generation> <pack id>      (only while a publish is in flight)
//! publishing <generation> =owner         (a claim or release in flight, see below)
//! ```
//! Protocol: before publishing generation G the volume records `publishing G <first pack>`;
//! after the publish it records `base G`. A publish that changes only the owner record (the
//! claim at open, `Volume::release`) uploads no pack: it records `publishing G =owner`
//! (`=` never occurs in a pack id). At open, with the store's latest generation L:
//! - L == base, or L == the recorded publishing generation and our publish is recognised (the
//!   manifest references the recorded pack; or, for `=owner`, its owner record names this
//!   writer's owner id and says it claimed at L or released: a claim or release by this
//!   owner, whose block map is that of the base): the cache is current;
//! - L > base otherwise: a foreign publish. Unpublished local blocks latch the volume fenced
//!   (nothing is published; the operator discards the cache); a cache with nothing
//!   unpublished drops its Clean copies and adopts L;
//! - L < base: the store lost generations (wiped, or another bucket): fenced as well;
//! - no file (a new cache, or one from before this file existed): adopts L.
//!
//! Clean close (`<cache dir>/store.closed`, text `closed <generation>`, written like the base
//! file): `Volume::close` of an owner's volume writes it last, holding the sync lock, after
//! which that handle never publishes again; so it says "the writer stopped on base G with no
//! publish in flight". `Volume::open` takes it (reads it, then deletes it durably) before
//! anything else can publish. When it names the store's latest generation, the base file
//! records that generation with nothing publishing and the manifest names this owner
//! unreleased, the open skips its claim: no predecessor request can still land (a process
//! killed with requests on the wire leaves no marker), so claiming again would only spend a
//! publish on the hand-off's critical path. A file from before the marker existed, or a
//! reader that ignores it, just claims.

use std::path::{Path, PathBuf};

use glidefs_cache::durable::write_atomic;
use glidefs_objstore::Manifest;

use crate::error::{Result, VolumeError};

const FILE: &str = "store.base";
const CLOSED: &str = "store.closed";

/// The `publishing` tag of a publish that changes only the owner record (claim, release).
pub(crate) const OWNER_TAG: &str = "=owner";

/// What the file records.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Base {
    pub generation: u64,
    pub publishing: Option<(u64, String)>,
}

/// How a reopened cache relates to the store's latest manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The cache is built on the latest generation.
    Current,
    /// Someone else published; the cache has nothing unpublished: drop Clean copies, adopt.
    Stale,
    /// The cache cannot be used for writing: why.
    Diverged(String),
}

fn path(dir: &Path) -> PathBuf {
    dir.join(FILE)
}

fn io_err(op: &'static str, dir: &Path, e: std::io::Error) -> VolumeError {
    VolumeError::Base {
        op,
        path: path(dir).display().to_string(),
        source: e,
    }
}

/// Reads the file; `None` when it does not exist.
pub(crate) fn load(dir: &Path) -> Result<Option<Base>> {
    let text = match std::fs::read_to_string(path(dir)) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err("read", dir, e)),
    };
    parse(&text).map(Some).ok_or_else(|| {
        io_err(
            "parse",
            dir,
            std::io::Error::other(format!("bad contents {text:?}")),
        )
    })
}

fn parse(text: &str) -> Option<Base> {
    let mut base = None;
    let mut publishing = None;
    for line in text.lines() {
        let mut words = line.split_whitespace();
        match (words.next(), words.next(), words.next()) {
            (Some("base"), Some(g), None) => base = Some(g.parse().ok()?),
            (Some("publishing"), Some(g), Some(pack)) => {
                publishing = Some((g.parse().ok()?, pack.to_string()))
            }
            (None, _, _) => {}
            _ => return None,
        }
    }
    Some(Base {
        generation: base?,
        publishing,
    })
}

/// Replaces the file atomically (blocking file I/O: call it on the blocking pool).
pub(crate) fn store(dir: &Path, base: &Base) -> Result<()> {
    let mut text = format!("base {}\n", base.generation);
    if let Some((g, pack)) = &base.publishing {
        text.push_str(&format!("publishing {g} {pack}\n"));
    }
    replace(&path(dir), &text)
}

/// Writes the file atomically: tmp + fsync + rename + directory fsync; an error names the
/// file and the step.
fn replace(file: &Path, text: &str) -> Result<()> {
    write_atomic(file, text.as_bytes()).map_err(|e| VolumeError::Base {
        op: e.step.as_str(),
        path: e.path.display().to_string(),
        source: e.source,
    })
}

/// Records a clean close on base `generation` (see the module docs; blocking file I/O).
pub(crate) fn mark_closed(dir: &Path, generation: u64) -> Result<()> {
    replace(&dir.join(CLOSED), &format!("closed {generation}\n"))
}

/// Reads and durably deletes the clean-close marker: the generation it names, `None` when
/// there is none (or it cannot be parsed: then it is deleted all the same, and the open
/// claims). Blocking file I/O.
pub(crate) fn take_closed(dir: &Path) -> Result<Option<u64>> {
    let file = dir.join(CLOSED);
    let err = |op, e| VolumeError::Base {
        op,
        path: file.display().to_string(),
        source: e,
    };
    let text = match std::fs::read_to_string(&file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err("read", e)),
    };
    std::fs::remove_file(&file).map_err(|e| err("delete", e))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| err("sync the directory of", e))?;
    Ok(text
        .strip_prefix("closed ")
        .and_then(|g| g.trim().parse().ok()))
}

/// Judges a reopened cache (see the module docs). `unpublished` counts local blocks not in
/// the store (Dirty + Syncing); `owner` is this writer's owner id, if it has one.
pub(crate) fn judge(
    base: Option<&Base>,
    latest: &Manifest,
    unpublished: u64,
    owner: Option<&str>,
) -> Verdict {
    let Some(base) = base else {
        return Verdict::Current;
    };
    let l = latest.generation;
    let ours = base.publishing.as_ref().is_some_and(|(g, tag)| {
        *g == l
            && if tag == OWNER_TAG {
                owner_publish_by(latest, owner)
            } else {
                latest.references_pack(tag)
            }
    });
    if l == base.generation || ours {
        return Verdict::Current;
    }
    if l < base.generation {
        return Verdict::Diverged(format!(
            "the store's latest manifest is generation {l}, older than this cache's base {}: \
             the store lost generations (wiped, or a different store)",
            base.generation
        ));
    }
    if unpublished > 0 {
        return Verdict::Diverged(format!(
            "another writer published generation {l} after this cache's base {}; its \
             {unpublished} unpublished blocks are not published over it (discard the local \
             cache to use the volume here)",
            base.generation
        ));
    }
    Verdict::Stale
}

/// Whether `m` is a claim or a release published by `owner` (so its block map is its
/// predecessor's). Only writers with an owner id write owner records, and every publish of a
/// writer other than a claim or release carries an older `claimed_at` and `released = false`.
fn owner_publish_by(m: &Manifest, owner: Option<&str>) -> bool {
    match (&m.owner, owner) {
        (Some(o), Some(me)) => o.id == me && (o.claimed_at == m.generation || o.released),
        _ => false,
    }
}

/// Rewrites the cache's base file (on the blocking pool).
pub(crate) async fn record_base(
    cfg: &crate::config::VolumeConfig,
    generation: u64,
    publishing: Option<(u64, String)>,
) -> Result<()> {
    let dir = cfg.dir.clone();
    crate::blocking::blocking(move || {
        store(
            &dir,
            &Base {
                generation,
                publishing,
            },
        )
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use glidefs_objstore::{BlockLocation, ManifestOwner, PackId};

    fn manifest(generation: u64, pack: &str) -> Manifest {
        let mut m = Manifest::new("v", 4096, 4096 * 4);
        m.generation = generation;
        m.insert(
            0,
            BlockLocation {
                pack: PackId::new(pack).unwrap(),
                entry: 0,
                offset: 0,
                len: 10,
                raw_crc: 0,
            },
        );
        m
    }

    #[test]
    fn file_round_trips_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(load(dir.path()).unwrap(), None);
        let b = Base {
            generation: 7,
            publishing: Some((8, "p-1".into())),
        };
        store(dir.path(), &b).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(b));
        std::fs::write(path(dir.path()), "base x\n").unwrap();
        assert!(load(dir.path()).is_err());
    }

    #[test]
    fn verdicts() {
        let at = |g| Base {
            generation: g,
            publishing: None,
        };
        // No file: adopt.
        assert_eq!(judge(None, &manifest(5, "a"), 3, None), Verdict::Current);
        assert_eq!(
            judge(Some(&at(5)), &manifest(5, "a"), 3, None),
            Verdict::Current
        );
        // Our own publish landed before the crash that lost `base 6`.
        let ours = Base {
            generation: 5,
            publishing: Some((6, "mine".into())),
        };
        assert_eq!(
            judge(Some(&ours), &manifest(6, "mine"), 3, None),
            Verdict::Current
        );
        // Same generation, someone else's pack: foreign.
        assert!(matches!(
            judge(Some(&ours), &manifest(6, "theirs"), 3, None),
            Verdict::Diverged(_)
        ));
        assert_eq!(
            judge(Some(&at(5)), &manifest(9, "a"), 0, None),
            Verdict::Stale
        );
        assert!(matches!(
            judge(Some(&at(5)), &manifest(9, "a"), 1, None),
            Verdict::Diverged(m) if m.contains("generation 9") && m.contains("base 5")
        ));
        assert!(matches!(
            judge(Some(&at(5)), &manifest(2, "a"), 0, None),
            Verdict::Diverged(m) if m.contains("older")
        ));
    }

    #[test]
    fn owner_only_publishes_are_recognised_by_owner_and_generation() {
        let claiming = Base {
            generation: 5,
            publishing: Some((6, OWNER_TAG.into())),
        };
        let owned = |generation, id: &str, claimed_at, released| {
            let mut m = manifest(generation, "a");
            m.owner = Some(ManifestOwner {
                id: id.into(),
                claimed_at,
                released,
            });
            m
        };
        let me = Some("host-a/1");
        // Our claim (at 6) or release (at 6) landed before the crash.
        assert_eq!(
            judge(Some(&claiming), &owned(6, "host-a/1", 6, false), 3, me),
            Verdict::Current
        );
        assert_eq!(
            judge(Some(&claiming), &owned(6, "host-a/1", 2, true), 3, me),
            Verdict::Current
        );
        // Someone else's claim at 6, a flush of ours from an older claim, no owner record, or
        // no owner id of our own: foreign.
        for (m, me) in [
            (owned(6, "host-b/1", 6, false), me),
            (owned(6, "host-a/1", 2, false), me),
            (manifest(6, "a"), me),
            (owned(6, "host-a/1", 6, false), None),
        ] {
            assert!(
                matches!(judge(Some(&claiming), &m, 3, me), Verdict::Diverged(_)),
                "{m:?} {me:?}"
            );
        }
        // A later generation is foreign whatever it says.
        assert!(matches!(
            judge(Some(&claiming), &owned(7, "host-a/1", 7, false), 3, me),
            Verdict::Diverged(_)
        ));
        // The tag round-trips through the file.
        let dir = tempfile::tempdir().unwrap();
        store(dir.path(), &claiming).unwrap();
        assert_eq!(load(dir.path()).unwrap(), Some(claiming));
    }
}
