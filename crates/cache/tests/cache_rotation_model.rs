//! The pending rotation across crashes, checked against a model: random writes (partial,
//! whole, across two blocks, zeros written or punched), rotations, failed and completed
//! uploads, checkpoints, process crashes after a FLUSH and power losses back to the last
//! FLUSH. After every recovery the pending rotation names exactly the blocks of the lost one
//! (promoted ones too, see `state`'s `ROTATED`), every upload reads each block as of its
//! rotation, and every block reads its last acknowledged bytes. With the promoted blocks left
//! out of a recovered rotation (the code before the mark) seed 1 fails at step 12.
//!
//! `GLIDEFS_ROTATION_SEEDS` (default 12) seeds per mode.

use std::collections::{BTreeMap, BTreeSet};

use glidefs_cache::*;
use glidefs_testkit::pattern;
use glidefs_testkit::rng::Rng;

mod support;
use support::{data_files, power_loss};

const BS: u32 = 16 * 1024;
const N: u64 = 8;
const SIZE: u64 = N * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(dir, geo(), CacheOptions::default()).unwrap()
}

/// Every data file's bytes at a moment (`support::data_files`).
type DiskImage = Vec<(std::path::PathBuf, Vec<u8>)>;

#[derive(Clone, Debug)]
struct Model {
    cur: Vec<Vec<u8>>,
    /// Blocks Dirty now (written since the last rotation).
    dirty: BTreeSet<u64>,
    /// The pending rotation: its blocks as of the rotation.
    pending: Option<BTreeMap<u64, Vec<u8>>>,
    /// What the store holds.
    store: Vec<Vec<u8>>,
}

impl Model {
    fn new() -> Self {
        Self {
            cur: vec![vec![0; BS as usize]; N as usize],
            dirty: BTreeSet::new(),
            pending: None,
            store: vec![vec![0; BS as usize]; N as usize],
        }
    }
}

fn fetched(m: &Model) -> Vec<(u64, Vec<u8>)> {
    (0..N).map(|b| (b, m.store[b as usize].clone())).collect()
}

fn check_reads(c: &Cache, m: &Model, what: &str) {
    let store = fetched(m);
    let f: Vec<Fetched<'_>> = store
        .iter()
        .map(|(b, d)| Fetched { block: *b, data: d })
        .collect();
    for b in 0..N {
        let mut buf = vec![0xAA; BS as usize];
        assert_eq!(
            c.read_into(b * BS as u64, &mut buf, &f).unwrap(),
            ReadOutcome::Done
        );
        assert!(
            buf == m.cur[b as usize],
            "{what}: block {b} reads other bytes"
        );
    }
}

fn do_write(c: &Cache, m: &Model, off: u64, data: &[u8], zero: bool) {
    for _ in 0..4 {
        let r = if zero {
            c.zero(off, data.len() as u64).unwrap()
        } else {
            c.write(off, data).unwrap()
        };
        match r {
            WriteOutcome::Done => return,
            WriteOutcome::NeedsFetch(blocks) => {
                for b in blocks {
                    let t = c.fill_token();
                    c.fill_clean(t, b, &m.store[b as usize]).unwrap();
                }
            }
        }
    }
    panic!("write never done");
}

/// Reads the pending rotation as an upload would; checks every block as of the rotation.
fn upload(c: &Cache, m: &Model, what: &str) -> Option<std::sync::Arc<Rotation>> {
    let rot = c.pending_flush()?;
    let Some(want) = m.pending.as_ref() else {
        panic!("{what}: the cache has a pending rotation, the model none");
    };
    let keys: Vec<u64> = want.keys().copied().collect();
    assert_eq!(rot.blocks(), &keys[..], "{what}: rotation blocks");
    for (i, &b) in rot.blocks().iter().enumerate() {
        let mut buf = vec![0; BS as usize];
        let zero = c.read_for_flush(&rot, i, &mut buf).unwrap();
        assert_eq!(zero, buf.iter().all(|&x| x == 0));
        assert!(buf == want[&b], "{what}: block {b} not as of its rotation");
    }
    Some(rot)
}

