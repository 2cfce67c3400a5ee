//! Kernel tests of the hand-off stall, measured from the guest's side: fio writes random
//! 4 KiB blocks to a device (verifying them as it goes, `verify_backlog`) while the daemon
//! hands its devices off again and again, alternating `glidefs handoff` (a new process takes
//! over) and SIGHUP (the daemon re-executes itself), at least [`MIN_HANDOFFS`] times.
//!
//! fio logs the completion latency of every I/O with wall-clock timestamps
//! (`log_unix_epoch`). A request the kernel held during a hand-off completes after the
//! successor reattached the device, so the largest completion latency of the I/Os that
//! completed between the request and one second after the successor answered is that
//! hand-off's stall. Each test prints one line per hand-off (kind, when, how long until the
//! successor answered, the stall for reads and writes), the daemon's own breakdown
//! (`ublk device detached` quiesce/total, `volume opened` phases, `ublk device recovered`),
//! and a JSON summary with the median and maximum stall; the summary and the per-100 ms
//! timeline of the largest completion latency go to
//! `target/kernel-test-results/ublk_handoff/` (`$GLIDEFS_KERNEL_RESULTS` overrides the
//! parent). Loads: plain writes on both transports, and FUA writes (`--sync=1`: every write's
//! durability step is deferred to the runtime, so hand-offs land while requests are in the
//! server) on zero-copy.
//!
//! What is asserted: fio finished without an I/O or verify error across every hand-off, the
//! device kept its id, and no stall reached [`WEDGE`] (the class of the old 5 s detach and the
//! 30 s quiesce waits). The stall figures themselves are reported, not asserted.
//!
//! Needs /dev/ublk-control and fio: `scripts/test` runs it under `scripts/ublk-vm`.

mod support;

use support::daemon;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use daemon::{device_of, Daemon, Store};
use serde_json::{json, Value};
use ublk_core::Transport;

/// Hand-offs each test must fit into fio's run.
const MIN_HANDOFFS: usize = 10;
/// fio's run time; hand-offs go on until [`TAIL`] before its end.
const RUNTIME: Duration = Duration::from_secs(50);
/// Time left at the end of fio's run with no hand-off (so the last one completes in it).
const TAIL: Duration = Duration::from_secs(8);
/// Pause between hand-offs (I/O flows normally in it).
const GAP: Duration = Duration::from_millis(700);
/// A stall this long is a wedge, not a slow hand-off: the test fails.
const WEDGE: Duration = Duration::from_secs(5);
/// Width of one timeline bucket.
const BUCKET_MS: u64 = 100;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Load {
    /// Plain O_DIRECT writes: served inline.
    Plain,
    /// O_SYNC writes: each is a FUA write whose durability step is deferred.
    Fua,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Plain => "plain",
            Load::Fua => "fua-deferred",
        }
    }
}

/// One hand-off, wall-clock milliseconds since the epoch.
struct Handoff {
    kind: &'static str,
    requested: u64,
    answered: u64,
}

/// One fio completion: wall-clock ms, latency ns, whether it was a write.
struct Completion {
    at: u64,
    clat_ns: u64,
    write: bool,
}

fn now_ms() -> u64 {
    let since = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970");
    u64::try_from(since.as_millis()).expect("ms fit u64")
}

fn results_dir() -> PathBuf {
    let parent = std::env::var("GLIDEFS_KERNEL_RESULTS").map_or_else(
        |_| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("workspace root")
                .join("target/kernel-test-results")
        },
        PathBuf::from,
    );
    let dir = parent.join("ublk_handoff");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// Parses fio's `--write_lat_log` clat file: `time_ms, clat_ns, dir, bs, offset[, prio]`.
fn completions(path: &Path) -> Vec<Completion> {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<u64> = l
                .split(',')
                .take(3)
                .map(|x| {
                    x.trim()
                        .parse()
                        .unwrap_or_else(|e| panic!("{}: bad line `{l}`: {e}", path.display()))
                })
                .collect();
            assert_eq!(f.len(), 3, "{}: short line `{l}`", path.display());
            Completion {
                at: f[0],
                clat_ns: f[1],
                write: f[2] == 1,
            }
        })
        .collect()
}

