//! Kernel tests of crash recovery: the `glidefs serve` binary is killed with SIGKILL while an
//! ext4 filesystem on one of its devices is mounted and written, and restarted; the new
//! daemon takes the QUIESCED device over (`UBLK_F_USER_RECOVERY`, reissue) and I/O resumes on
//! the same `/dev/ublkbN` with the filesystem still mounted.
//!
//! The writer overwrites random 4 KiB slots of a preallocated file with O_DIRECT (so every
//! completed write was acknowledged by the daemon, not absorbed by the page cache) and calls
//! `fdatasync` after every 8 writes; a write counts as acknowledged once a later fdatasync
//! returned. 20 kills at random moments (0.3-1.5 s apart, during flushes to the store too: the
//! threshold is 1 MiB); after each restart the writer must make progress. At the end every
//! slot must hold a complete block whose sequence number is at least its last acknowledged
//! one, read with O_DIRECT after an unmount, `e2fsck -fn` clean and a fresh mount.
//!
//! The kill loop's daemon also compacts (every second, at a 90 % threshold) and collects
//! garbage (every 2 s, 1 s grace, one manifest kept) on its own, and right before each kill
//! the test asks for a compaction pass (`volume compact`) and kills 0-300 ms into it, so kills
//! land during passes and GC; the test fails if no kill cut a compaction call.
//!
//! Needs /dev/ublk-control, mkfs.ext4 and e2fsck: `scripts/test` runs it under
//! `scripts/ublk-vm`.

mod support;

use support::daemon;

use std::fs::OpenOptions;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use daemon::{device_of, run, str_of, Daemon, Mount, Store};
use glidefs_testkit::blockdev::{
    fill_block, header, open_direct, verify_blocks, write_blocks, AlignedBuf,
};
use ublk_core::Transport;

/// 4 KiB slots of the test file.
const SLOTS: u64 = 2048;
/// Writes per fdatasync.
const BATCH: usize = 8;
/// Kills per test.
const KILLS: u32 = 20;
/// The writer must acknowledge something within this long after a restart.
const PROGRESS_LIMIT: Duration = Duration::from_secs(60);

/// What the writer did, per slot: the last sequence number written and the last one
/// acknowledged by an fdatasync.
struct Ledger {
    attempted: Vec<u64>,
    acked: Vec<u64>,
    max_stall: Duration,
}

fn open_file(path: &Path) -> std::fs::File {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("open {} O_DIRECT: {e}", path.display()))
}

/// Overwrites random slots until `stop`; an I/O error ends it with the error.
fn writer(path: &Path, stop: &AtomicBool, acked_writes: &AtomicU64) -> Result<Ledger, String> {
    let f = open_file(path);
    let mut buf = AlignedBuf::new(4096);
    let mut ledger = Ledger {
        attempted: vec![0; SLOTS as usize],
        acked: vec![0; SLOTS as usize],
        max_stall: Duration::ZERO,
    };
    let mut pending: Vec<(usize, u64)> = Vec::with_capacity(BATCH);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut seq = 0u64;
    while !stop.load(Ordering::Acquire) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let slot = x % SLOTS;
        seq += 1;
        fill_block(&mut buf.as_mut_slice()[..4096], seq, slot);
        let t0 = Instant::now();
        f.write_all_at(&buf.as_slice()[..4096], slot * 4096)
            .map_err(|e| format!("write of slot {slot} (seq {seq}): {e}"))?;
        ledger.attempted[slot as usize] = seq;
        pending.push((slot as usize, seq));
        if pending.len() == BATCH {
            f.sync_data()
                .map_err(|e| format!("fdatasync after seq {seq}: {e}"))?;
            for (s, q) in pending.drain(..) {
                ledger.acked[s] = ledger.acked[s].max(q);
            }
            acked_writes.fetch_add(BATCH as u64, Ordering::Release);
        }
        ledger.max_stall = ledger.max_stall.max(t0.elapsed());
    }
    Ok(ledger)
}

