//! A full cache filesystem (issue 20, item 7): the daemon's data dir on a small tmpfs, nearly
//! filled by a ballast file; writes acknowledged before it fills, and unacknowledged ones
//! whose WAL records are still buffered; fio writing to the device
//! until the cache cannot take more (writes fail); while full, a FLUSH and a flush to the
//! store (either may fail); the ballast deleted. Then, with the same
//! daemon (no restart): the volume is `running`, the writes acknowledged before read back,
//! new writes and a FLUSH succeed, a flush to the store succeeds, and a fio verify run passes.
//! Every expectation that fails is listed, in order, in the failure message.
//!
//! Needs /dev/ublk-control and fio: `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use support::daemon;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use daemon::{device_of, fio_verify, run, str_of, Daemon, Store};
use glidefs_testkit::blockdev::{fill_block, open_direct, write_blocks, AlignedBuf};
use ublk_core::Transport;

/// The cache filesystem (tmpfs) size.
const CACHE_FS: &str = "48M";
/// Free bytes left beside the ballast.
const LEFT_FREE: u64 = 6 << 20;
/// 4 KiB blocks written and acknowledged before the filesystem fills (2 MiB).
const ACKED: u64 = 512;

fn free_bytes(dir: &Path) -> u64 {
    let st = rustix::fs::statvfs(dir).unwrap_or_else(|e| panic!("statvfs {}: {e}", dir.display()));
    st.f_bavail * st.f_frsize
}

/// Reads blocks `[0, ACKED)` and says where they differ from generation `gen`.
fn check_gen(dev: &str, gen: u64) -> Result<(), String> {
    let f = open_direct(dev);
    let mut buf = AlignedBuf::new(64 << 10);
    let mut want = vec![0u8; 4096];
    for first in (0..ACKED).step_by(16) {
        f.read_exact_at(buf.as_mut_slice(), first * 4096)
            .map_err(|e| format!("read of blocks {first}..{}: {e}", first + 16))?;
        for i in 0..16 {
            fill_block(&mut want, gen, first + i);
            let got = &buf.as_slice()[(i as usize) * 4096..(i as usize + 1) * 4096];
            if got != want.as_slice() {
                return Err(format!(
                    "block {}: expected gen {gen}, found header {:02x?}",
                    first + i,
                    &got[..16]
                ));
            }
        }
    }
    Ok(())
}

