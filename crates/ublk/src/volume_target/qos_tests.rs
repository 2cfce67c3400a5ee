//! QoS at the target's dispatch (see `crate::qos` for the buckets themselves): a request the
//! limits hold back is served after its wait, on the fast path when it can, else on the
//! deferred paths, and recorded once; and a device that stops
//! or detaches does not wait out (or run after) a wait of minutes. Found by review: a request
//! admitted at a low rate slept its whole wait, so `VolumeDevice::stop` held STOP_DEV for
//! its 10 s, then failed its 30 s drain (`TargetError::Drain`: a remove left the volume
//! `failed` with its tail unflushed, a shutdown left it unclosed), and the task served the
//! request after the device was gone.
//!
//! Driven like the queue loop (the `Harness`), one OS thread per outstanding request.

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use glidefs_model::api::{QosLimit, QosLimits};
use glidefs_testkit::noise;
use glidefs_volume::cache::BlockState;
use parking_lot::Mutex;
use ublk_core::testing::Harness;
use ublk_core::IoOp;

use super::device::drain;
use super::keep_tests::{landed, queue_writer, syncing_block_4, Checked, HANG};
use super::tests::{fixture_with, io, Fixture, BS};

fn fixture() -> Fixture {
    fixture_with(Arc::new(object_store::memory::InMemory::new()), None, 4)
}

fn limit(rate: u64, burst: u64) -> Option<QosLimit> {
    Some(QosLimit {
        rate,
        burst: Some(burst),
    })
}

/// Limits of `rate` bytes per second with a `burst`, on reads and on writes.
fn bytes_limits(rate: u64, burst: u64) -> QosLimits {
    QosLimits {
        read_bytes: limit(rate, burst),
        write_bytes: limit(rate, burst),
        ..QosLimits::default()
    }
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed))
        .collect()
}

/// Waits (bounded) until `cond` holds.
fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let until = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

#[test]
fn throttled_requests_take_the_fast_path_after_their_wait_when_they_can_and_are_recorded_once() {
    let f = fixture();
    // 512 KiB/s with a 4 KiB burst: every 8 KiB request below waits (at least 7.8 ms).
    f.target.set_qos(&bytes_limits(512 << 10, 4096));
    let mut lp = Harness::default();
    let data = pattern(11, 16384);
    let plain = io(IoOp::Write, 2 * BS, 8192, 0);
    let mut fua = io(IoOp::Write, 2 * BS + 8192, 8192, 1);
    fua.flags = 1 << 13; // UBLK_IO_F_FUA
    assert!(fua.fua());
    let started = Instant::now();
    assert_eq!(
        lp.run(&f.target, plain, &mut data[..8192].to_vec()),
        Ok(8192)
    );
    assert_eq!(lp.run(&f.target, fua, &mut data[8192..].to_vec()), Ok(8192));
    let mut back = vec![0u8; 16384];
    let read = io(IoOp::Read, 2 * BS, 16384, 2);
    assert_eq!(lp.run(&f.target, read, &mut back), Ok(16384));
    assert!(
        back == data,
        "a throttled READ returns the throttled WRITEs' bytes"
    );
    // 32 KiB against a 4 KiB burst at 512 KiB/s: at least 2 x 7.8 ms of writes, then reads
    // 12 KiB over their own burst (23.4 ms)
    assert!(started.elapsed() >= Duration::from_millis(30));
    drain(&f.target, "t", "test", Duration::from_secs(10)).unwrap();
    let s = f.target.stats();
    assert_eq!(s.throttled, 3);
    assert!(s.throttled_ns >= 30_000_000, "{} ns", s.throttled_ns);
    let (w, r) = (s.op(IoOp::Write), s.op(IoOp::Read));
    assert_eq!(
        (w.count, w.errors, w.bytes),
        (2, 0, 16384),
        "each WRITE recorded once"
    );
    assert_eq!(
        (r.count, r.errors, r.bytes),
        (1, 0, 16384),
        "the READ recorded once"
    );
    assert_eq!(s.fua_writes, 1, "the throttled FUA WRITE was made durable");
    // After its wait each request tries the fast path: the first WRITE (a partial write of
    // a fresh block: file I/O first) goes on to the deferred path; the FUA WRITE into the
    // block the first one made Dirty and the READ of local data run on the fast path,
    // their chunks submitted from the waiting task (counted inline). 3 deferred at
    // dispatch, 1 for the FUA write's durability (and any commit deferred to the commit
    // lane).
    assert_eq!(
        s.inline, 2,
        "the FUA WRITE and the READ ran on the fast path"
    );
    assert!(s.deferred >= 4, "{} deferred", s.deferred);
}