/// The largest completion latency (ms) of the reads and of the writes that completed in
/// `[from, to]`, and how many did.
fn stall_in(log: &[Completion], from: u64, to: u64) -> (f64, f64, usize) {
    let (mut read, mut write, mut n) = (0u64, 0u64, 0);
    for c in log.iter().filter(|c| (from..=to).contains(&c.at)) {
        n += 1;
        let slot = if c.write { &mut write } else { &mut read };
        *slot = (*slot).max(c.clat_ns);
    }
    (read as f64 / 1e6, write as f64 / 1e6, n)
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `GET path` on the daemon's unix socket (HTTP/1.0: the server closes after the answer).
fn http_get(socket: &Path, path: &str) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket)
        .unwrap_or_else(|e| panic!("connect {}: {e}", socket.display()));
    write!(s, "GET {path} HTTP/1.0\r\nHost: glidefs\r\n\r\n").expect("send the request");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read the answer");
    out
}

/// Sum of the samples of metric `name` in Prometheus text.
fn metric(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Runs the daemons from a copy of the binary on the guest's own file system: executed from
/// the host's 9p share (where the VM sees the build tree), every page the re-executed image
/// touches is a 9p read under emulation, hundreds of ms that a daemon installed on a local
/// disk does not pay. `scripts/lib/kernel-tests` already provides such a copy as `$GLIDEFS_BIN`;
/// otherwise one is made here (once per test binary). Returns its path.
fn local_binary() -> &'static Path {
    static COPY: OnceLock<(Option<tempfile::TempDir>, PathBuf)> = OnceLock::new();
    let (_, path) = COPY.get_or_init(|| {
        if let Ok(bin) = std::env::var("GLIDEFS_BIN") {
            println!("daemon binary: {bin} ($GLIDEFS_BIN)");
            return (None, PathBuf::from(bin));
        }
        let dir = tempfile::tempdir().expect("dir for the binary");
        let path = dir.path().join("glidefs");
        let from = daemon::glidefs();
        let start = Instant::now();
        std::fs::copy(&from, &path).unwrap_or_else(|e| panic!("copy {from}: {e}"));
        println!(
            "daemon binary: {from} copied to {} in {:?}",
            path.display(),
            start.elapsed()
        );
        (Some(dir), path)
    });
    path
}

/// The daemon's config: the kernel tests' usual one, but flushing to the store on a 10 s
/// interval (fio's 16 MiB region never reaches the 64 MiB threshold): a hand-off first waits
/// for a flush in progress, so a 1 s interval would make most hand-offs wait seconds for
/// one (the I/O stall is unaffected: the devices serve while the predecessor waits).
fn config(work: &Path, store: &Store) -> String {
    let usual = daemon::default_config(work, store);
    let flush = "flush_threshold_bytes = \"1M\"\nflush_interval_secs = 1\n";
    assert!(usual.contains(flush), "the usual config changed: {usual}");
    usual.replace(
        flush,
        "flush_threshold_bytes = \"64M\"\nflush_interval_secs = 10\n",
    )
}

