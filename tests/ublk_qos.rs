//! Kernel test of per-volume QoS limits through the real daemon, on both transports: a volume
//! created with a write limit (`--write-bps 2M:512K`) takes 8 MiB of O_DIRECT writes no faster
//! than the limit allows (at least (8 MiB - 512 KiB) / 2 MiB/s: a lower bound on the time, which
//! a loaded machine only lengthens), and every byte reads back; the limit is changed live to a
//! read limit (`volume qos --read-iops 16:2`): 32 reads of 128 KiB take at least (32 - 2) / 16
//! s, and return the data written; then `volume qos --clear`, after which nothing waits (the
//! daemon's `throttled` count stays where it was over another 8 MiB written and read back).
//! Throttled requests are served after their wait from a runtime task, on the fast path when
//! they can (the reads of local data here) and on the deferred paths otherwise (a write that
//! needs file I/O first), on both transports, so this also proves those carry the data.
//!
//! Prints the kernel version and the transport (the volume line) and the times measured.
//! Needs /dev/ublk-control: `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use std::time::{Duration, Instant};

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks};
use ublk_core::Transport;

use support::daemon::{device_of, u64_of, Daemon, Store};

const MIB: u64 = 1 << 20;
/// 4 KiB blocks of the test kit's block pattern.
const BLOCK: u64 = 4096;

/// Requests the daemon reports as having waited for a limit.
fn throttled(daemon: &Daemon, name: &str) -> u64 {
    u64_of(&daemon.show(name), "/throttled/requests")
}

fn qos_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    println!(
        "=== QoS limits, kernel {}, {t}",
        ublk_core::features::kernel_release()
    );
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "q", "--size", "64M", "--write-bps", "2M:512K"]);
    let dev = device_of(&info, t);
    assert_eq!(u64_of(&info, "/qos/write_bytes/rate"), 2 * MIB);
    let f = open_direct(&dev);

    // 8 MiB in 128 KiB writes at QD1: the first 512 KiB from the burst, the rest at 2 MiB/s.
    let blocks = 8 * MIB / BLOCK;
    let t0 = Instant::now();
    write_blocks(&f, 1, 0, blocks, 32);
    let took = t0.elapsed();
    let floor = Duration::from_secs_f64((8.0 - 0.5) / 2.0);
    println!("8 MiB written under --write-bps 2M:512K in {took:?} (floor {floor:?})");
    assert!(
        took >= floor.mul_f64(0.98),
        "8 MiB written in {took:?}: faster than 2 MiB/s allows ({floor:?})"
    );
    let waited = throttled(&daemon, "q");
    assert!(waited > 0, "no request waited: {}", daemon.show("q"));
    verify_blocks(&f, 0, blocks, 32, |_| Some(1));

    // Live: a read limit replaces the write limit.
    let l = daemon.json(&["qos", "q", "--read-iops", "16:2"]);
    assert_eq!(u64_of(&l, "/read_iops/rate"), 16);
    assert!(l.get("write_bytes").is_none(), "{l}");
    let before = throttled(&daemon, "q");
    let t0 = Instant::now();
    verify_blocks(&f, 0, 32 * 32, 32, |_| Some(1));
    let took = t0.elapsed();
    let floor = Duration::from_secs_f64((32.0 - 2.0) / 16.0);
    println!("32 reads of 128 KiB under --read-iops 16:2 in {took:?} (floor {floor:?})");
    assert!(
        took >= floor.mul_f64(0.98),
        "32 reads in {took:?}: faster than 16/s allows ({floor:?})"
    );
    assert!(throttled(&daemon, "q") > before, "no read waited");

    // Cleared: nothing waits any more, and the data still moves both ways.
    let l = daemon.json(&["qos", "q", "--clear"]);
    assert_eq!(l, serde_json::json!({}), "{l}");
    let before = throttled(&daemon, "q");
    let t0 = Instant::now();
    write_blocks(&f, 2, 0, blocks, 32);
    println!("8 MiB written without a limit in {:?}", t0.elapsed());
    verify_blocks(&f, 0, blocks, 32, |_| Some(2));
    assert_eq!(
        throttled(&daemon, "q"),
        before,
        "a request waited without limits"
    );
    let shown = daemon.show("q");
    assert!(shown.get("qos").is_none(), "{shown}");
    drop(f);
    daemon.json(&["rm", "q", "--purge"]);
    daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn qos_limits_zero_copy() {
    qos_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn qos_limits_user_copy() {
    qos_flow(Transport::UserCopy);
}
