//! A read-only export adopting a newer map that unmaps a block clears the block's remote bit
//! and drops its Clean copy (`Cache::drop_clean`). A fill of that block that passed its
//! token check before the adoption sets the remote bit again when it stores its copy (a
//! fetched block has a copy in the store, as far as the fill knows). `drop_clean` waits such
//! a fill out; the bit it set must go with the copy, or the block reads as "remote" with no
//! location in the map: every later read of it fails (found by the multi-host simulation,
//! `volume_sim`, as an export's EIO after a writer discarded a block).

use std::sync::{Arc, Barrier};
use std::time::Duration;

use glidefs_cache::*;

const BS: u32 = 16 * 1024;
const B: u64 = BS as u64;

/// Stops the first fill inside its critical section (after its token check, before it
/// stores its copy) until the test lets it go.
#[derive(Debug)]
struct PauseFill {
    inside: Barrier,
    go: Barrier,
    armed: std::sync::atomic::AtomicBool,
}

impl CrashHook for PauseFill {
    fn should_crash(&self, _point: CrashPoint) -> bool {
        false
    }

    fn io_fault(&self, op: IoOp) -> Option<std::io::Error> {
        if op == IoOp::Fill && self.armed.swap(false, std::sync::atomic::Ordering::SeqCst) {
            self.inside.wait();
            self.go.wait();
        }
        None
    }
}

#[test]
fn a_fill_past_its_check_leaves_no_remote_bit_on_a_block_the_new_map_unmapped() {
    let dir = tempfile::tempdir().unwrap();
    let hook = Arc::new(PauseFill {
        inside: Barrier::new(2),
        go: Barrier::new(2),
        armed: true.into(),
    });
    let geo = Geometry::new(16 * B, BS).unwrap();
    let opts = CacheOptions {
        crash_hook: hook.clone(),
    };
    let c = Arc::new(Cache::open(dir.path(), geo, opts).unwrap());
    // Block 5 is in the store (the old map names it).
    c.set_remote([5]);
    // A fetch of block 5 under the old map: token, lookup, bytes; its fill is past the check.
    let token = c.fill_token();
    let filler = {
        let c = c.clone();
        std::thread::spawn(move || c.fill_clean(token, 5, &vec![7; BS as usize]).unwrap())
    };
    hook.inside.wait();
    // The export adopts a map that unmaps block 5: the bit goes under the map's lock, then
    // the Clean copies of the changed blocks are dropped (this waits for the fill).
    c.clear_remote([5]);
    let dropper = {
        let c = c.clone();
        std::thread::spawn(move || c.drop_clean(&[5], &[5]).unwrap())
    };
    std::thread::sleep(Duration::from_millis(50));
    hook.go.wait();
    let stored = filler.join().unwrap();
    dropper.join().unwrap();
    assert!(stored, "the fill was past its check");
    let info = c.block_info(5);
    assert_eq!(info.state, BlockState::NotPresent, "its copy was dropped");
    assert!(
        !info.remote,
        "block 5 is marked remote, but the map it is served under has no location for it"
    );
    // It reads as zeros, as the new map says, without asking the store.
    let mut buf = vec![0xAA; BS as usize];
    assert_eq!(
        c.read_into(5 * B, &mut buf, &[]).unwrap(),
        ReadOutcome::Done
    );
    assert!(buf.iter().all(|&b| b == 0));
}

/// Blocks the new map still names keep their remote bit through the drop (only `unmapped`
/// lose it), and a block that was never Clean is left as it is.
#[test]
fn drop_clean_clears_the_remote_bit_of_the_unmapped_blocks_only() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(16 * B, BS).unwrap();
    let c = Cache::open(dir.path(), geo, CacheOptions::default()).unwrap();
    c.set_remote([1, 2, 3]);
    for b in [1, 2] {
        assert!(c
            .fill_clean(c.fill_token(), b, &vec![b as u8; BS as usize])
            .unwrap());
    }
    // 1 moved (mapped elsewhere now), 2 and 3 unmapped; 3 was never cached.
    assert_eq!(c.drop_clean(&[1, 2, 3], &[2, 3]).unwrap(), 2);
    let got: Vec<(BlockState, bool)> = (1..=3)
        .map(|b| (c.block_info(b).state, c.block_info(b).remote))
        .collect();
    assert_eq!(
        got,
        vec![
            (BlockState::NotPresent, true),
            (BlockState::NotPresent, false),
            (BlockState::NotPresent, false)
        ]
    );
}