#[test]
fn a_stop_serves_throttled_requests_at_once_instead_of_outwaiting_the_drain() {
    let f = fixture();
    // 1 byte per second: a 4 KiB request waits 4,095 s, far past STOP_DEV's 10 s and
    // `stop`'s 30 s drain.
    f.target.set_qos(&bytes_limits(1, 1));
    let data = pattern(3, 4096);
    let want = data.clone();
    let (written, (read, got)) = std::thread::scope(|s| {
        let write = s.spawn(|| {
            let mut buf = data.clone();
            Harness::default().run(&f.target, io(IoOp::Write, BS, 4096, 0), &mut buf)
        });
        let read = s.spawn(|| {
            let mut buf = vec![0xAAu8; 4096];
            let r = Harness::default().run(&f.target, io(IoOp::Read, 3 * BS, 4096, 1), &mut buf);
            (r, buf)
        });
        // Both wait for the limits, deferred and in flight.
        wait_until("two throttled requests", || {
            f.target.stats().throttled == 2 && f.target.in_flight() == 2
        });
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(f.target.in_flight(), 2, "they wait");
        // What `VolumeDevice::stop` and `detach` do: the waits end first, then the drain
        // (bounded here like STOP_DEV's wait for the requests the target holds).
        f.target.unthrottle();
        drain(&f.target, "t", "stop", Duration::from_secs(10))
            .expect("a stopping device's throttled requests are served at once");
        (write.join().unwrap(), read.join().unwrap())
    });
    assert_eq!(written, Ok(4096), "the WRITE is served, not failed");
    assert_eq!(read, Ok(4096), "the READ is served, not failed");
    assert!(
        got.iter().all(|&b| b == 0),
        "a never written range reads zeroes"
    );
    let mut back = vec![0u8; 4096];
    f.rt.block_on(f.volume.read(BS, &mut back)).unwrap();
    assert!(back == want, "the WRITE landed before the drain ended");
    // A request arriving once the device is stopping does not wait either.
    let mut lp = Harness::default();
    let started = Instant::now();
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        lp.run(&f.target, io(IoOp::Read, BS, 4096, 2), &mut buf),
        Ok(4096)
    );
    assert!(buf == want);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(f.target.stats().throttled, 3);
}

#[test]
fn a_limit_raised_live_releases_the_requests_the_old_one_held() {
    let f = fixture();
    // 1 byte per second: a 4 KiB write waits 4,095 s under it. Found by review: raising the
    // limit left waiting requests (and the buckets' debt) at the old limit's wait.
    f.target.set_qos(&bytes_limits(1, 1));
    let data = pattern(7, 4096);
    let written = std::thread::scope(|s| {
        let write = s.spawn(|| {
            let mut buf = data.clone();
            Harness::default().run(&f.target, io(IoOp::Write, BS, 4096, 0), &mut buf)
        });
        wait_until("a throttled write", || {
            f.target.stats().throttled == 1 && f.target.in_flight() == 1
        });
        // 100 MiB/s: the waiting write is admitted again and runs at once.
        f.target.set_qos(&bytes_limits(100 << 20, 1 << 20));
        drain(&f.target, "t", "test", Duration::from_secs(10))
            .expect("the raised limit released the waiting write");
        write.join().unwrap()
    });
    assert_eq!(written, Ok(4096));
    let mut back = vec![0u8; 4096];
    let mut lp = Harness::default();
    assert_eq!(
        lp.run(&f.target, io(IoOp::Read, BS, 4096, 1), &mut back),
        Ok(4096)
    );
    assert!(back == data, "the released write landed");
    // and the next request does not inherit the old limit's debt
    let started = Instant::now();
    assert_eq!(
        lp.run(
            &f.target,
            io(IoOp::Write, 2 * BS, 4096, 2),
            &mut data.clone()
        ),
        Ok(4096)
    );
    assert!(started.elapsed() < Duration::from_secs(60));
    assert_eq!(
        f.target.stats().throttled,
        1,
        "nothing waited under the new limits"
    );
}

/// The result of a gate writer queued by a request's check (a rotation's blocks, or none).
type Queued = mpsc::Receiver<Result<Vec<u64>, String>>;

