//! `Cache::stats` is kept by counters on every state transition (O(1)), not by a scan: after
//! each kind of transition, and after recovery, it must equal a scan of the state map.

use glidefs_cache::*;

const BS: u32 = 4096;
const BLOCKS: u64 = 16;

/// `CacheStats` computed by looking at every block.
fn scan(c: &Cache) -> CacheStats {
    let mut s = CacheStats::default();
    for b in 0..c.geometry().num_blocks() {
        let i = c.block_info(b);
        match i.state {
            BlockState::NotPresent => s.not_present += 1,
            BlockState::Clean => s.clean += 1,
            BlockState::Dirty => s.dirty += 1,
            BlockState::Syncing => s.syncing += 1,
        }
        s.remote += u64::from(i.remote);
    }
    s
}

fn check(c: &Cache, ctx: &str, expect: (u64, u64, u64, u64, u64)) {
    let s = c.stats();
    assert_eq!(s, scan(c), "{ctx}: counters differ from a scan");
    assert_eq!(
        (s.not_present, s.clean, s.dirty, s.syncing, s.remote),
        expect,
        "{ctx}: (not_present, clean, dirty, syncing, remote)"
    );
}

#[test]
fn stats_follow_every_transition_and_recovery() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(BLOCKS * u64::from(BS), BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    check(&c, "fresh", (16, 0, 0, 0, 0));

    // Blocks 0..4 written (Dirty); block 1 twice (no transition the second time).
    for b in 0..4u64 {
        assert_eq!(
            c.write(b * u64::from(BS), &[b as u8 + 1; 100]).unwrap(),
            WriteOutcome::Done
        );
    }
    c.write(u64::from(BS), &[9; 100]).unwrap();
    check(&c, "written", (12, 0, 4, 0, 0));

    // Rotation: Dirty -> Syncing; a write during the flush makes block 0 Dirty again.
    let rot = c.rotate().unwrap().expect("dirty blocks");
    check(&c, "rotated", (12, 0, 0, 4, 0));
    c.write(0, &[7; 100]).unwrap();
    check(&c, "promoted during the flush", (12, 0, 1, 3, 0));
    let mut buf = vec![0; BS as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
    // Syncing -> Clean + REMOTE; block 0 stays Dirty but its old copy is remote now.
    check(&c, "flush completed", (12, 3, 1, 0, 4));

    // Remote blocks from a manifest (one already remote), then a fill.
    c.set_remote([1, 8, 9]);
    check(&c, "set_remote", (12, 3, 1, 0, 6));
    assert!(c.fill_clean(c.fill_token(), 8, &[8; BS as usize]).unwrap());
    check(&c, "filled", (11, 4, 1, 0, 6));

    // Eviction: Clean -> NotPresent (REMOTE stays).
    let evicted = c.evict_to(2 * u64::from(BS)).unwrap();
    assert_eq!(evicted, 3);
    check(&c, "evicted", (14, 1, 1, 0, 6));

    // Recovery rebuilds the counters from the checkpoint + log.
    c.flush().unwrap();
    drop(c);
    // (REMOTE bits are not all logged: the volume re-marks the manifest's blocks at open.)
    let reopen = || {
        let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
        assert_eq!(c.stats(), scan(&c), "reopened: counters differ from a scan");
        c.set_remote([0, 1, 2, 3, 8, 9]);
        c
    };
    let c = reopen();
    check(&c, "reopened", (14, 1, 1, 0, 6));
    c.checkpoint().unwrap();
    drop(c);
    let c = reopen();
    check(&c, "reopened from a checkpoint", (14, 1, 1, 0, 6));
}