fn handoff_stall(t: Transport, load: Load) {
    // The tests of this binary run one at a time (`--test-threads=1`): nothing reads the
    // environment while it changes.
    std::env::set_var("GLIDEFS_BIN", local_binary());
    let work = tempfile::tempdir().expect("work dir");
    let store = Store::local(work.path());
    let label = format!("{t}, {} load", load.name());
    println!("=== hand-off stall under fio, {label}");
    let mut d = Daemon::start_with_config(work.path(), &config(work.path(), &store), &store, t);
    let info = d.json(&["create", "ho", "--size", "64M"]);
    let dev = device_of(&info, t);
    let lat_prefix = work.path().join("lat");
    let mut args = vec![
        "--output-format=json".to_string(),
        "--direct=1".into(),
        "--ioengine=io_uring".into(),
        format!("--filename={dev}"),
        "--log_unix_epoch=1".into(),
        format!("--write_lat_log={}", lat_prefix.display()),
        "--time_based".into(),
        format!("--runtime={}", RUNTIME.as_secs()),
        "--name=handoff".into(),
        "--rw=randwrite".into(),
        "--bs=4k".into(),
        "--size=16M".into(),
        "--iodepth=8".into(),
        "--rate_iops=300".into(),
        "--verify=crc32c".into(),
        "--verify_backlog=64".into(),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
    ];
    if load == Load::Fua {
        args.push("--sync=1".into());
    }
    let fio_start = Instant::now();
    let fio = std::thread::spawn(move || Command::new("fio").args(&args).output());
    std::thread::sleep(Duration::from_secs(2));
    let mut handoffs = Vec::new();
    while fio_start.elapsed() + TAIL < RUNTIME && !fio.is_finished() {
        let kind = if handoffs.len() % 2 == 0 {
            "handoff"
        } else {
            "sighup"
        };
        let requested = now_ms();
        if kind == "handoff" {
            d = d.handoff(work.path(), &store, t);
        } else {
            d.sighup();
        }
        handoffs.push(Handoff {
            kind,
            requested,
            answered: now_ms(),
        });
        std::thread::sleep(GAP);
    }
    assert_eq!(
        device_of(&d.show("ho"), t),
        dev,
        "the device changed across the hand-offs"
    );
    let out = fio
        .join()
        .expect("fio thread")
        .unwrap_or_else(|e| panic!("cannot run fio (is it installed?): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !stderr.contains("verify"),
        "fio failed across the hand-offs ({}):\n{stderr}\n{stdout}\n{}",
        out.status,
        d.log_text()
    );
    let metrics = http_get(&d.socket, "/metrics");
    let fio_json: Value = serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("fio json: {e}\n{stdout}"));
    let job = &fio_json["jobs"][0];
    assert_eq!(job["error"].as_i64(), Some(0), "fio: {job}");

    let log = completions(&PathBuf::from(format!(
        "{}_clat.1.log",
        lat_prefix.display()
    )));
    let first = log.iter().map(|c| c.at).min().unwrap_or(0);
    let mut rows = Vec::new();
    let mut stalls = Vec::new();
    for (i, h) in handoffs.iter().enumerate() {
        let (read, write, n) = stall_in(&log, h.requested, h.answered + 1000);
        let stall = read.max(write);
        println!(
            "hand-off {i:2} {:7} at {:6.1} s: successor answered after {:5} ms; stall read {read:4.0} ms, write {write:4.0} ms ({n} I/Os completed in the window)",
            h.kind,
            h.requested.saturating_sub(first) as f64 / 1e3,
            h.answered - h.requested
        );
        stalls.push(stall);
        rows.push(json!({
            "kind": h.kind,
            "at_s": h.requested.saturating_sub(first) as f64 / 1e3,
            "answered_ms": h.answered - h.requested,
            "stall_read_ms": read,
            "stall_write_ms": write,
        }));
    }
    let (worst_read, worst_write, _) = stall_in(&log, 0, u64::MAX);
    let by_kind = |kind: &str| {
        let mut v: Vec<f64> = handoffs
            .iter()
            .zip(&stalls)
            .filter(|(h, _)| h.kind == kind)
            .map(|(_, s)| *s)
            .collect();
        v.sort_by(f64::total_cmp);
        json!({"count": v.len(), "median": median(&v), "max": v.last().copied().unwrap_or(0.0)})
    };
    let kinds = json!({"handoff": by_kind("handoff"), "sighup": by_kind("sighup")});
    stalls.sort_by(f64::total_cmp);
    println!(
        "{label}: {} hand-offs, I/O stall median {:.0} ms, max {:.0} ms; glidefs handoff {}, SIGHUP {}",
        handoffs.len(),
        median(&stalls),
        stalls.last().copied().unwrap_or(0.0),
        kinds["handoff"],
        kinds["sighup"]
    );
    let summary = json!({
        "test": "handoff_stall",
        "transport": t.to_string(),
        "load": load.name(),
        "kernel": daemon::run("uname", &["-r"]).stdout.iter().map(|&b| b as char).collect::<String>().trim(),
        "handoffs": handoffs.len(),
        "stall_ms": {"median": median(&stalls), "max": stalls.last().copied().unwrap_or(0.0)},
        "stall_ms_by_kind": kinds,
        "largest_clat_ms": {"read": worst_read, "write": worst_write},
        "ios": {
            "writes": job["write"]["total_ios"],
            "reads": job["read"]["total_ios"],
        },
        "last_daemon": {
            "inline": metric(&metrics, "glidefs_volume_io_inline_total"),
            "deferred": metric(&metrics, "glidefs_volume_io_deferred_total"),
            "fua_writes": metric(&metrics, "glidefs_volume_fua_writes_total"),
        },
        "per_handoff": rows,
    });
    println!("{summary}");
    let dir = results_dir();
    let stem = format!("{t}-{}", load.name());
    let path = dir.join(format!("{stem}.json"));
    std::fs::write(&path, format!("{summary:#}\n"))
        .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    write_timeline(
        &dir.join(format!("{stem}-timeline.csv")),
        &log,
        first,
        &handoffs,
    );
    d.print_log_lines(&[
        "hand-off requested",
        "SIGHUP",
        "flusher stopped",
        "ublk device detached",
        "volume closed",
        "glidefs stopped",
        "re-executing",
        "glidefs starting",
        "volumes restored",
        "volume opened",
        "ublk device recovered",
        "previous daemon exited",
    ]);
    assert!(
        handoffs.len() >= MIN_HANDOFFS,
        "only {} hand-offs fitted in fio's {RUNTIME:?}: hand-offs got slower",
        handoffs.len(),
    );
    let worst = stalls.last().copied().unwrap_or(0.0);
    assert!(
        worst < WEDGE.as_secs_f64() * 1e3,
        "a hand-off stalled I/O {worst:.0} ms (>= {WEDGE:?}): a queue was wedged"
    );
    d.json(&["rm", "ho", "--purge"]);
    d.stop();
}