/// After a recovery: the pending rotation names the model's blocks (none when it has none),
/// reads each as of the rotation, and every block reads its acknowledged bytes.
fn check_recovered(c: &Cache, m: &Model, what: &str) {
    let want: Vec<u64> = m
        .pending
        .as_ref()
        .map(|p| p.keys().copied().collect())
        .unwrap_or_default();
    let got: Vec<u64> = c
        .pending_flush()
        .map(|r| r.blocks().to_vec())
        .unwrap_or_default();
    assert_eq!(got, want, "{what}: recovered rotation");
    assert_eq!(
        c.pending_flush().is_some(),
        m.pending.is_some(),
        "{what}: pending"
    );
    check_reads(c, m, what);
    upload(c, m, what);
}

fn seeds() -> u64 {
    std::env::var("GLIDEFS_ROTATION_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12)
}

fn run(seed: u64, power: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng(seed | 1);
    let mut c = open(dir.path());
    let mut m = Model::new();
    let mut gen = 1u64;
    // Power loss: the model and disk as of the last FLUSH, and whether only non-syncing
    // operations happened since.
    let mut snap: Option<(Model, DiskImage)> = None;
    for step in 0..400 {
        let what = format!("seed {seed} step {step}");
        let quiet = snap.is_some(); // power mode: no syncs until the power loss
        match rng.below(20) {
            0..=6 => {
                // A write inside one block or across two, partial or whole, sometimes zeros.
                let b = rng.below(N);
                let page = 4096u64;
                let ppb = BS as u64 / page;
                let start = rng.below(ppb);
                let pages = 1 + rng.below(ppb + if b + 1 < N { ppb } else { 0 } - start);
                let off = b * BS as u64 + start * page;
                let len = (pages * page) as usize;
                gen += 1;
                let zeros = rng.below(5) == 0;
                let data = if zeros {
                    vec![0; len]
                } else {
                    pattern(off, gen, len)
                };
                let as_zero = zeros && rng.below(2) == 0;
                do_write(&c, &m, off, &data, as_zero);
                for (i, byte) in data.iter().enumerate() {
                    let at = off as usize + i;
                    m.cur[at / BS as usize][at % BS as usize] = *byte;
                }
                for x in off / BS as u64..=(off + len as u64 - 1) / BS as u64 {
                    m.dirty.insert(x);
                }
            }
            7..=8 if m.pending.is_none() => {
                let rot = c.rotate().unwrap();
                if m.dirty.is_empty() {
                    assert!(rot.is_none(), "{what}");
                } else {
                    let rot = rot.expect("rotation");
                    let want: Vec<u64> = m.dirty.iter().copied().collect();
                    assert_eq!(rot.blocks(), &want[..], "{what}");
                    m.pending = Some(
                        m.dirty
                            .iter()
                            .map(|&b| (b, m.cur[b as usize].clone()))
                            .collect(),
                    );
                    m.dirty.clear();
                }
            }
            9..=10 => {
                // A failed upload: everything read, nothing completed.
                upload(&c, &m, &what);
            }
            11..=12 if !quiet => {
                if let Some(rot) = upload(&c, &m, &what) {
                    c.complete_flush(&rot).unwrap();
                    for (b, bytes) in m.pending.take().unwrap() {
                        m.store[b as usize] = bytes;
                    }
                }
            }
            13 if !quiet => c.checkpoint().unwrap(),
            14..=15 if !quiet => {
                // Process crash after a FLUSH: everything survives.
                c.flush().unwrap();
                c.die();
                drop(c);
                c = open(dir.path());
                check_recovered(&c, &m, &format!("{what}: after a crash"));
            }
            16..=17 if power => match snap.take() {
                None => {
                    c.flush().unwrap();
                    snap = Some((m.clone(), data_files(dir.path())));
                }
                Some((old, files)) => {
                    c.die();
                    drop(c);
                    power_loss(dir.path(), &files);
                    m = old;
                    c = open(dir.path());
                    check_recovered(&c, &m, &format!("{what}: after a power loss"));
                }
            },
            _ => {}
        }
        if rng.below(8) == 0 {
            check_reads(&c, &m, &what);
        }
        let s = c.stats();
        assert_eq!(s.dirty, m.dirty.len() as u64, "{what}: dirty count");
    }
}

#[test]
fn random_rotations_crashes_and_promotions() {
    for seed in 1..=seeds() {
        run(seed, false);
    }
}

#[test]
fn random_rotations_power_losses_and_promotions() {
    for seed in 1..=seeds() {
        run(seed + 1000, true);
    }
}