/// A throttled request served on the fast path after its wait takes its gate (and a
/// WRITE's ticket) on the runtime task and hands them to the loop with its chunks: they are
/// held until its hook, as for a request served inline. Found delicate by review (the gate
/// and ticket are taken off the loop thread): a READ of a Syncing block reads the flushing
/// file, and the flush completion asked for after its chunks waits for its hook; a full-block
/// WRITE to a fresh block (committed in the commit lane: a WAL record) lands in its gate's
/// active file, and a rotation asked for after its chunk waits for that commit and then
/// moves the written block.
#[test]
fn throttled_requests_on_the_fast_path_hold_their_gate_until_their_hooks() {
    let f = fixture();
    let cache = Arc::clone(f.volume.cache());
    let old = noise(61, BS as usize);
    let rot = syncing_block_4(&f, &old);
    // 4 MiB/s with a 4 KiB burst: both requests below wait (READ 2 ms, WRITE 16 ms).
    f.target.set_qos(&bytes_limits(4 << 20, 4096));
    let queued: Arc<Mutex<Vec<Queued>>> = Arc::default();
    let landed_in = Arc::new(Mutex::new(None));
    let new = noise(62, BS as usize);
    let target = {
        let (cache, rot, queued) = (Arc::clone(&cache), Arc::clone(&rot), Arc::clone(&queued));
        let (landed_in, new) = (Arc::clone(&landed_in), new.clone());
        Checked::new(&f, move |io, keep| {
            let rx = match io.op {
                IoOp::Read => {
                    assert!(
                        keep.gate.flushing_arc().is_some(),
                        "the READ's gate names the flushing file"
                    );
                    let rot = Arc::clone(&rot);
                    let rx = queue_writer(&cache, move |c| {
                        c.complete_flush(&rot)
                            .map(|()| Vec::new())
                            .map_err(|e| e.to_string())
                    });
                    assert_eq!(cache.block_info(4).state, BlockState::Syncing);
                    rx
                }
                _ => {
                    *landed_in.lock() = Some(landed(io, keep, &new));
                    let rx = queue_writer(&cache, |c| {
                        c.rotate()
                            .map(|r| r.map(|r| r.blocks().to_vec()).unwrap_or_default())
                            .map_err(|e| e.to_string())
                    });
                    assert_eq!(cache.block_info(9).state, BlockState::NotPresent);
                    rx
                }
            };
            queued.lock().push(rx);
        })
    };
    let mut lp = Harness::default();
    // The READ: served from the flushing file; the flush completes only after its hook.
    let mut buf = vec![0xAAu8; 8192];
    assert_eq!(
        lp.run(&target, io(IoOp::Read, 4 * BS + 4096, 8192, 0), &mut buf),
        Ok(8192)
    );
    assert!(
        buf[..] == old[4096..4096 + 8192],
        "the READ returned other bytes"
    );
    let rx = queued.lock().pop().expect("the READ's check ran");
    rx.recv_timeout(HANG)
        .expect("the flush completion never ran after the READ")
        .expect("the flush completion");
    assert_eq!(cache.block_info(4).state, BlockState::Clean);
    // The WRITE: a whole fresh block (no file I/O first, so the fast path takes it); the
    // rotation runs only after its commit and moves the block it wrote.
    let mut buf = new.clone();
    assert_eq!(
        lp.run(&target, io(IoOp::Write, 9 * BS, BS as u32, 1), &mut buf),
        Ok(BS as i32)
    );
    let rx = queued.lock().pop().expect("the WRITE's check ran");
    let blocks = rx
        .recv_timeout(HANG)
        .expect("the rotation never ran after the WRITE's commit")
        .expect("the rotation");
    assert_eq!(blocks, vec![9], "the rotation saw the committed write");
    let gate = cache.enter();
    let flushing = gate.flushing_arc().expect("a flushing file");
    let landed_in = landed_in.lock().take().expect("the WRITE's check ran");
    assert!(
        Arc::ptr_eq(flushing, &landed_in),
        "the chunk's file is the one the rotation moved"
    );
    drop(gate);
    let mut back = vec![0u8; BS as usize];
    f.rt.block_on(f.volume.read(9 * BS, &mut back)).unwrap();
    assert!(back == new, "the volume reads the WRITE back");
    drain(&f.target, "t", "test", Duration::from_secs(10)).unwrap();
    let s = f.target.stats();
    assert_eq!(s.throttled, 2, "both requests waited");
    // Both ran on the fast path after their wait (counted inline); deferred: each at
    // dispatch, and the WRITE's commit (its block turned Dirty: a WAL record).
    assert_eq!((s.inline, s.deferred), (2, 3));
}
