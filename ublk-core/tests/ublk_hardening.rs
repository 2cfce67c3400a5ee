//! Kernel tests for the transport's hardening: FUA reaches the target, is committed (a
//! deferred `after_write`) and made durable before it completes; hand-off under load loses nothing and fails no request (QUIESCE_DEV
//! and the stop-flag fallback, inline and deferred targets, both transports; every tag of a
//! queue held by a stuck target: `detach` is not held up by QUIESCE_DEV, and the abandoned
//! requests are reissued to the successor); a failed
//! recover leaves the device QUIESCED; chunks that under-cover a request and short
//! completions fail the request instead of acknowledging it; START_DEV does not wait on a
//! partition-table read.

use glidefs_testkit::blockdev::{
    fill_block, open_direct, verify_blocks, write_blocks, AlignedBuf, MIB,
};
use glidefs_testkit::process::bounded;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};
use ublk_core::device::STOP_JOIN_TIMEOUT;
use ublk_core::targets::{MemOptions, MemTarget};
use ublk_core::testing::devices::preference;
use ublk_core::{
    Action, Chunk, Deferred, Device, DeviceConfig, DeviceState, Dispatch, DispatchCtx, IoDesc,
    IoOp, Target, Transport,
};

/// The keepalive of every chunked request; its Drop reports a violation when the queue
/// dropped it before the request's chunks were reaped (the after-I/O hook marks it).
struct Probe {
    reaped: bool,
    violations: Arc<AtomicU64>,
}

impl Drop for Probe {
    fn drop(&mut self) {
        if !self.reaped {
            self.violations.fetch_add(1, Ordering::SeqCst);
            eprintln!("VIOLATION: keepalive dropped before its chunks were reaped");
        }
    }
}

/// How the probe target answers requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Serve {
    /// On the queue thread.
    Inline,
    /// Every request deferred to one worker thread, which answers each after `delay` (a slow
    /// target: at a hand-off many requests are in the server).
    Deferred { delay: Duration },
    /// As `Deferred` without delay, but the worker answers nothing while `ProbeTarget::hold`
    /// is set (a stuck target: a cold read in store retries); a token whose queue loop has
    /// returned is finished without touching data (`Deferred::is_abandoned`).
    Held,
}

/// A mem target that probes every keepalive, optionally finishes every request on its own
/// worker thread, commits FUA writes on a second thread (a deferred `after_write`) and makes
/// them durable on a third after a short delay.
struct ProbeTarget {
    mem: Arc<MemTarget>,
    worker: Option<mpsc::Sender<Deferred<Probe>>>,
    hold: Arc<AtomicBool>,
    abandoned: Arc<AtomicU64>,
    violations: Arc<AtomicU64>,
    fua_writes: AtomicU64,
    /// FUA writes whose (deferred) commit finished.
    fua_committed: Arc<AtomicU64>,
    made_durable: Arc<AtomicU64>,
}

impl ProbeTarget {
    fn new(size: u64, serve: Serve) -> Arc<ProbeTarget> {
        let mem = MemTarget::new(
            size,
            MemOptions {
                chunk_bytes: 16 * 1024,
                ..MemOptions::default()
            },
        )
        .expect("mem target");
        let violations = Arc::new(AtomicU64::new(0));
        let hold = Arc::new(AtomicBool::new(false));
        let abandoned = Arc::new(AtomicU64::new(0));
        let worker = match serve {
            Serve::Inline => None,
            Serve::Deferred { delay } => Some(delay),
            Serve::Held => Some(Duration::ZERO),
        }
        .map(|delay| {
            let (tx, rx) = mpsc::channel::<Deferred<Probe>>();
            let mem = Arc::clone(&mem);
            let violations = Arc::clone(&violations);
            let (hold, abandoned) = (Arc::clone(&hold), Arc::clone(&abandoned));
            std::thread::spawn(move || {
                while let Ok(d) = rx.recv() {
                    std::thread::sleep(delay);
                    while hold.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    if d.is_abandoned() {
                        abandoned.fetch_add(1, Ordering::SeqCst);
                        d.complete(-libc::EIO); // nobody reads it: the kernel reissued the request
                        continue;
                    }
                    let action = mem.plan(d.io());
                    let keepalive = probe(&action, &violations);
                    d.finish(action, keepalive);
                }
            });
            tx
        });
        Arc::new(ProbeTarget {
            mem,
            worker,
            hold,
            abandoned,
            violations,
            fua_writes: AtomicU64::new(0),
            fua_committed: Arc::new(AtomicU64::new(0)),
            made_durable: Arc::new(AtomicU64::new(0)),
        })
    }
}

