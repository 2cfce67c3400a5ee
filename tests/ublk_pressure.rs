//! Kernel test of memory pressure: a writer in a cgroup (v2) whose `memory.max` is far below
//! what it dirties, writing buffered through ext4 on a glidefs device. Its dirty pages can
//! only be cleaned (and its reclaim and dirty throttling only progress) through the daemon's
//! device, so a daemon thread that blocks on that same memory would deadlock the writer: the
//! loop/NBD/FUSE hazard that `PR_SET_IO_FLUSHER` on every thread that serves I/O (queue
//! threads and the whole runtime) guards against.
//!
//! `cat` writes a 256 MiB file through the page cache (the kernel's writeback sends it, in
//! pieces that are mostly partial 64 KiB blocks, through the daemon's write paths), then
//! `sync`; both inside the cgroup (64 MiB). It must finish within [`LIMIT`] with no OOM kill
//! in the cgroup; the daemon must still run; the file must read back identical after the
//! page cache is dropped (so from the device); the kernel log must hold no hung-task report.
//! The cgroup's `memory.events` and `memory.peak` are printed.
//!
//! The daemon itself runs outside the cgroup. Put in it as well (a 256 MiB cgroup, debug build), it
//! was OOM-killed once the writer had filled the limit, and the device then waited for a
//! new daemon (the kernel held its I/O), as after any crash.
//!
//! Needs /dev/ublk-control, cgroup v2 with the memory controller, mkfs.ext4:
//! `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use support::daemon;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use daemon::{device_of, run, Daemon, Mount, Store};
use ublk_core::Transport;

/// The cgroup's memory limit.
const MEMORY_MAX: u64 = 64 << 20;
/// One pattern chunk (kept outside the cgroup, on the test's tmpfs).
const CHUNK: usize = 16 << 20;
/// Distinct pattern chunks; the file repeats them.
const PATTERNS: usize = 2;
/// Chunks written: 256 MiB in all, four times the limit. The guest's `/tmp` is a tmpfs in
/// its memory and holds the cache and the store as well: each gets the whole file, so more
/// than this fills it in a 2 GiB VM (with 512 MiB it filled, and in one run the daemon no
/// longer answered the final `rm`: a tmpfs that fills takes the guest's memory with it).
const CHUNKS: usize = 16;
/// What is written, in MiB.
const TOTAL_MIB: usize = (CHUNKS * CHUNK) >> 20;
/// Writing and syncing taking longer than this under emulation is a hang.
const LIMIT: Duration = Duration::from_secs(400);

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// A cgroup v2 directory with the memory controller, removed on drop (once empty).
struct Cgroup(PathBuf);

impl Cgroup {
    fn new(name: &str, memory_max: u64) -> Cgroup {
        let root = Path::new(CGROUP_ROOT);
        let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
            .unwrap_or_else(|e| panic!("cgroup v2 is not mounted at {CGROUP_ROOT}: {e}"));
        assert!(
            controllers.split_whitespace().any(|c| c == "memory"),
            "cgroup v2 at {CGROUP_ROOT} has no memory controller: {controllers}"
        );
        // Children of the root get the memory controller only when the root delegates it.
        std::fs::write(root.join("cgroup.subtree_control"), "+memory")
            .unwrap_or_else(|e| panic!("enable the memory controller for children: {e}"));
        let dir = root.join(name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        std::fs::write(dir.join("memory.max"), memory_max.to_string()).expect("set memory.max");
        // No swap in the VM, but never let the limit be met by swapping.
        let _ = std::fs::write(dir.join("memory.swap.max"), "0");
        Cgroup(dir)
    }

    fn procs(&self) -> PathBuf {
        self.0.join("cgroup.procs")
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.0.join(file))
            .unwrap_or_else(|e| format!("({file}: {e})"))
            .trim()
            .replace('\n', ", ")
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir(&self.0) {
            eprintln!("could not remove cgroup {}: {e}", self.0.display());
        }
    }
}

/// Deterministic, incompressible-looking bytes for chunk `i`.
fn chunk(i: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    let mut out = Vec::with_capacity(CHUNK);
    while out.len() < CHUNK {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out
}

/// Fails with a clear message when `dir`'s file system cannot hold the patterns, the cache's
/// copy and the store's copy of the file (plus a quarter for metadata and logs).
fn assert_room(dir: &Path) {
    let need = (PATTERNS * CHUNK + 2 * CHUNKS * CHUNK) as u64 * 5 / 4;
    let st = rustix::fs::statvfs(dir).expect("statvfs of the work dir");
    let free = st.f_bavail * st.f_frsize;
    assert!(
        free >= need,
        "{} has {} MiB free; this test needs {} MiB (patterns, cache and store)",
        dir.display(),
        free >> 20,
        need >> 20
    );
}

fn hung_task_reports() -> Vec<String> {
    let out = Command::new("dmesg").output().expect("run dmesg");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("blocked for more than") || l.contains("hung_task"))
        .map(str::to_string)
        .collect()
}

