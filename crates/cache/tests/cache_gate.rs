//! The rotation gate is never re-locked by a guard holder: work a request does while it keeps
//! its `Gate` (a deferred zero-copy read fetching a cold block and filling it) must not wait
//! for a rotation queued behind that very gate.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use glidefs_cache::*;

const BS: u32 = 16 * 1024;

#[test]
fn fill_while_holding_the_gate_does_not_wait_for_a_queued_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let geo = Geometry::new(8 * BS as u64, BS).unwrap();
    let c = Arc::new(Cache::open(dir.path(), geo, CacheOptions::default()).unwrap());
    c.write(BS as u64, &[3; 4096]).unwrap(); // something to rotate
    c.set_remote([0]); // block 0 lives only in the object store
    let fetched = vec![7u8; BS as usize];

    let gate = c.enter(); // the in-flight request's keepalive
    let rotator = std::thread::spawn({
        let c = c.clone();
        move || c.rotate().map(|r| r.is_some())
    });
    std::thread::sleep(Duration::from_millis(200)); // the rotation now waits for our gate
    let (tx, rx) = mpsc::channel();
    let filler = std::thread::spawn({
        let (c, fetched) = (c.clone(), fetched.clone());
        move || {
            let token = c.fill_token();
            tx.send(c.fill_clean(token, 0, &fetched).map_err(|e| e.to_string()))
                .unwrap();
        }
    });
    let stored = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("fill_clean waited for the rotation queued behind the caller's gate: deadlock");
    assert_eq!(stored, Ok(true));
    // the fetched block is served from the clean file under the same gate
    let mut buf = vec![0; BS as usize];
    assert_eq!(
        c.read_with(&gate, 0, &mut buf, &[]).unwrap(),
        ReadOutcome::Done
    );
    assert_eq!(buf, fetched);
    drop(gate);
    assert!(rotator.join().unwrap().unwrap(), "the rotation then runs");
    filler.join().unwrap();
    let mut buf = vec![0; 4096];
    c.read_into(BS as u64, &mut buf, &[]).unwrap();
    assert_eq!(buf, vec![3; 4096]);
}
