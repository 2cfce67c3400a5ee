//! Online resize of the cache (`Cache::grow`): given a cache with flushed data, when it grows
//! (and crashes at each step of the grow, or after writes past the old end), then it reopens
//! at one of the two sizes with every flushed write intact, and at the new size once the grow
//! returned; shrinking and sizes off the block grid are refused.

use std::sync::Arc;

use glidefs_cache::*;
use glidefs_testkit::pattern;

const BS: u32 = 16 * 1024;
const OLD: u64 = 8 * BS as u64;
const NEW: u64 = 20 * BS as u64;

fn open_at(dir: &std::path::Path, size: u64) -> Result<Cache> {
    Cache::open(dir, Geometry::new(size, BS)?, CacheOptions::default())
}

fn open_hooked(dir: &std::path::Path, size: u64, hook: Arc<dyn CrashHook>) -> Cache {
    Cache::open(
        dir,
        Geometry::new(size, BS).unwrap(),
        CacheOptions { crash_hook: hook },
    )
    .unwrap()
}

fn read(c: &Cache, off: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0xAA; len];
    assert_eq!(c.read_into(off, &mut buf, &[]).unwrap(), ReadOutcome::Done);
    buf
}

/// Data before the old end: one block written and flushed, one straddling two blocks.
fn write_old(c: &Cache) -> (Vec<u8>, Vec<u8>) {
    let a = pattern(1, 1, BS as usize);
    let b = pattern(1, 2, BS as usize + 4096);
    c.write(0, &a).unwrap();
    c.write(OLD - BS as u64 - 4096, &b).unwrap();
    c.flush().unwrap();
    (a, b)
}

fn check_old(c: &Cache, a: &[u8], b: &[u8]) {
    assert_eq!(read(c, 0, a.len()), a);
    assert_eq!(read(c, OLD - BS as u64 - 4096, b.len()), b);
}

#[test]
fn grown_cache_takes_writes_past_the_old_end_and_keeps_them_across_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let tail = pattern(2, 7, 3 * BS as usize + 512);
    let (a, b) = {
        let c = open_at(dir.path(), OLD).unwrap();
        let (a, b) = write_old(&c);
        assert!(
            matches!(
                c.write(OLD, &tail[..4096]),
                Err(CacheError::OutOfRange { size: OLD, .. })
            ),
            "past the end before the grow"
        );
        let g = c.grow(NEW).unwrap();
        assert_eq!(g.volume_size(), NEW);
        assert_eq!(c.geometry().num_blocks(), NEW / u64::from(BS));
        assert_eq!(
            read(&c, OLD, 8192),
            vec![0; 8192],
            "new blocks read as zeros"
        );
        // Straddles the old end, and reaches the new end exactly.
        c.write(OLD - 512, &tail).unwrap();
        c.write(NEW - 4096, &tail[..4096]).unwrap();
        assert!(
            c.write(NEW - 4096, &tail[..8192]).is_err(),
            "past the new end"
        );
        c.flush().unwrap();
        check_old(&c, &a, &b[..b.len() - 512]);
        c.die(); // crash: only what the flush made durable counts
        (a, b)
    };
    let c = open_at(dir.path(), NEW).unwrap();
    assert_eq!(c.geometry().volume_size(), NEW);
    check_old(&c, &a, &b[..b.len() - 512]);
    assert_eq!(read(&c, OLD - 512, tail.len()), tail);
    assert_eq!(read(&c, NEW - 4096, 4096), &tail[..4096]);
    // The new size is what the directory records: opening at the old one is a shrink.
    drop(c);
    assert!(matches!(
        open_at(dir.path(), OLD),
        Err(CacheError::GeometryMismatch { .. })
    ));
    // The data also survives a flush to the store and a checkpoint after the grow.
    let c = open_at(dir.path(), NEW).unwrap();
    let rot = c.rotate().unwrap().expect("dirty blocks");
    let mut buf = vec![0; BS as usize];
    for i in 0..rot.blocks().len() {
        c.read_for_flush(&rot, i, &mut buf).unwrap();
    }
    c.complete_flush(&rot).unwrap();
    c.checkpoint().unwrap();
    drop(c);
    let c = open_at(dir.path(), NEW).unwrap();
    assert_eq!(read(&c, OLD - 512, tail.len()), tail);
}