/// The probe for a request answered with `action`: one for every chunked request.
fn probe(action: &Action, violations: &Arc<AtomicU64>) -> Option<Probe> {
    matches!(action, Action::Chunks(_)).then(|| Probe {
        reaped: false,
        violations: Arc::clone(violations),
    })
}

/// Marks the probe reaped (the hook that got it runs after the request's last chunk).
fn reap(keepalive: Option<&mut Probe>) {
    if let Some(p) = keepalive {
        p.reaped = true;
    }
}

impl Target for ProbeTarget {
    type Keepalive = Probe;

    fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_, Probe>) -> Dispatch<Probe> {
        if io.op == IoOp::Write && io.fua() {
            self.fua_writes.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(worker) = &self.worker {
            let _ = worker.send(ctx.defer());
            return Dispatch::Deferred;
        }
        let action = self.mem.plan(io);
        Dispatch::Inline {
            keepalive: probe(&action, &self.violations),
            action,
        }
    }

    fn after_read(&self, io: &IoDesc, result: i32, keepalive: Option<&mut Probe>) -> i32 {
        reap(keepalive);
        self.mem.after_read(io, result, None)
    }

    /// A FUA write's commit is deferred to a thread (as a target whose commit writes a log
    /// does); every other write commits on the loop thread.
    fn after_write(
        &self,
        io: &IoDesc,
        result: i32,
        keepalive: Option<Probe>,
        ctx: &mut DispatchCtx<'_, Probe>,
    ) -> Dispatch<Probe> {
        let mut keepalive = keepalive;
        reap(keepalive.as_mut());
        let result = self.mem.landed(result);
        if !io.fua() || result != io.success_result() {
            return Dispatch::complete(result);
        }
        let token = ctx.defer();
        let committed = Arc::clone(&self.fua_committed);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(10));
            drop(keepalive);
            committed.fetch_add(1, Ordering::SeqCst);
            token.complete(result);
        });
        Dispatch::Deferred
    }

    fn make_durable(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_, Probe>) -> Dispatch<Probe> {
        let token = ctx.defer();
        let done = Arc::clone(&self.made_durable);
        let committed = Arc::clone(&self.fua_committed);
        let violations = Arc::clone(&self.violations);
        let result = io.success_result();
        std::thread::spawn(move || {
            if committed.load(Ordering::SeqCst) <= done.load(Ordering::SeqCst) {
                violations.fetch_add(1, Ordering::SeqCst);
                eprintln!("VIOLATION: make_durable before the write's deferred commit");
            }
            // Stands in for an fdatasync: the write must not complete before this.
            std::thread::sleep(Duration::from_millis(20));
            done.fetch_add(1, Ordering::SeqCst);
            token.complete(result);
        });
        Dispatch::Deferred
    }
}

fn probe_device(
    t: Transport,
    size: u64,
    serve: Serve,
    quiesce: bool,
) -> (Device<ProbeTarget>, Arc<ProbeTarget>) {
    let target = ProbeTarget::new(size, serve);
    let mut cfg = DeviceConfig::new("probe", size);
    // Held: one queue of 2 tags, so the writers keep every tag in the (stuck) server.
    (cfg.queues, cfg.depth) = if serve == Serve::Held {
        (1, 2)
    } else {
        (2, 32)
    };
    cfg.transport = preference(t);
    cfg.quiesce = quiesce;
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create");
    let info = dev.info().expect("info");
    println!(
        "{} kernel {}: transport {} flags {:#x} (serve={serve:?}, quiesce={quiesce})",
        dev.bdev_path(),
        ublk_core::features::kernel_release(),
        dev.transport(),
        info.flags
    );
    assert_eq!(dev.transport(), t, "kernel granted {}", dev.transport());
    (dev, target)
}

fn stop(dev: Device<impl Target>) {
    bounded("stop_and_delete", Duration::from_secs(60), move || {
        dev.stop_and_delete()
    })
    .expect("stop");
}

// ---------------------------------------------------------------------------------------
// FUA

