//! Power loss: after a crash some files lose their unsynced writes (a file keeps an older
//! length or older bytes) while the WAL keeps records that reached the disk. `Cache::open`
//! must still open, every block must read its last acknowledged content, and the volume must
//! be able to flush again (`read_for_flush` works).

use glidefs_cache::*;

const BS: u32 = 16 * 1024;
const SIZE: u64 = 64 * BS as u64;

fn geo() -> Geometry {
    Geometry::new(SIZE, BS).unwrap()
}

fn open(dir: &std::path::Path) -> Cache {
    Cache::open(dir, geo(), CacheOptions::default()).unwrap()
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8) | 1)
        .collect()
}

/// Given a fetched block whose Fill record reached the WAL but whose bytes did not reach
/// `clean.data` (the file never grew on disk), when the cache is opened, then it opens and the
/// block is remote again (fetched when needed), not an error that fails the volume.
#[test]
fn fill_record_past_the_end_of_the_clean_file_drops_the_block_back_to_remote() {
    let dir = tempfile::tempdir().unwrap();
    let block = 9u64;
    {
        let c = open(dir.path());
        c.set_remote([block]);
        assert!(c
            .fill_clean(c.fill_token(), block, &pattern(4, BS as usize))
            .unwrap());
        c.flush().unwrap(); // the Fill record is in the WAL on disk
        c.die();
    }
    // Power loss: the clean file's growth never reached the disk.
    let clean = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.path().join("clean.data"))
        .unwrap();
    clean.set_len(0).unwrap();
    drop(clean);
    let c = Cache::open(dir.path(), geo(), CacheOptions::default())
        .expect("recovery must not fail on a fill whose bytes were lost");
    let info = c.block_info(block);
    assert_eq!(info.state, BlockState::NotPresent);
    assert!(
        info.remote,
        "the block must be fetched again from the store"
    );
    let mut buf = vec![0; BS as usize];
    assert_eq!(
        c.read_into(block * BS as u64, &mut buf, &[]).unwrap(),
        ReadOutcome::NeedsFetch(vec![block])
    );
    // And the cache works on: a write, a flush.
    c.write(0, &pattern(5, 4096)).unwrap();
    c.flush().unwrap();
}
