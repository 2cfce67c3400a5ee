//! Kernel test of online resize through the real daemon, on both transports: ext4 on a 1 GiB
//! volume, mounted; files written; the old 1 GiB nearly filled (a `fallocate`d file: metadata
//! only, no data written, so the run stays short under emulation); `glidefs volume resize` to
//! 2 GiB while mounted (the block device must show 2 GiB at once: ublk UPDATE_SIZE);
//! `resize2fs` online; files of a checksummed pattern written into the new space (`filefrag`
//! must place most of their bytes past 1 GiB), `sync`, the page cache dropped, every file
//! verified. Then the daemon is killed (SIGKILL, a crash right after the resize was
//! acknowledged) and restarted: it recovers the device in place with the filesystem still
//! mounted, and the device and the volume must still be 2 GiB with every file intact. Then a
//! crash in the middle of a resize (killed, `state.json` edited to 3 GiB as the resize's
//! first step leaves it): the next start must grow the volume and the recovered device to 3
//! GiB. Finally unmounted, `e2fsck -fn` clean, mounted again and verified once more.
//!
//! Prints the kernel version and the transport (the volume line). Needs /dev/ublk-control,
//! mkfs.ext4, resize2fs, e2fsck, fallocate and filefrag: `scripts/test` runs it under
//! `scripts/ublk-vm`. A missing tool fails the test with its name.

mod support;

use std::path::Path;

use glidefs_testkit::pattern::pattern;
use ublk_core::Transport;

use support::daemon::{device_of, run, u64_of, Daemon, Mount, Store};

const GIB: u64 = 1 << 30;
/// Files written into the grown part, and their size.
const NEW_FILES: u64 = 2;
const NEW_FILE_BYTES: usize = 8 << 20;

/// The kernel's idea of the block device's size (`/sys/block/ublkbN/size`, 512-byte sectors).
fn device_bytes(dev: &str) -> u64 {
    let name = dev.trim_start_matches("/dev/");
    let sectors = std::fs::read_to_string(format!("/sys/block/{name}/size"))
        .unwrap_or_else(|e| panic!("size of {dev}: {e}"));
    sectors.trim().parse::<u64>().expect("sectors") * 512
}

/// `count` files of the testkit's pattern (each 4 KiB names its offset and generation, so a
/// misplaced or stale page is told from a right one).
fn files(prefix: &str, count: u64, len: usize, generation: u64) -> Vec<(String, Vec<u8>)> {
    (0..count)
        .map(|i| {
            let name = format!("{prefix}{i}.bin");
            (name, pattern(i * len as u64, generation, len))
        })
        .collect()
}

/// Drops the page cache (so reads come from the device), then checks every file byte for
/// byte against the pattern it was written with.
fn verify(mnt: &Path, files: &[(String, Vec<u8>)], when: &str) {
    run("sync", &[]);
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop caches");
    for (name, want) in files {
        let got = std::fs::read(mnt.join(name)).unwrap_or_else(|e| panic!("{when}: {name}: {e}"));
        let first_bad = got.iter().zip(want).position(|(a, b)| a != b);
        assert!(
            got.len() == want.len() && first_bad.is_none(),
            "{when}: {name} differs: {} of {} bytes, first difference at {first_bad:?}",
            got.len(),
            want.len()
        );
    }
    println!("{when}: {} files verified", files.len());
}