/// Every slot holds a whole block of a sequence number between its last acknowledged and its
/// last attempted one (0: the initial fill).
fn verify(path: &Path, ledger: &Ledger) {
    let f = open_file(path);
    let mut buf = AlignedBuf::new(4096);
    let mut want = vec![0u8; 4096];
    let mut newer = 0;
    for slot in 0..SLOTS {
        f.read_exact_at(&mut buf.as_mut_slice()[..4096], slot * 4096)
            .unwrap_or_else(|e| panic!("read slot {slot}: {e}"));
        let got = &buf.as_slice()[..4096];
        let seq = header(got).generation;
        let (acked, attempted) = (ledger.acked[slot as usize], ledger.attempted[slot as usize]);
        assert!(
            seq >= acked,
            "slot {slot}: holds seq {seq}, but seq {acked} was acknowledged by fdatasync: an acknowledged write was lost"
        );
        assert!(
            seq <= attempted.max(acked),
            "slot {slot}: holds seq {seq}, never written there (last {attempted})"
        );
        fill_block(&mut want, seq, slot);
        assert!(got == want.as_slice(), "slot {slot}: seq {seq} is torn");
        if seq > acked {
            newer += 1;
        }
    }
    println!(
        "all {SLOTS} slots hold their acknowledged data or newer ({newer} hold unacknowledged newer writes)"
    );
}

/// Waits until the writer acknowledged more than `since`; fails after [`PROGRESS_LIMIT`].
fn await_progress(acked: &AtomicU64, since: u64, what: &str) -> Duration {
    let start = Instant::now();
    while acked.load(Ordering::Acquire) <= since {
        assert!(
            start.elapsed() < PROGRESS_LIMIT,
            "{what}: the writer made no progress for {PROGRESS_LIMIT:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    start.elapsed()
}

/// What the compaction calls made right before each kill returned.
#[derive(Debug, Default)]
struct Passes {
    /// Cut by the kill (the call failed: the daemon died during it).
    cut: u32,
    /// Published a generation before the kill.
    published: u32,
    /// Nothing below the threshold.
    idle: u32,
}

fn kill_loop(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let mnt = work.path().join("mnt");
    println!("=== kill -9 loop, {t}");
    let config = format!(
        "{}[space]\ncompact_interval_secs = 1\ncompact_threshold_pct = 90\n\
         gc_interval_secs = 2\n[gc]\ngrace_secs = 1\nallow_short_grace = true\n\
         keep_manifests = 1\n",
        daemon::default_config(work.path(), &store)
    );
    let mut d = Daemon::start_with_config(work.path(), &config, &store, t);
    let info = d.json(&["create", "crash", "--size", "128M"]);
    let dev = device_of(&info, t);
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let m = Mount::new(&dev, &mnt);
    let file = mnt.join("data.bin");
    {
        let f = open_file_create(&file);
        let mut buf = AlignedBuf::new(4096);
        for slot in 0..SLOTS {
            fill_block(&mut buf.as_mut_slice()[..4096], 0, slot);
            f.write_all_at(&buf.as_slice()[..4096], slot * 4096)
                .expect("initial fill");
        }
        f.sync_all().expect("fsync the initial fill");
    }
    run("sync", &[]);

    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let w = {
        let (file, stop, acked) = (file.clone(), Arc::clone(&stop), Arc::clone(&acked));
        std::thread::spawn(move || writer(&file, &stop, &acked))
    };
    await_progress(&acked, 0, "before the first kill");
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut passes = Passes::default();
    for i in 1..=KILLS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(300 + x % 1200));
        // A compaction pass asked for now, and the kill 0-300 ms into it.
        let pass = {
            let socket = d.socket.clone();
            std::thread::spawn(move || {
                let mut cmd = std::process::Command::new(daemon::glidefs());
                cmd.args([
                    "volume", "compact", "crash", "--no-gc", "--json", "--socket",
                ])
                .arg(socket);
                daemon::output_within(&mut cmd, daemon::CLI_LIMIT)
                    .expect("run glidefs volume compact")
            })
        };
        std::thread::sleep(Duration::from_millis((x >> 20) % 300));
        let before = acked.load(Ordering::Acquire);
        d.kill9();
        let out = pass.join().expect("the compaction call");
        let published = out.status.success()
            && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                .is_ok_and(|v| v["generation"].is_u64());
        match (out.status.success(), published) {
            (false, _) => passes.cut += 1,
            (true, true) => passes.published += 1,
            (true, false) => passes.idle += 1,
        }
        let down = Instant::now();
        d = Daemon::start_with_config(work.path(), &config, &store, t);
        let info = d.show("crash");
        assert_eq!(str_of(&info, "/state"), "running", "{info}");
        let path = device_of(&info, t);
        assert_eq!(path, dev, "the device changed after recovery");
        let resumed = await_progress(&acked, acked.load(Ordering::Acquire), "after a restart");
        println!(
            "kill {i}/{KILLS}: {} writes acknowledged before it; restart and recovery took {:?}, first acknowledgement {resumed:?} after the daemon answered",
            before,
            down.elapsed()
        );
        if w.is_finished() {
            match w.join() {
                Ok(Err(e)) => panic!("the writer saw an I/O error: {e}"),
                _ => panic!("the writer stopped"),
            }
        }
    }
    stop.store(true, Ordering::Release);
    let ledger = w
        .join()
        .expect("writer thread")
        .unwrap_or_else(|e| panic!("the writer saw an I/O error: {e}"));
    println!(
        "writer: {} writes acknowledged across {KILLS} kills, longest single write {:?}",
        acked.load(Ordering::Acquire),
        ledger.max_stall
    );
    d.print_log_lines(&[
        "recovering the device",
        "ublk device recovered",
        "volumes restored",
    ]);
    let background = d
        .log_text()
        .lines()
        .filter(|l| l.contains("compaction pass published"))
        .count();
    println!(
        "compaction calls before the {KILLS} kills: {} cut by the kill, {} published before it, \
         {} found nothing to do; background passes published: {background}",
        passes.cut, passes.published, passes.idle
    );
    assert!(
        passes.cut > 0,
        "no kill landed during a compaction call: {passes:?}"
    );
    m.unmount();
    let fsck = run("e2fsck", &["-fn", &dev]);
    println!(
        "e2fsck -fn: clean\n{}",
        String::from_utf8_lossy(&fsck.stdout).trim_end()
    );
    let m = Mount::new(&dev, &mnt);
    verify(&file, &ledger);
    m.unmount();
    d.json(&["rm", "crash", "--purge"]);
    d.stop();
}