/// The largest completion latency per [`BUCKET_MS`] (seconds since fio's first completion),
/// and a column marking the buckets in which a hand-off was under way.
fn write_timeline(path: &Path, log: &[Completion], first: u64, handoffs: &[Handoff]) {
    let last = log.iter().map(|c| c.at).max().unwrap_or(first);
    let buckets = usize::try_from((last - first) / BUCKET_MS + 1).expect("bucket count");
    let mut worst = vec![0u64; buckets];
    for c in log {
        let b = usize::try_from((c.at - first) / BUCKET_MS).expect("bucket");
        worst[b] = worst[b].max(c.clat_ns);
    }
    let mut csv = String::from("t_s,max_clat_ms,handoff\n");
    for (b, w) in worst.iter().enumerate() {
        let at = first + b as u64 * BUCKET_MS;
        let during = handoffs
            .iter()
            .any(|h| (h.requested..=h.answered).contains(&at));
        csv.push_str(&format!(
            "{:.1},{:.1},{}\n",
            (b as u64 * BUCKET_MS) as f64 / 1e3,
            *w as f64 / 1e6,
            u8::from(during)
        ));
    }
    std::fs::write(path, csv).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}

#[test]
#[ignore = "needs a ublk-capable kernel: scripts/test runs it under scripts/ublk-vm"]
fn handoff_stall_zero_copy() {
    handoff_stall(Transport::ZeroCopy, Load::Plain);
}

#[test]
#[ignore = "needs a ublk-capable kernel: scripts/test runs it under scripts/ublk-vm"]
fn handoff_stall_user_copy() {
    handoff_stall(Transport::UserCopy, Load::Plain);
}

#[test]
#[ignore = "needs a ublk-capable kernel: scripts/test runs it under scripts/ublk-vm"]
fn handoff_stall_zero_copy_fua_deferred() {
    handoff_stall(Transport::ZeroCopy, Load::Fua);
}
