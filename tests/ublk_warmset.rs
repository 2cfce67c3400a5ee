//! Kernel test of warm sets through the real daemon, on both transports: a 64 MiB volume is
//! written through its device (a checked pattern) and flushed to the store; `volume warmset
//! record` runs while 8 scattered volume blocks are read through the device (O_DIRECT), so
//! the set is what the ublk target reported; the set is stored with those 8 blocks; a clone
//! of a snapshot taken afterwards gets it, and its attach fetches exactly those 8 blocks;
//! reading them through the clone's device then fetches nothing more (its `cold_reads` stay
//! where the warm left them), and every block read, in the set or not, carries the pattern.
//!
//! Prints the kernel version and the transport. Needs /dev/ublk-control: `scripts/test` runs
//! it under `scripts/ublk-vm`.

mod support;

use std::time::{Duration, Instant};

use glidefs_testkit::blockdev::{open_direct, verify_blocks, write_blocks};
use serde_json::Value;
use ublk_core::Transport;

use support::daemon::{device_of, u64_of, Daemon, Store};

const MIB: u64 = 1 << 20;
/// The volume blocks the "boot" reads, in this order (the test daemon's volumes have 64 KiB
/// blocks: 1,024 in 64 MiB).
const SET: [u64; 8] = [40, 3, 17, 250, 9, 128, 77, 500];

/// Polls `glidefs volume warmset show NAME` (bounded) until `done` holds.
fn wait_for(daemon: &Daemon, name: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        let w = daemon.json(&["warmset", "show", name]);
        if done(&w) {
            return w;
        }
        assert!(Instant::now() < until, "timed out waiting for {what}: {w}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn warm_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    println!(
        "=== warm sets, kernel {}, {t}",
        ublk_core::features::kernel_release()
    );
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "img", "--size", "64M"]);
    let bs = u64_of(&info, "/block_size");
    // 4 KiB blocks of the test kit's pattern per volume block.
    let per_block = bs / 4096;
    let f = open_direct(&device_of(&info, t));
    let pages = 64 * MIB / 4096;
    write_blocks(&f, 3, 0, pages, 32);
    daemon.json(&["flush", "img"]);

    daemon.json(&[
        "warmset",
        "record",
        "img",
        "--seconds",
        "120",
        "--max-blocks",
        "8",
    ]);
    for b in SET {
        verify_blocks(&f, b * per_block, per_block, per_block, |_| Some(3));
    }
    let w = wait_for(&daemon, "img", "the set to be stored", |w| {
        w.get("recording").is_none() && w.get("stored").is_some()
    });
    assert_eq!(u64_of(&w, "/stored/blocks"), 8, "{w}");
    assert_eq!(u64_of(&w, "/stored/block_size"), bs, "{w}");
    drop(f);

    daemon.snapshot(&["create", "img", "s"]);
    let c = daemon.json(&["create", "c", "--from", "img@s"]);
    let w = wait_for(&daemon, "c", "the clone's warm", |w| {
        w.get("last_warm").is_some()
    });
    assert_eq!(
        u64_of(&w, "/stored/blocks"),
        8,
        "the clone has the set: {w}"
    );
    assert_eq!(u64_of(&w, "/last_warm/fetched_blocks"), 8, "{w}");
    assert_eq!(u64_of(&w, "/last_warm/failed"), 0, "{w}");
    let warmed = u64_of(&daemon.show("c"), "/cold_reads");
    println!("the clone's warm: {}", w["last_warm"]);
    let fc = open_direct(&device_of(&c, t));
    for b in SET {
        verify_blocks(&fc, b * per_block, per_block, per_block, |_| Some(3));
    }
    assert_eq!(
        u64_of(&daemon.show("c"), "/cold_reads"),
        warmed,
        "reading the warmed set fetched more"
    );
    // A block outside the set comes from the store, with the same data.
    verify_blocks(&fc, 300 * per_block, per_block, per_block, |_| Some(3));
    assert!(u64_of(&daemon.show("c"), "/cold_reads") > warmed);
    drop(fc);
    daemon.json(&["rm", "c", "--purge"]);
    daemon.stop();
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn warm_sets_zero_copy() {
    warm_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn warm_sets_user_copy() {
    warm_flow(Transport::UserCopy);
}
