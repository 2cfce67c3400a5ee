//! Kernel test: a short soak. `scripts/fio-soak --inside` runs two glidefs volumes on the
//! test kit's S3 server (a process of its own, over HTTP) under fio with crc32c verification
//! for [`DURATION`] seconds while flushes, evictions, cold reads and `glidefs gc` run, and
//! checks its budgets (RSS growth, fd count, zero verify errors, every fio job ran the whole
//! time). This test then checks the summary it wrote and prints it.
//!
//! Sized for the debug build under QEMU emulation, which uploads a few hundred KB/s: small
//! volumes (32 MiB), a 1 MiB flush threshold and disk budget (so written blocks are evicted
//! and read back from the store), and [`SOAK_ARGS`]' low fio rates. Faster, the flusher falls
//! behind and its packs grow until their uploads outlast the store client's 30 s timeout.
//!
//! The binaries must be built already (the script never runs cargo): the daemon is
//! `$GLIDEFS_BIN` or the one cargo built with this test, the S3 server
//! `$GLIDEFS_S3_SERVER_BIN` or `glidefs-s3-server` next to the daemon (cargo builds it with the
//! test kit's tests: `cargo test --workspace --no-run`, as `scripts/test` does). Outputs (CSV,
//! summary.json, PNG, logs) go to `$GLIDEFS_SOAK_OUT`, default
//! `target/kernel-test-results/ublk_soak/` (shared with the host by `scripts/test`).
//!
//! Needs /dev/ublk-control, fio, gnuplot and python3: `scripts/test` runs it under
//! `scripts/ublk-vm`. The long soaks are `scripts/fio-soak --devices N --duration SECS`.

mod support;

use support::daemon;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use serde_json::Value;

/// fio run time of the short soak, seconds (75 until 2026-12-07, cut to keep `scripts/test`
/// inside CI's 45 minutes once the CSI kernel test joined; the long soaks are `scripts/fio-soak`).
const DURATION: u64 = 45;
/// Devices of the short soak.
const DEVICES: u64 = 2;
/// The rest of its configuration (see the module docs).
const SOAK_ARGS: &[&str] = &[
    "--size",
    "32M",
    "--disk-budget",
    "1M",
    "--flush-threshold",
    "1M",
    "--write-rate",
    "128K",
    "--read-rate",
    "256K",
    "--sample",
    "5",
];

fn s3_server_bin() -> PathBuf {
    if let Ok(p) = std::env::var("GLIDEFS_S3_SERVER_BIN") {
        return PathBuf::from(p);
    }
    // Next to the binary cargo built (`$GLIDEFS_BIN` may be a copy elsewhere).
    let glidefs = PathBuf::from(env!("CARGO_BIN_EXE_glidefs"));
    let bin = glidefs
        .parent()
        .expect("the glidefs binary's directory")
        .join("glidefs-s3-server");
    assert!(
        bin.exists(),
        "{} missing: build it (cargo build -p glidefs-testkit --bins, or cargo test --workspace \
         --no-run) or set GLIDEFS_S3_SERVER_BIN",
        bin.display()
    );
    bin
}

fn u64_at(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{ptr} missing in summary.json: {v:#}"))
}

#[test]
#[ignore = "needs a ublk-capable kernel: scripts/test runs it under scripts/ublk-vm"]
fn fio_soak_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let out = std::env::var("GLIDEFS_SOAK_OUT").map_or_else(
        |_| root.join("target/kernel-test-results/ublk_soak"),
        PathBuf::from,
    );
    let glidefs = daemon::glidefs();
    let s3 = s3_server_bin();
    println!(
        "short soak: {DEVICES} devices, {DURATION}s, glidefs {glidefs}, S3 server {}, outputs in {}",
        s3.display(),
        out.display()
    );
    let start = Instant::now();
    let status = Command::new(root.join("scripts/fio-soak"))
        .args(["--inside", "--devices", &DEVICES.to_string()])
        .args(["--duration", &DURATION.to_string()])
        .args(SOAK_ARGS)
        .arg("--out")
        .arg(&out)
        .env("GLIDEFS_BIN", &glidefs)
        .env("GLIDEFS_S3_SERVER_BIN", &s3)
        .current_dir(root)
        .status()
        .expect("run scripts/fio-soak");
    println!("scripts/fio-soak: {status} after {:?}", start.elapsed());

    let text = std::fs::read_to_string(out.join("summary.json"))
        .unwrap_or_else(|e| panic!("{}/summary.json: {e} (soak exit {status})", out.display()));
    let s: Value = serde_json::from_str(&text).expect("summary.json is JSON");
    println!("summary.json:\n{s:#}");

    assert_eq!(
        s["failures"],
        serde_json::json!([]),
        "the soak failed its checks"
    );
    assert!(status.success(), "scripts/fio-soak exited {status}");
    assert_eq!(u64_at(&s, "/fio/verify_errors"), 0, "fio verify errors");
    assert!(u64_at(&s, "/fio/bytes_verified") > 0, "no bytes verified");
    for d in 0..DEVICES {
        let dev = format!("/fio/per_device/soak{d}");
        assert!(u64_at(&s, &format!("{dev}/bytes_verified")) > 0, "{dev}");
        for job in ["writer", "reader"] {
            let ms = u64_at(&s, &format!("{dev}/jobs/{job}/runtime_ms"));
            assert!(ms + 2000 >= DURATION * 1000, "{dev} {job} ran {ms} ms");
        }
    }
    assert!(u64_at(&s, "/cold_reads") > 0, "no cold read");
    assert!(u64_at(&s, "/flushes") > 0, "no flush");
    assert_eq!(u64_at(&s, "/flush_errors"), 0, "flush errors");
    let budget = u64_at(&s, "/budgets/rss_growth_kib");
    let rss_start = u64_at(&s, "/rss_kib/start");
    assert!(u64_at(&s, "/rss_kib/end").saturating_sub(rss_start) <= budget);
    assert!(u64_at(&s, "/rss_kib/max").saturating_sub(rss_start) <= budget);
    assert!(
        u64_at(&s, "/fds/end") <= u64_at(&s, "/fds/start") + u64_at(&s, "/budgets/fd_slack"),
        "fd budget"
    );
    println!(
        "short soak passed in {:?}: RSS {} -> {} KiB (max {}), fds {} -> {}, {} bytes verified, \
         {} flushes, {} cold reads",
        start.elapsed(),
        rss_start,
        u64_at(&s, "/rss_kib/end"),
        u64_at(&s, "/rss_kib/max"),
        u64_at(&s, "/fds/start"),
        u64_at(&s, "/fds/end"),
        u64_at(&s, "/fio/bytes_verified"),
        u64_at(&s, "/flushes"),
        u64_at(&s, "/cold_reads"),
    );
}
