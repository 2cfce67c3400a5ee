//! Kernel test of space that follows live data, through the real daemon and ext4 on both
//! transports: files written and flushed; most of them deleted, `fstrim`, flushed; then one
//! compaction and GC pass (`glidefs volume compact`): the store's size must end within 1.1x
//! of the bytes the latest manifest still maps (both printed, with the bytes of the files
//! still on the file system). Then the volume is removed and recreated cold from the store:
//! `e2fsck -fn` is clean and every remaining file reads back identical, so compaction and GC
//! kept everything a manifest needs.
//!
//! The daemon runs with GC's most aggressive rules (`grace_secs = 0`, `keep_manifests = 1`,
//! `allow_short_grace`), so the dead packs go in the same pass, and with the scheduled passes
//! off (the test asks for them). Needs /dev/ublk-control, mkfs.ext4, e2fsck and fstrim:
//! `scripts/test` runs it under `scripts/ublk-vm`. A missing tool fails the test with its name.

mod support;

use std::path::Path;

use glidefs_testkit::pattern::noise;
use serde_json::Value;
use ublk_core::Transport;

use support::daemon::{default_config, device_of, run, u64_of, Daemon, Mount, Store};

/// Most the store may hold per live byte once compacted and collected.
const BOUND: f64 = 1.1;

fn files(prefix: &str, count: u64, len: usize, seed: u64) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| (format!("{prefix}{i}.bin"), noise(seed + i, len)))
        .collect()
}

fn space_of(info: &Value) -> (u64, u64) {
    (
        u64_of(info, "/space/stored_bytes"),
        u64_of(info, "/space/live_bytes"),
    )
}

fn space_flow(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let mnt = work.path().join("mnt");
    let config = format!(
        "{}[gc]\ngrace_secs = 0\nkeep_manifests = 1\nallow_short_grace = true\n\
         [space]\ncompact_interval_secs = 0\ngc_interval_secs = 0\n",
        default_config(work.path(), &store)
    );
    println!("=== space on the local store, {t}");
    let daemon = Daemon::start_with_config(work.path(), &config, &store, t);
    let info = daemon.json(&["create", "space", "--size", "256M"]);
    let dev = device_of(&info, t);
    let discard = std::fs::read_to_string(
        "/sys/block/".to_string() + dev.trim_start_matches("/dev/") + "/queue/discard_granularity",
    )
    .unwrap_or_default();
    println!("discard granularity: {} bytes", discard.trim());
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let m = Mount::new(&dev, &mnt);
    let doomed = files("big", 4, 24 << 20, 500);
    let kept = files("keep", 16, 256 << 10, 900);
    for (name, data) in doomed.iter().chain(&kept) {
        std::fs::write(mnt.join(name), data).expect("write a file");
    }
    run("sync", &[]);
    daemon.json(&["flush", "space"]);
    let full = daemon.json(&["compact", "space"]);
    let (stored_full, live_full) = (u64_of(&full, "/stored_bytes"), u64_of(&full, "/live_bytes"));
    println!("written and flushed: stored {stored_full} bytes, live {live_full} bytes: {full}");
    assert!(
        live_full > 90 << 20,
        "the files are live in the store: {full}"
    );

    for (name, _) in &doomed {
        std::fs::remove_file(mnt.join(name)).expect("delete a file");
    }
    run("sync", &[]);
    let trim = run("fstrim", &["-v", mnt.to_str().expect("path")]);
    println!("{}", String::from_utf8_lossy(&trim.stdout).trim_end());
    daemon.json(&["flush", "space"]);
    let info = daemon.show("space");
    let (_, live_trimmed) = space_of(&info);
    println!("deleted, trimmed, flushed: live {live_trimmed} bytes");
    assert!(
        live_trimmed < live_full / 4,
        "fstrim freed the deleted files' blocks: {live_trimmed} of {live_full} bytes still live"
    );

    let done = daemon.json(&["compact", "space"]);
    println!("compacted and collected: {done}");
    let (stored, live) = (u64_of(&done, "/stored_bytes"), u64_of(&done, "/live_bytes"));
    let files_bytes: usize = kept.iter().map(|(_, d)| d.len()).sum();
    println!(
        "store: {stored} bytes for {live} live bytes ({:.3}x; the files left hold {files_bytes} \
         bytes, the rest is ext4's metadata and journal); before the deletes {stored_full}",
        stored as f64 / live as f64
    );
    assert!(
        stored as f64 <= live as f64 * BOUND,
        "the store holds {stored} bytes for {live} live bytes (more than {BOUND}x)"
    );
    let info = daemon.show("space");
    let wa = info.pointer("/space/write_amplification").cloned();
    println!("volume show space: {}", info["space"]);
    assert!(wa.is_some_and(|w| w.as_f64().is_some()), "{info}");
    m.unmount();

    // Everything a manifest needs is still there: recreated cold from the store.
    daemon.json(&["rm", "space"]);
    let info = daemon.json(&["create", "space", "--attach-existing"]);
    let dev = device_of(&info, t);
    run("e2fsck", &["-fn", &dev]);
    let m = Mount::new(&dev, &mnt);
    for (name, want) in &kept {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(got == *want, "{name} differs after compaction and GC");
    }
    for (name, _) in &doomed {
        assert!(!mnt.join(name).exists(), "{name} came back");
    }
    println!(
        "recreated cold: e2fsck clean, {} files read back identical",
        kept.len()
    );
    m.unmount();
    daemon.json(&["rm", "space", "--purge"]);
    daemon.stop();
    assert!(Path::new(&work.path()).exists());
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn space_follows_live_data_zero_copy() {
    space_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn space_follows_live_data_user_copy() {
    space_flow(Transport::UserCopy);
}