fn fua_reaches_the_target(t: Transport) {
    let (dev, target) = probe_device(t, 8 * MIB, Serve::Inline, true);
    let f = open_direct(&dev.bdev_path());
    write_blocks(&f, 1, 0, 16, 4);
    let plain = target.fua_writes.load(Ordering::SeqCst);
    // One O_DIRECT write with RWF_DSYNC: the block layer sends it as a FUA write.
    let mut buf = AlignedBuf::new(4096);
    fill_block(buf.as_mut_slice(), 2, 3);
    let iov = libc::iovec {
        iov_base: buf.as_mut_slice().as_mut_ptr().cast(),
        iov_len: 4096,
    };
    let fd = std::os::fd::AsRawFd::as_raw_fd(&f);
    // SAFETY: one iovec over a live, page-aligned 4 KiB buffer; fd is open.
    let n = unsafe { libc::pwritev2(fd, &iov, 1, 3 * 4096, libc::RWF_DSYNC) };
    assert_eq!(
        n,
        4096,
        "pwritev2(RWF_DSYNC): {}",
        std::io::Error::last_os_error()
    );
    let fua = target.fua_writes.load(Ordering::SeqCst) - plain;
    let durable = target.made_durable.load(Ordering::SeqCst);
    let committed = target.fua_committed.load(Ordering::SeqCst);
    println!(
        "plain writes seen as FUA: {plain}; RWF_DSYNC write: fua={fua}, committed off the loop={committed}, made durable={durable}"
    );
    assert_eq!(plain, 0, "plain writes must not carry FUA");
    assert!(
        fua >= 1,
        "the RWF_DSYNC write never reached the target with fua() true"
    );
    assert_eq!(
        durable, fua,
        "every FUA write completes only after make_durable finished"
    );
    assert_eq!(
        committed, fua,
        "every FUA write completes only after its deferred commit (after_write) finished"
    );
    verify_blocks(&f, 0, 16, 4, |b| Some(if b == 3 { 2 } else { 1 }));
    assert_eq!(target.violations.load(Ordering::SeqCst), 0);
    drop(f);
    stop(dev);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_fua_write_is_made_durable() {
    fua_reaches_the_target(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_fua_write_is_made_durable() {
    fua_reaches_the_target(Transport::UserCopy);
}

// ---------------------------------------------------------------------------------------
// Hand-off under load

const WRITERS: u64 = 4;
const REGION_BLOCKS: u64 = 1024; // 4 MiB per writer
const IO_BLOCKS: u64 = 8;

/// One writer: rounds of 32 KiB O_DIRECT writes over its own region, each read back and
/// compared at once. Returns the generation of every block, or the first error.
fn writer(path: String, w: u64, stop: Arc<AtomicBool>) -> Result<(Vec<u64>, u64), String> {
    let f = open_direct(&path);
    let first = w * REGION_BLOCKS;
    let mut gens = vec![0u64; REGION_BLOCKS as usize];
    let mut buf = AlignedBuf::new((IO_BLOCKS * 4096) as usize);
    let mut back = AlignedBuf::new((IO_BLOCKS * 4096) as usize);
    let mut round = 0u64;
    let mut ios = 0u64;
    while !stop.load(Ordering::Relaxed) {
        round += 1;
        for step in 0..(REGION_BLOCKS / IO_BLOCKS) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            // Stride through the region so consecutive writes hit different blocks.
            let slot = (step * 37 + round) % (REGION_BLOCKS / IO_BLOCKS);
            let b = first + slot * IO_BLOCKS;
            let gen = (w << 32) | round;
            for i in 0..IO_BLOCKS {
                let s = (i * 4096) as usize;
                fill_block(&mut buf.as_mut_slice()[s..s + 4096], gen, b + i);
            }
            f.write_all_at(buf.as_slice(), b * 4096)
                .map_err(|e| format!("writer {w}: write blocks {b}+{IO_BLOCKS}: {e}"))?;
            for i in 0..IO_BLOCKS {
                gens[(b - first + i) as usize] = gen;
            }
            f.read_exact_at(back.as_mut_slice(), b * 4096)
                .map_err(|e| format!("writer {w}: read blocks {b}+{IO_BLOCKS}: {e}"))?;
            if back.as_slice() != buf.as_slice() {
                return Err(format!(
                    "writer {w}: blocks {b}+{IO_BLOCKS} read back differently"
                ));
            }
            ios += 2;
        }
    }
    Ok((gens, ios))
}

const DEFERRED: Serve = Serve::Deferred {
    delay: Duration::ZERO,
};
/// 20 ms per request on one worker: when QUIESCE_DEV aborts the idle tags, the writers'
/// requests are in the server (with 2 ms, 2 of 4 runs of the old `detach` took 5 s).
const SLOW: Serve = Serve::Deferred {
    delay: Duration::from_millis(20),
};

/// Hand-off under load: nothing lost, and `detach` never sits out the queues' join timeout.
/// QUIESCE_DEV aborts only tags waiting for a request; one the server held re-arms its FETCH,
/// so a `detach` that waited for every tag to be aborted took `STOP_JOIN_TIMEOUT` (5 s)
/// whenever a request was in the server (`Serve::Deferred` with a delay makes that certain).
fn handoff_under_load(t: Transport, serve: Serve, quiesce: bool) {
    let size = WRITERS * REGION_BLOCKS * 4096;
    let (dev, target) = probe_device(t, size, serve, quiesce);
    let path = dev.bdev_path();
    let stop_flag = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..WRITERS)
        .map(|w| {
            let (path, stop_flag) = (path.clone(), Arc::clone(&stop_flag));
            std::thread::spawn(move || writer(path, w, stop_flag))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    if serve == Serve::Held {
        // The target gets stuck: within a moment every tag of the queue is in it.
        target.hold.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(500));
    }
    let writes_before = target.mem.stats().writes.load(Ordering::SeqCst);
    let detach_at = Instant::now();
    let id = bounded("detach under load", Duration::from_secs(60), move || {
        dev.detach()
    })
    .expect("detach");
    let detach_took = detach_at.elapsed();
    println!("detach returned after {detach_took:?}");
    let held_at = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    let successor = bounded("recover", Duration::from_secs(60), {
        let target = Arc::clone(&target);
        move || {
            Device::recover(
                id,
                "probe",
                target,
                &Default::default(),
                Duration::from_secs(10),
            )
        }
    })
    .expect("recover");
    println!(
        "hand-off: {writes_before} writes before detach; I/O held for {:?}",
        held_at.elapsed()
    );
    if serve == Serve::Held {
        target.hold.store(false, Ordering::SeqCst);
    }
    assert_eq!(successor.info().expect("info").state, DeviceState::Live);
    std::thread::sleep(Duration::from_millis(1500));
    stop_flag.store(true, Ordering::Relaxed);
    let mut ios = 0;
    let mut expected = Vec::new();
    for (w, h) in writers.into_iter().enumerate() {
        let (gens, n) = h
            .join()
            .expect("writer panicked")
            .unwrap_or_else(|e| panic!("a writer saw an error across the hand-off: {e}"));
        println!("writer {w}: {n} I/Os, no error");
        ios += n;
        expected.push(gens);
    }
    let writes_after = target.mem.stats().writes.load(Ordering::SeqCst);
    assert!(
        writes_after > writes_before,
        "no write was served after the recovery ({writes_before} -> {writes_after})"
    );
    // Everything every writer wrote last is on the device.
    let f = open_direct(&path);
    verify_blocks(&f, 0, WRITERS * REGION_BLOCKS, 64, |b| {
        let g = expected[(b / REGION_BLOCKS) as usize][(b % REGION_BLOCKS) as usize];
        (g != 0).then_some(g)
    });
    drop(f);
    let violations = target.violations.load(Ordering::SeqCst);
    println!(
        "{ios} I/Os verified; keepalive violations: {violations}; abandoned tokens finished untouched: {}",
        target.abandoned.load(Ordering::SeqCst)
    );
    if serve == Serve::Held {
        assert!(
            target.abandoned.load(Ordering::SeqCst) > 0,
            "no request was in the stuck server at the hand-off"
        );
    }
    assert_eq!(
        violations, 0,
        "a keepalive was dropped while its chunks could still run"
    );
    stop(successor);
    // Checked last: failing earlier would leave the writers blocked on a quiesced device.
    assert!(
        detach_took < STOP_JOIN_TIMEOUT,
        "detach took {detach_took:?}: the queue loops were left to the {STOP_JOIN_TIMEOUT:?} \
         join timeout instead of ending once they had answered what they held"
    );
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_handoff_under_load_quiesce() {
    handoff_under_load(Transport::ZeroCopy, Serve::Inline, true);
    handoff_under_load(Transport::ZeroCopy, DEFERRED, true);
    handoff_under_load(Transport::ZeroCopy, SLOW, true);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_handoff_under_load_quiesce() {
    handoff_under_load(Transport::UserCopy, Serve::Inline, true);
    handoff_under_load(Transport::UserCopy, DEFERRED, true);
    handoff_under_load(Transport::UserCopy, SLOW, true);
}

/// Every tag of the queue in a stuck target at the hand-off (a cold read in store retries):
/// `detach` is bounded by the loops' drain budget (QUIESCE_DEV does not wait for requests the
/// server holds: `detach` took 2.1 s with a 2 s budget, whether QUIESCE_DEV was given 30 s or
/// 1 s), the stuck tokens are
/// abandoned (`Deferred::is_abandoned`, finished without touching data) and the kernel
/// reissues their requests to the successor: no writer sees an error, the data verifies.
#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_handoff_with_every_tag_held() {
    handoff_under_load(Transport::ZeroCopy, Serve::Held, true);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_handoff_with_every_tag_held() {
    handoff_under_load(Transport::UserCopy, Serve::Held, true);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_handoff_under_load_without_quiesce() {
    handoff_under_load(Transport::ZeroCopy, DEFERRED, false);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_handoff_under_load_without_quiesce() {
    handoff_under_load(Transport::UserCopy, Serve::Inline, false);
}

// ---------------------------------------------------------------------------------------
// A failed recover keeps the device

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_failed_recover_leaves_the_device_quiesced() {
    let (dev, target) = probe_device(Transport::ZeroCopy, 8 * MIB, Serve::Inline, true);
    let path = dev.bdev_path();
    let f = open_direct(&path);
    write_blocks(&f, 5, 0, 64, 8);
    let id = dev.detach().expect("detach");
    // CPU 5000 does not exist: the queue threads cannot be pinned, the recover fails.
    let res = Device::recover(
        id,
        "probe",
        Arc::clone(&target),
        &ublk_core::QueueOptions {
            cpus: vec![5000],
            ..Default::default()
        },
        Duration::from_secs(10),
    );
    let err = res.expect_err("recover with a bad CPU list must fail");
    println!("recover with cpu 5000 failed as expected: {err}");
    let info = ublk_core::device_info(id).expect("the device must still exist");
    println!(
        "after the failed recover: {} is {}",
        info.bdev_path(),
        info.state
    );
    assert_eq!(info.state, DeviceState::Quiesced);
    assert!(std::path::Path::new(&path).exists(), "{path} vanished");
    // A second attempt with a good list takes over; the data is intact.
    let dev = bounded("recover again", Duration::from_secs(60), {
        let target = Arc::clone(&target);
        move || {
            Device::recover(
                id,
                "probe",
                target,
                &Default::default(),
                Duration::from_secs(10),
            )
        }
    })
    .expect("recover");
    verify_blocks(&f, 0, 64, 8, |_| Some(5));
    drop(f);
    stop(dev);
}

// ---------------------------------------------------------------------------------------
// Coverage and completion results

/// Serves a mem device, except: READs and WRITEs at 1 MiB..2 MiB get chunks for only the
/// first half of the request; WRITEs at 2 MiB..3 MiB complete with `Complete(0)`.
struct Sloppy {
    mem: Arc<MemTarget>,
}

impl Target for Sloppy {
    type Keepalive = ();

    fn dispatch(&self, io: &IoDesc, _ctx: &mut DispatchCtx<'_>) -> Dispatch {
        let region = io.offset / MIB;
        match (region, io.op, self.mem.plan(io)) {
            (1, IoOp::Read | IoOp::Write, Action::Chunks(chunks)) => {
                let half = io.len / 2;
                let half: Vec<Chunk> = chunks
                    .into_iter()
                    .filter(|c| c.buf_offset() < half)
                    .map(|mut c| {
                        let (Chunk::ReadInto {
                            len, buf_offset, ..
                        }
                        | Chunk::WriteFrom {
                            len, buf_offset, ..
                        }
                        | Chunk::Zeros { len, buf_offset }) = &mut c;
                        *len = (*len).min(half - *buf_offset);
                        c
                    })
                    .collect();
                Dispatch::inline(Action::Chunks(half))
            }
            (2, IoOp::Write, _) => Dispatch::complete(0),
            (_, _, action) => Dispatch::inline(action),
        }
    }
}

fn sloppy_requests_fail(t: Transport) {
    let target = Arc::new(Sloppy {
        mem: MemTarget::new(4 * MIB, MemOptions::default()).expect("mem"),
    });
    let mut cfg = DeviceConfig::new("sloppy", 4 * MIB);
    cfg.transport = preference(t);
    let dev = Device::create(&cfg, Arc::clone(&target)).expect("create");
    println!(
        "{} kernel {} transport {}",
        dev.bdev_path(),
        ublk_core::features::kernel_release(),
        dev.transport()
    );
    assert_eq!(dev.transport(), t);
    let f = open_direct(&dev.bdev_path());
    let mut buf = AlignedBuf::new(8192);
    let eio = |r: std::io::Result<usize>, what: &str| match r {
        Err(e) if e.raw_os_error() == Some(libc::EIO) => println!("{what}: EIO as required"),
        other => panic!("{what} must fail with EIO, got {other:?}"),
    };
    // Whole-request coverage: a normal region works.
    f.write_all_at(buf.as_slice(), 0).expect("covered write");
    f.read_exact_at(buf.as_mut_slice(), 0)
        .expect("covered read");
    eio(f.read_at(buf.as_mut_slice(), MIB), "half-covered READ");
    eio(f.write_at(buf.as_slice(), MIB + 8192), "half-covered WRITE");
    // Before the fix the kernel requeued this write forever.
    let r = bounded("WRITE answered Complete(0)", Duration::from_secs(30), {
        let f = f.try_clone().expect("dup");
        move || f.write_at(AlignedBuf::new(4096).as_slice(), 2 * MIB)
    });
    eio(r, "WRITE completed with 0 bytes");
    drop(f);
    stop(dev);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_zero_copy_under_covered_requests_fail() {
    sloppy_requests_fail(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_user_copy_under_covered_requests_fail() {
    sloppy_requests_fail(Transport::UserCopy);
}

// ---------------------------------------------------------------------------------------
// START_DEV and LBA 0

/// Serves LBA-0 READs from another thread after a delay (a cold block fetched from an
/// object store); everything else inline.
struct ColdLba0 {
    mem: Arc<MemTarget>,
    slow_reads: AtomicU64,
}

impl Target for ColdLba0 {
    type Keepalive = ();

    fn dispatch(&self, io: &IoDesc, ctx: &mut DispatchCtx<'_>) -> Dispatch {
        if io.op == IoOp::Read && io.offset == 0 {
            self.slow_reads.fetch_add(1, Ordering::SeqCst);
            let token = ctx.defer();
            let mem = Arc::clone(&self.mem);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(500));
                let action = mem.plan(token.io());
                token.finish(action, None);
            });
            return Dispatch::Deferred;
        }
        self.mem.dispatch(io, ctx)
    }
}

/// START_DEV scans for partitions (libublk cannot ask for NO_AUTO_PART_SCAN) and so waits
/// for a READ of LBA 0: the queues already serve it, deferred, while `create` runs.
#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn ublk_start_serves_a_deferred_lba0_read_during_create() {
    let target = Arc::new(ColdLba0 {
        mem: MemTarget::new(4 * MIB, MemOptions::default()).expect("mem"),
        slow_reads: AtomicU64::new(0),
    });
    let cfg = DeviceConfig::new("cold0", 4 * MIB);
    let dev = bounded("create with a slow LBA-0 read", Duration::from_secs(60), {
        let target = Arc::clone(&target);
        move || Device::create(&cfg, target)
    })
    .expect("create");
    let slow = target.slow_reads.load(Ordering::SeqCst);
    println!(
        "created {} ({}); deferred LBA-0 reads so far: {slow}",
        dev.bdev_path(),
        dev.transport()
    );
    let f = open_direct(&dev.bdev_path());
    let mut buf = AlignedBuf::new(4096);
    f.read_exact_at(buf.as_mut_slice(), 0).expect("read LBA 0");
    assert!(buf.as_slice().iter().all(|&b| b == 0));
    assert!(target.slow_reads.load(Ordering::SeqCst) > slow);
    drop(f);
    stop(dev);
}