fn open_file_create(path: &Path) -> std::fs::File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
    f.set_len(SLOTS * 4096).expect("size the file");
    f
}

/// A queue loop whose ring fails (injected: `UBLK_CORE_FAULT_RING_AFTER`, every wait of the
/// loop fails with EBADFD after that many requests) aborts the daemon loudly instead of
/// leaving the device LIVE with requests nobody answers; the kernel holds the I/O, the next
/// start recovers the device and the writer (O_DIRECT on the raw device, fdatasync every 8
/// writes) resumes without an error. Two such failures, then every slot holds at least its
/// last acknowledged write.
fn ring_failure(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    println!("=== injected ring failure, {t}");
    let fault = [("UBLK_CORE_FAULT_RING_AFTER", "1500")];
    let mut d = Daemon::start_with_env(work.path(), &store, t, &fault);
    let info = d.json(&["create", "ring", "--size", "64M"]);
    let dev = device_of(&info, t);
    {
        // Every slot starts as sequence 0 (what `verify` expects of an unwritten slot), in
        // 1 MiB writes: few requests count towards the fault's threshold.
        let f = open_file(Path::new(&dev));
        let mut buf = AlignedBuf::new(1 << 20);
        for first in (0..SLOTS).step_by(256) {
            for (i, block) in buf.as_mut_slice().chunks_mut(4096).enumerate() {
                fill_block(block, 0, first + i as u64);
            }
            f.write_all_at(buf.as_slice(), first * 4096)
                .expect("initial fill");
        }
        f.sync_all().expect("fsync the initial fill");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicU64::new(0));
    let w = {
        let (dev, stop, acked) = (dev.clone(), Arc::clone(&stop), Arc::clone(&acked));
        std::thread::spawn(move || writer(Path::new(&dev), &stop, &acked))
    };
    for round in 1..=2 {
        let status = d.wait_for_exit(Duration::from_secs(120));
        let log = d.log_text();
        assert_eq!(
            status.signal(),
            Some(libc::SIGABRT),
            "the daemon should abort on the injected ring failure: {status}\n{log}"
        );
        assert!(
            log.contains("io_uring failed"),
            "no loud error before the abort:\n{log}"
        );
        println!("round {round}: the daemon aborted ({status}) after the injected ring failure");
        let before = acked.load(Ordering::Acquire);
        let down = Instant::now();
        // The second start injects again; the last one serves normally.
        d = if round == 1 {
            Daemon::start_with_env(work.path(), &store, t, &fault)
        } else {
            Daemon::start(work.path(), &store, t)
        };
        if round == 1 {
            // This daemon aborts again after 1,500 requests, which the held and resumed
            // writes can reach before a CLI call is answered under emulation: read the
            // recovery from its log (written before the API listens), not from the API.
            let log = d.log_text();
            assert!(
                log.lines().any(|l| l.contains("volume device recovered")
                    && l.contains("volume=ring")
                    && l.contains(&format!("device={dev}"))),
                "the restarted daemon did not recover {dev}:\n{log}"
            );
        } else {
            let info = d.show("ring");
            assert_eq!(str_of(&info, "/state"), "running", "{info}");
            assert_eq!(
                device_of(&info, t),
                dev,
                "the device changed after recovery"
            );
        }
        let resumed = await_progress(&acked, before, "after the restart");
        println!(
            "round {round}: restarted and recovered in {:?}; first acknowledgement {resumed:?} after the daemon answered",
            down.elapsed()
        );
        assert!(!w.is_finished(), "the writer stopped");
    }
    std::thread::sleep(Duration::from_millis(1000));
    stop.store(true, Ordering::Release);
    let ledger = w
        .join()
        .expect("writer thread")
        .unwrap_or_else(|e| panic!("the writer saw an I/O error: {e}"));
    println!(
        "writer: {} writes acknowledged across 2 ring failures, longest single write {:?}",
        acked.load(Ordering::Acquire),
        ledger.max_stall
    );
    verify(Path::new(&dev), &ledger);
    d.json(&["rm", "ring", "--purge"]);
    d.stop();
}