/// Bytes of `file` whose physical location on the device lies at or past `from` (`filefrag
/// -v`, extents in 4 KiB blocks).
fn bytes_past(file: &Path, from: u64) -> u64 {
    let out = run("filefrag", &["-v", "-b4096", file.to_str().expect("path")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut past = 0;
    // Extent lines: "   0:        0..    2047:     294912..    296959:   2048: ..."
    for line in text.lines() {
        let cols: Vec<&str> = line.split(':').map(str::trim).collect();
        if cols.len() < 4 || cols[0].parse::<u64>().is_err() {
            continue;
        }
        let (Some(start), Some(len)) = (
            cols[2]
                .split("..")
                .next()
                .and_then(|s| s.trim().parse::<u64>().ok()),
            cols[3].parse::<u64>().ok(),
        ) else {
            continue;
        };
        let (first, end) = (start * 4096, (start + len) * 4096);
        past += end.saturating_sub(first.max(from));
    }
    past
}

fn resize_flow(t: Transport) {
    let start = std::time::Instant::now();
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let mnt = work.path().join("mnt");
    println!(
        "=== online resize 1 GiB -> 2 GiB, ext4 mounted, kernel {}, {t}",
        ublk_core::features::kernel_release()
    );
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "grow", "--size", "1G"]);
    let dev = device_of(&info, t);
    assert_eq!(device_bytes(&dev), GIB);
    // No root reserve (-m 0): the filler below must leave the old part really full.
    run(
        "mkfs.ext4",
        &[
            "-q",
            "-F",
            "-m",
            "0",
            "-E",
            "lazy_itable_init=1,lazy_journal_init=1",
            &dev,
        ],
    );
    let m = Mount::new(&dev, &mnt);
    let old = files("old", 1, 4 << 20, 100);
    for (name, data) in &old {
        std::fs::write(mnt.join(name), data).expect("write a file");
    }
    // Fill the old 1 GiB but 24 MiB (16 of them ext4's own reserve for extent conversions),
    // so that new files can mostly go only to the space the resize adds.
    run("sync", &[]);
    let free = fs_bytes(&mnt, "%f");
    let filler = (free.saturating_sub(24 << 20)) >> 20 << 20;
    run(
        "fallocate",
        &[
            "-l",
            &filler.to_string(),
            mnt.join("filler").to_str().expect("path"),
        ],
    );
    run("sync", &[]);
    println!("filler: {filler} of {free} free bytes allocated");

    let r = daemon.json(&["resize", "grow", "2G"]);
    println!("resize: {r}");
    assert_eq!(
        (u64_of(&r, "/previous_size"), u64_of(&r, "/size")),
        (GIB, 2 * GIB)
    );
    assert_eq!(r["device"].as_str(), Some(dev.as_str()));
    assert_eq!(
        device_bytes(&dev),
        2 * GIB,
        "the kernel sees the new size at once"
    );
    assert_eq!(u64_of(&daemon.show("grow"), "/size"), 2 * GIB);
    let out = run("resize2fs", &[&dev]);
    println!(
        "resize2fs: {}",
        String::from_utf8_lossy(&out.stdout).trim_end()
    );
    let st = fs_bytes(&mnt, "%b");
    println!("ext4 after resize2fs: {st} bytes");
    assert!(st > GIB + GIB / 2, "the file system grew: {st} bytes");

    let new = files("new", NEW_FILES, NEW_FILE_BYTES, 500);
    for (name, data) in &new {
        std::fs::write(mnt.join(name), data).expect("write a file past the old end");
    }
    run("sync", &[]);
    let past: u64 = new.iter().map(|(n, _)| bytes_past(&mnt.join(n), GIB)).sum();
    let total = NEW_FILES * NEW_FILE_BYTES as u64;
    println!("new files: {past} of {total} bytes lie past 1 GiB on the device");
    assert!(
        past >= total / 2,
        "the new files must live mostly past the old end: {past} of {total} bytes"
    );
    verify(&mnt, &old, "after resize2fs (old files)");
    verify(&mnt, &new, "after resize2fs (new files)");
    println!("{t}: resized and verified at {:?}", start.elapsed());

    // A crash right after the acknowledged resize and writes: the restarted daemon recovers
    // the device in place, still 2 GiB, the file system mounted throughout.
    daemon.kill9();
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.show("grow");
    assert_eq!(u64_of(&info, "/size"), 2 * GIB);
    assert_eq!(device_of(&info, t), dev, "the same device, recovered");
    assert_eq!(device_bytes(&dev), 2 * GIB);
    verify(&mnt, &old, "after the crash (old files)");
    verify(&mnt, &new, "after the crash (new files)");
    println!(
        "{t}: recovered after SIGKILL and verified at {:?}",
        start.elapsed()
    );

    // A crash in the middle of a resize, after `state.json` recorded 3 GiB but before the
    // engine and the device moved: the next start grows the volume as it opens it and the
    // recovered device with it.
    daemon.kill9();
    let state_path = work.path().join("data/state.json");
    let text = std::fs::read_to_string(&state_path).expect("read state.json");
    let mut state: serde_json::Value = serde_json::from_str(&text).expect("state.json");
    state["volumes"][0]["size"] = serde_json::json!(3 * GIB);
    std::fs::write(&state_path, state.to_string()).expect("write state.json");
    let daemon = Daemon::start(work.path(), &store, t);
    assert_eq!(u64_of(&daemon.show("grow"), "/size"), 3 * GIB);
    assert_eq!(device_bytes(&dev), 3 * GIB, "the recovered device grew too");
    run("resize2fs", &[&dev]);
    let last = files("last", 1, 4 << 20, 900);
    std::fs::write(mnt.join(&last[0].0), &last[0].1).expect("write after the second grow");
    verify(&mnt, &new, "grown at the restart (new files)");
    verify(&mnt, &last, "grown at the restart (last file)");
    println!(
        "{t}: grown at the restart and verified at {:?}",
        start.elapsed()
    );
    m.unmount();
    run("e2fsck", &["-fn", &dev]);
    let m = Mount::new(&dev, &mnt);
    verify(&mnt, &last, "remounted (last file)");
    verify(&mnt, &new, "remounted (new files)");
    verify(&mnt, &old, "remounted (old files)");
    m.unmount();
    daemon.json(&["rm", "grow", "--purge"]);
    daemon.stop();
    println!("{t}: online resize checked in {:?}", start.elapsed());
}

/// Blocks of the file system mounted at `dir` counted by `stat -f` field `what` (`%b`
/// total, `%f` free), in bytes.
fn fs_bytes(dir: &Path, what: &str) -> u64 {
    let format = format!("%S {what}");
    let out = run("stat", &["-f", "-c", &format, dir.to_str().expect("path")]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut it = text
        .split_whitespace()
        .map(|s| s.parse::<u64>().expect("stat -f"));
    let (bs, blocks) = (it.next().expect("block size"), it.next().expect("blocks"));
    bs * blocks
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn online_resize_zero_copy() {
    resize_flow(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn online_resize_user_copy() {
    resize_flow(Transport::UserCopy);
}