fn enospc(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let work = work.path();
    let fs = work.join("cachefs");
    std::fs::create_dir_all(&fs).expect("mount point");
    run(
        "mount",
        &[
            "-t",
            "tmpfs",
            "-o",
            &format!("size={CACHE_FS}"),
            "tmpfs",
            fs.to_str().expect("path"),
        ],
    );
    let _umount = Unmount(fs.clone());
    println!("=== a full cache filesystem ({CACHE_FS} tmpfs), {t}");
    let store = Store::local(work);
    let dwork = work.join("daemon");
    let config = daemon::one_queue_config(&fs.join("data"), &dwork, &store);
    let d = Daemon::start_with_config(&dwork, &config, &store, t);
    let dev = device_of(&d.json(&["create", "full", "--size", "64M"]), t);
    let f = open_direct(&dev);
    write_blocks(&f, 1, 0, ACKED, 16);
    f.sync_data().expect("FLUSH after the first writes");
    // Not acknowledged yet: one 4 KiB write into each of 256 new 64 KiB blocks at 16M..32M,
    // so the WAL holds 8 KiB of buffered records that the FLUSH while full must write out.
    let mut page = AlignedBuf::new(4096);
    for b in 256..512u64 {
        fill_block(page.as_mut_slice(), 3, b * 16);
        f.write_all_at(page.as_slice(), b * 16 * 4096)
            .unwrap_or_else(|e| panic!("write block {b} before the disk fills: {e}"));
    }
    drop(f);

    let ballast = fs.join("ballast");
    let fill = free_bytes(&fs).saturating_sub(LEFT_FREE);
    std::fs::write(&ballast, vec![0xA5u8; usize::try_from(fill).expect("size")])
        .expect("write the ballast");
    println!(
        "ballast {} MiB; {} MiB left free on the cache filesystem",
        fill >> 20,
        free_bytes(&fs) >> 20
    );

    // fio until the cache cannot take more: errors expected.
    let t0 = Instant::now();
    let out = Command::new("timeout")
        .args([
            "300",
            "fio",
            "--name=fill",
            &format!("--filename={dev}"),
            "--direct=1",
            "--ioengine=io_uring",
            "--rw=write",
            "--bs=64k",
            "--offset=32M",
            "--size=32M",
            "--iodepth=8",
            "--continue_on_error=all",
            "--output-format=json",
        ])
        .output()
        .expect("run fio");
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).unwrap_or_default();
    let errors = json["jobs"][0]["total_err"].as_u64().unwrap_or(0);
    let written = json["jobs"][0]["write"]["io_bytes"].as_u64().unwrap_or(0);
    println!(
        "fio fill: {} ({errors} I/O errors, {} MiB written) in {:?}; {} KiB free; fio's stderr: {}",
        out.status,
        written >> 20,
        t0.elapsed(),
        free_bytes(&fs) >> 10,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    assert!(
        errors > 0 || !out.status.success(),
        "the cache filesystem never filled: fio saw no error\n{text}"
    );
    // While it is full: a FLUSH (the WAL's buffered records must be written out) and a flush
    // to the store (it must stage the blocks it uploads). Either may fail; neither may break
    // the volume for good.
    let f = open_direct(&dev);
    println!("FLUSH on the device while full: {:?}", f.sync_data());
    drop(f);
    let flush = d.cli(&["flush", "full"]);
    println!(
        "flush to the store while full: {} {}{}",
        flush.status,
        String::from_utf8_lossy(&flush.stdout).trim(),
        String::from_utf8_lossy(&flush.stderr).trim()
    );
    println!("volume while full: {}", d.show("full"));
    d.print_log_lines(&["No space", "ENOSPC", "ERROR"]);

    std::fs::remove_file(&ballast).expect("delete the ballast");
    println!("ballast deleted: {} MiB free", free_bytes(&fs) >> 20);

    // Without a restart, everything works again.
    let mut fails = Vec::new();
    let info = d.show("full");
    if str_of(&info, "/state") != "running" {
        fails.push(format!("the volume is not running: {info}"));
    }
    if let Err(e) = check_gen(&dev, 1) {
        fails.push(format!("writes acknowledged before the disk filled: {e}"));
    }
    let f = open_direct(&dev);
    let mut buf = AlignedBuf::new(64 << 10);
    let mut wrote = Ok(());
    for first in (0..ACKED).step_by(16) {
        for i in 0..16u64 {
            let s = usize::try_from(i * 4096).expect("offset");
            fill_block(&mut buf.as_mut_slice()[s..s + 4096], 2, first + i);
        }
        if let Err(e) = f.write_all_at(buf.as_slice(), first * 4096) {
            wrote = Err(format!("write of blocks {first}..{}: {e}", first + 16));
            break;
        }
    }
    match wrote.and_then(|()| f.sync_data().map_err(|e| format!("FLUSH: {e}"))) {
        Ok(()) => {
            if let Err(e) = check_gen(&dev, 2) {
                fails.push(format!("writes after space returned: {e}"));
            }
        }
        Err(e) => fails.push(format!("writes after space returned: {e}")),
    }
    drop(f);
    let flush = d.cli(&["flush", "full"]);
    if !flush.status.success() {
        fails.push(format!(
            "flush to the store after space returned: {}{}",
            String::from_utf8_lossy(&flush.stdout),
            String::from_utf8_lossy(&flush.stderr)
        ));
    }
    if fails.is_empty() {
        fio_verify(
            &dev,
            "after-enospc",
            &[
                "--rw=randwrite",
                "--bs=4k",
                "--offset=8M",
                "--size=8M",
                "--iodepth=8",
            ],
            false,
            Duration::from_secs(300),
        );
    }
    if !fails.is_empty() {
        d.print_log_lines(&["ERROR", "WARN"]);
    }
    assert!(
        fails.is_empty(),
        "after the cache filesystem filled and space returned (no restart):\n{}",
        fails.join("\n")
    );
    d.json(&["rm", "full", "--purge"]);
    d.stop();
}

struct Unmount(std::path::PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn enospc_zero_copy() {
    enospc(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn enospc_user_copy() {
    enospc(Transport::UserCopy);
}