/// Single writer across hosts: daemons A, B and C with their own data directories on one
/// object store. A owns a volume; B cannot attach it without a takeover; B's takeover fences
/// A (A's next flush to the store fails, A reports `fenced`, a FLUSH on A's device fails);
/// after B removes (releases) it, C attaches it cold and reads exactly what B wrote.
fn takeover_fences_the_old_owner(t: Transport) {
    let root = tempfile::tempdir().expect("work dir");
    let store = Store::Local(root.path().join("store"));
    let (wa, wb, wc) = (
        root.path().join("a"),
        root.path().join("b"),
        root.path().join("c"),
    );
    println!("=== takeover and fencing across daemons, {t}");
    const BLOCKS: u64 = 2048; // 8 MiB of 4 KiB blocks
    let a = Daemon::start(&wa, &store, t);
    let dev_a = device_of(&a.json(&["create", "shared", "--size", "64M"]), t);
    let fa = open_direct(&dev_a);
    write_blocks(&fa, 1, 0, BLOCKS, 64);
    a.json(&["flush", "shared"]);

    let b = Daemon::start(&wb, &store, t);
    let out = b.cli(&["create", "shared", "--attach-existing"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        !out.status.success() && err.contains("owned"),
        "attach without takeover must be refused: {out:?}"
    );
    println!("B without takeover: {}", err.trim());
    let dev_b = device_of(
        &b.json(&["create", "shared", "--attach-existing", "--takeover"]),
        t,
    );
    let fb = open_direct(&dev_b);
    verify_blocks(&fb, 0, BLOCKS, 64, |_| Some(1));
    write_blocks(&fb, 2, 0, BLOCKS, 64);
    b.json(&["flush", "shared"]);
    println!("B took over, read A's data and wrote its own");

    // A does not know yet: its next publish tells it.
    write_blocks(&fa, 3, 0, 16, 16);
    let out = a.cli(&["flush", "shared"]);
    assert!(!out.status.success(), "A's flush must fail: {out:?}");
    println!(
        "A's flush after the takeover: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    let info = a.show("shared");
    assert_eq!(str_of(&info, "/state"), "fenced", "{info}");
    // Once fenced, A acknowledges nothing: the write or the FLUSH after it fails.
    let mut buf = AlignedBuf::new(4096);
    fill_block(&mut buf.as_mut_slice()[..4096], 3, 16);
    let wrote = fa.write_all_at(&buf.as_slice()[..4096], 16 * 4096);
    let synced = fa.sync_data();
    assert!(
        wrote.is_err() || synced.is_err(),
        "a write + FLUSH on the fenced device must fail"
    );
    println!("A is fenced; on {dev_a}: write {wrote:?}, FLUSH {synced:?}");
    drop(fa);
    a.json(&["rm", "shared", "--force"]);

    drop(fb);
    b.json(&["rm", "shared"]);
    let c = Daemon::start(&wc, &store, t);
    let info = c.json(&["create", "shared", "--attach-existing"]);
    let dev_c = device_of(&info, t);
    let fc = open_direct(&dev_c);
    verify_blocks(&fc, 0, BLOCKS, 64, |_| Some(2));
    drop(fc);
    println!("C (cold, after B released it) reads B's data, none of A's late writes");
    c.json(&["rm", "shared", "--purge"]);
    for d in [a, b, c] {
        d.stop();
    }
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_takeover_fences_the_old_owner_zero_copy() {
    takeover_fences_the_old_owner(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_takeover_fences_the_old_owner_user_copy() {
    takeover_fences_the_old_owner(Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_after_a_ring_failure_zero_copy() {
    ring_failure(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_after_a_ring_failure_user_copy() {
    ring_failure(Transport::UserCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_kill9_loop_zero_copy() {
    kill_loop(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn recovery_kill9_loop_user_copy() {
    kill_loop(Transport::UserCopy);
}