fn memory_pressure(t: Transport) {
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let mnt = work.path().join("mnt");
    println!("=== buffered writes under memory.max = {MEMORY_MAX} B, {t}");
    let hung_before = hung_task_reports().len();
    assert_room(work.path());
    let daemon = Daemon::start(work.path(), &store, t);
    let info = daemon.json(&["create", "mp", "--size", "1G"]);
    let dev = device_of(&info, t);
    run("mkfs.ext4", &["-q", "-F", &dev]);
    let m = Mount::new(&dev, &mnt);
    // The patterns live outside the cgroup, on the test's tmpfs; kept here for the check.
    let chunks: Vec<Vec<u8>> = (0..PATTERNS).map(chunk).collect();
    let patterns: Vec<PathBuf> = chunks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let p = work.path().join(format!("pattern{i}"));
            std::fs::File::create(&p)
                .and_then(|mut f| f.write_all(c))
                .unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
            p
        })
        .collect();

    let cg = Cgroup::new(
        &format!("glidefs-pressure-{}", std::process::id()),
        MEMORY_MAX,
    );
    let target = mnt.join("big.bin");
    let sources: Vec<String> = (0..CHUNKS)
        .map(|i| patterns[i % patterns.len()].display().to_string())
        .collect();
    // The shell joins the cgroup, then `cat` and `sync` run inside it.
    let script = format!(
        "echo $$ > {} && cat {} > {} && sync",
        cg.procs().display(),
        sources.join(" "),
        target.display()
    );
    let start = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("spawn the writer");
    let status = loop {
        if let Some(s) = child.try_wait().expect("poll the writer") {
            break s;
        }
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            panic!(
                "writing {} MiB under memory.max = {} MiB did not finish within {LIMIT:?} (memory.events: {}; hung tasks: {:?})",
                TOTAL_MIB,
                MEMORY_MAX >> 20,
                cg.read("memory.events"),
                hung_task_reports()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = start.elapsed();
    let events = cg.read("memory.events");
    assert!(
        status.success(),
        "the writer failed: {status} (memory.events: {events})"
    );
    assert!(
        events.contains("oom_kill 0"),
        "something in the cgroup was OOM-killed: memory.events: {events}"
    );
    println!(
        "wrote and synced {} MiB in {took:?}; memory.peak {}; memory.events: {}",
        TOTAL_MIB,
        cg.read("memory.peak"),
        cg.read("memory.events")
    );
    assert_eq!(
        daemon.show("mp")["state"].as_str(),
        Some("running"),
        "the daemon or its volume did not survive the pressure:\n{}",
        daemon.log_text()
    );
    // Read back from the device, not from the page cache.
    std::fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the page cache");
    println!("page cache dropped; reading the file back");
    let mut f = std::fs::File::open(&target).expect("open the written file");
    let mut buf = vec![0u8; CHUNK];
    for i in 0..CHUNKS {
        std::io::Read::read_exact(&mut f, &mut buf)
            .unwrap_or_else(|e| panic!("read chunk {i}: {e}"));
        assert!(
            buf == chunks[i % chunks.len()],
            "chunk {i} of the file reads back differently"
        );
        if i % 8 == 7 {
            println!("read back {} MiB", ((i + 1) * CHUNK) >> 20);
        }
    }
    println!("all {} MiB read back identical from the device", TOTAL_MIB);
    let hung = hung_task_reports();
    assert_eq!(
        hung.len(),
        hung_before,
        "the kernel reported hung tasks: {hung:?}"
    );
    drop(f);
    m.unmount();
    daemon.json(&["rm", "mp", "--purge"]);
    daemon.stop();
    drop(cg);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn pressure_buffered_writes_zero_copy() {
    memory_pressure(Transport::ZeroCopy);
}

#[test]
#[ignore = "needs /dev/ublk-control: scripts/test runs it under scripts/ublk-vm"]
fn pressure_buffered_writes_user_copy() {
    memory_pressure(Transport::UserCopy);
}