#[test]
fn shrinking_and_off_grid_sizes_are_refused_and_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = open_at(dir.path(), OLD).unwrap();
    let (a, b) = write_old(&c);
    let err = c.grow(OLD - u64::from(BS)).unwrap_err();
    assert!(
        matches!(err, CacheError::Shrink { current: OLD, requested } if requested == OLD - u64::from(BS)),
        "{err}"
    );
    assert_eq!(err.kind(), CacheErrorKind::InvalidInput);
    let msg = err.to_string();
    assert!(msg.contains(&OLD.to_string()) && msg.contains(&(OLD - u64::from(BS)).to_string()));
    let err = c.grow(OLD + 4096).unwrap_err();
    assert!(matches!(err, CacheError::InvalidGeometry(_)), "{err}");
    assert_eq!(c.grow(OLD).unwrap().volume_size(), OLD, "same size: no-op");
    assert_eq!(c.geometry().volume_size(), OLD);
    drop(c);
    let c = open_at(dir.path(), OLD).unwrap();
    check_old(&c, &a, &b);
}

/// A crash at each step of the grow: before the new checkpoint is durable the directory
/// reopens at the old size (or, asked for the new one, grows at open), after it at the new
/// size only; flushed data survives either way.
#[test]
fn a_crash_during_the_grow_reopens_at_one_of_the_two_sizes() {
    for (point, durable) in [
        (CrashPoint::BeforeCheckpoint, false),
        (CrashPoint::AfterCheckpoint, true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let hook = Arc::new(CrashAt::new(point, 0));
        let (a, b) = {
            let c = open_hooked(dir.path(), OLD, hook.clone());
            let (a, b) = write_old(&c);
            assert!(
                matches!(c.grow(NEW), Err(CacheError::Crashed(p)) if p == point),
                "{point:?}"
            );
            assert!(hook.fired());
            // The grow never took effect in memory.
            assert_eq!(c.geometry().volume_size(), OLD);
            (a, b)
        };
        if durable {
            assert!(
                matches!(
                    open_at(dir.path(), OLD),
                    Err(CacheError::GeometryMismatch { .. })
                ),
                "{point:?}: the new size is recorded"
            );
        } else {
            let c = open_at(dir.path(), OLD).unwrap();
            check_old(&c, &a, &b);
            assert!(c.write(OLD, &[1; 4096]).is_err(), "{point:?}: old size");
        }
        // Asking for the new size works in both cases (a grow recorded by the caller first
        // is completed at open).
        let c = open_at(dir.path(), NEW).unwrap();
        check_old(&c, &a, &b);
        let tail = pattern(3, 1, 4096);
        c.write(NEW - 4096, &tail).unwrap();
        c.flush().unwrap();
        drop(c);
        let c = open_at(dir.path(), NEW).unwrap();
        assert_eq!(read(&c, NEW - 4096, 4096), tail, "{point:?}");
        check_old(&c, &a, &b);
    }
}

/// Writes in flight on other threads while the cache grows neither fail nor get lost.
#[test]
fn grow_runs_alongside_writes() {
    let dir = tempfile::tempdir().unwrap();
    let c = Arc::new(open_at(dir.path(), OLD).unwrap());
    let data = pattern(4, 1, 4096);
    std::thread::scope(|s| {
        let w = s.spawn(|| {
            for i in 0..200u64 {
                let off = (i % (OLD / 4096)) * 4096;
                c.write(off, &data).unwrap();
            }
        });
        c.grow(NEW).unwrap();
        w.join().unwrap();
    });
    c.write(NEW - 4096, &data).unwrap();
    c.flush().unwrap();
    for off in (0..OLD).step_by(4096) {
        assert_eq!(read(&c, off, 4096), data, "offset {off}");
    }
    assert_eq!(read(&c, NEW - 4096, 4096), data);
}
