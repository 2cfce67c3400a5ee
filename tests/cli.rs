//! End-to-end: the real `glidefs` binary starts and answers `--version` and `--help`.

use std::process::Command;

const GLIDEFS: &str = env!("CARGO_BIN_EXE_glidefs");

#[test]
fn version_and_help() {
    let out = Command::new(GLIDEFS)
        .arg("--version")
        .output()
        .expect("run glidefs --version");
    assert!(out.status.success(), "glidefs --version failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        text.trim(),
        format!("glidefs {}", env!("CARGO_PKG_VERSION"))
    );

    let out = Command::new(GLIDEFS)
        .arg("--help")
        .output()
        .expect("run glidefs --help");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("features"));
}

#[test]
fn unknown_subcommand_is_a_usage_error() {
    let out = Command::new(GLIDEFS)
        .arg("no-such-command")
        .output()
        .expect("run glidefs");
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap usage errors exit 2: {out:?}"
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-command"));
}

/// `glidefs features --json` always prints a JSON report and exits 0; without ublk (this
/// machine, CI) it says `ublk_available: false` and why.
#[test]
fn features_json_is_a_report_even_without_ublk() {
    let out = Command::new(GLIDEFS)
        .args(["features", "--json"])
        .output()
        .expect("run glidefs features --json");
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("features --json is JSON");
    assert!(v["kernel"].is_string(), "{v}");
    let available = v["ublk_available"]
        .as_bool()
        .expect("ublk_available is a bool");
    if available {
        assert!(v["feature_bits"].is_string(), "{v}");
        assert!(
            v["zero_copy"].is_boolean() && v["user_copy"].is_boolean(),
            "{v}"
        );
    } else {
        assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
        assert!(v["transport"].is_null(), "{v}");
    }
    let out = Command::new(GLIDEFS)
        .args(["features"])
        .output()
        .expect("run glidefs features");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("kernel: "));
}

/// A `glidefs serve --no-devices` child, killed with SIGTERM on drop.
struct Serve {
    child: std::process::Child,
    socket: std::path::PathBuf,
}

impl Serve {
    fn start(dir: &std::path::Path) -> Self {
        Self::start_with_env(dir, &[])
    }

    /// [`Serve::start`] with extra environment variables.
    fn start_with_env(dir: &std::path::Path, env: &[(&str, &std::path::Path)]) -> Self {
        Self::spawn(dir, env, Command::new(GLIDEFS))
    }

    /// [`Serve::start`] under `prlimit --nofile=SOFT:HARD`, logging at `info` to `log`.
    fn start_with_fd_limit(
        dir: &std::path::Path,
        soft: u64,
        hard: u64,
        log: &std::path::Path,
    ) -> Self {
        let mut cmd = Command::new("prlimit");
        cmd.arg(format!("--nofile={soft}:{hard}"))
            .arg(GLIDEFS)
            .env("GLIDEFS_LOG", "info")
            .stderr(std::fs::File::create(log).expect("log file"));
        Self::spawn(dir, &[], cmd)
    }

    /// Writes the config, spawns `cmd serve --no-devices --config C`, waits for the socket.
    fn spawn(dir: &std::path::Path, env: &[(&str, &std::path::Path)], mut cmd: Command) -> Self {
        let socket = dir.join("api.sock");
        let config = dir.join("glidefs.toml");
        std::fs::write(
            &config,
            format!(
                "data_dir = \"{}\"\n[api]\nsocket = \"{}\"\n[volume_defaults]\nflush_interval_secs = 3600\n",
                dir.join("data").display(),
                socket.display()
            ),
        )
        .unwrap();
        if !cmd.get_envs().any(|(k, _)| k == "GLIDEFS_LOG") {
            cmd.env("GLIDEFS_LOG", "warn");
        }
        let child = cmd
            .args(["serve", "--no-devices", "--config"])
            .arg(&config)
            .envs(env.iter().copied())
            .spawn()
            .expect("spawn glidefs serve");
        let serve = Serve { child, socket };
        for _ in 0..200 {
            if std::os::unix::net::UnixStream::connect(&serve.socket).is_ok() {
                return serve;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        panic!("glidefs serve did not listen on {}", serve.socket.display());
    }

    fn volume(&self, args: &[&str]) -> std::process::Output {
        self.run("volume", args)
    }

    /// `glidefs GROUP ARGS --socket S`.
    fn run(&self, group: &str, args: &[&str]) -> std::process::Output {
        Command::new(GLIDEFS)
            .arg(group)
            .args(args)
            .arg("--socket")
            .arg(&self.socket)
            .output()
            .expect("run glidefs")
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        self.json_of("volume", args)
    }

    fn json_of(&self, group: &str, args: &[&str]) -> serde_json::Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.run(group, &a);
        assert!(out.status.success(), "glidefs {group} {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {out:?}"))
    }

    /// SIGTERM; the daemon must exit 0.
    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let st = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(st.success());
        let status = self.child.wait().unwrap();
        assert!(
            status.success(),
            "serve exit status after SIGTERM: {status:?}"
        );
        std::mem::forget(self);
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `serve` raises its soft descriptor limit to the hard one and logs both; when volumes would
/// leave too few free, a create fails with `too_many_open_files` naming the limit (not an
/// anonymous internal error) while removes still work (the reserve), and creates work again
/// after them.
#[test]
fn serve_raises_its_fd_limit_and_running_out_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("serve.log");
    let serve = Serve::start_with_fd_limit(dir.path(), 40, 256, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("file descriptor limit")
            && text.contains("soft_at_start=40")
            && text.contains("soft=256"),
        "the raise from 40 to 256 is not logged:\n{text}"
    );
    let mut created = Vec::new();
    let refused = loop {
        let name = format!("v{}", created.len());
        let out = serve.volume(&["create", &name, "--size", "4M"]);
        if !out.status.success() {
            break String::from_utf8_lossy(&out.stderr).into_owned();
        }
        created.push(name);
        assert!(created.len() < 256, "256 volumes fit in 256 descriptors?");
    };
    println!("{} volumes, then: {refused}", created.len());
    assert!(
        refused.contains("too_many_open_files")
            && refused.contains("RLIMIT_NOFILE of 256")
            && refused.contains("HTTP 503"),
        "{refused}"
    );
    assert!(!created.is_empty(), "not even one volume fitted: {refused}");
    // The daemon goes on: what it had still answers, and space made is usable again.
    for name in created.iter().take(2) {
        serve.json(&["rm", name]);
    }
    serve.json(&["create", "again", "--size", "4M"]);
    let listed = serve.json(&["list"]);
    assert_eq!(
        listed["volumes"].as_array().map(Vec::len),
        Some(created.len() - 1),
        "{listed}"
    );
    serve.terminate();
}

#[test]
fn volume_commands_drive_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(dir.path());

    let v = serve.json(&[
        "create",
        "cli-vol",
        "--size",
        "64M",
        "--block-size",
        "64K",
        "--queues",
        "2",
        "--depth",
        "16",
    ]);
    assert_eq!(v["name"], "cli-vol");
    assert_eq!(v["size"], 64 << 20);
    assert_eq!(
        (
            v["block_size"].clone(),
            v["queues"].clone(),
            v["queue_depth"].clone()
        ),
        (
            serde_json::json!(65536),
            serde_json::json!(2),
            serde_json::json!(16)
        )
    );
    assert!(v["device"]["path"].is_null(), "--no-devices: {v}");

    let l = serve.json(&["list"]);
    assert_eq!(l["volumes"][0]["name"], "cli-vol");
    let s = serve.json(&["show", "cli-vol"]);
    assert_eq!(s["state"], "running");
    let f = serve.json(&["flush", "cli-vol"]);
    assert_eq!(f["name"], "cli-vol");

    // Human output.
    let out = serve.volume(&["list"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("NAME") && text.contains("cli-vol") && text.contains("64M"),
        "{text}"
    );

    // Errors: non-zero exit, the code and message on stderr.
    let out = serve.volume(&["create", "cli-vol", "--size", "64M"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("duplicate") && err.contains("cli-vol"),
        "{err}"
    );
    let out = serve.volume(&["create", "x", "--size", "lots"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad size is a usage error: {out:?}"
    );
    let out = serve.volume(&["show", "nope"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("not_found"));

    let r = serve.json(&["rm", "cli-vol"]);
    assert_eq!(r["name"], "cli-vol");
    assert_eq!(serve.json(&["list"])["volumes"], serde_json::json!([]));
    serve.terminate();

    // Without a daemon the client says how it failed.
    let out = Command::new(GLIDEFS)
        .args(["volume", "list", "--socket"])
        .arg(dir.path().join("api.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot connect"),
        "{out:?}"
    );
}

#[test]
fn snapshot_commands_drive_a_running_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(dir.path());
    serve.json(&["create", "v", "--size", "16M", "--block-size", "64K"]);
    let s = serve.json_of("snapshot", &["create", "v", "s1"]);
    assert_eq!(
        (s["volume"].clone(), s["name"].clone()),
        ("v".into(), "s1".into())
    );
    let out = serve.run("snapshot", &["list", "v"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("GENERATION") && text.contains("s1"),
        "{text}"
    );
    let a = serve.json_of("snapshot", &["attach", "v@s1", "v-s1"]);
    assert_eq!(
        (a["read_only"].clone(), a["snapshot"].clone()),
        (true.into(), "v@s1".into())
    );
    let c = serve.json(&["create", "c", "--from", "v@s1"]);
    assert_eq!(c["size"], 16 << 20);
    let shown = serve.json_of("snapshot", &["show", "v", "s1"]);
    assert_eq!(shown["clones"], serde_json::json!(["c"]));
    assert_eq!(shown["attached"], serde_json::json!(["v-s1"]));
    let out = serve.run("snapshot", &["delete", "v", "s1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("snapshot_in_use") && err.contains("v-s1"),
        "{err}"
    );
    let out = serve.volume(&["create", "x", "--from", "v"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("invalid_snapshot"),
        "{out:?}"
    );
    let out = serve.volume(&["create", "x", "--from", "v@s1", "--attach-existing"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "--from with --attach-existing is a usage error"
    );
    serve.json(&["rm", "v-s1"]);
    serve.json(&["rm", "c", "--purge"]);
    let d = serve.json_of("snapshot", &["delete", "v", "s1"]);
    assert_eq!(d["name"], "s1");
    assert_eq!(
        serve.json_of("snapshot", &["list", "v"])["snapshots"],
        serde_json::json!([])
    );
    serve.terminate();
}

#[test]
fn serve_rejects_a_bad_config_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "[api]\nsockett = \"/tmp/x\"\n").unwrap();
    let out = Command::new(GLIDEFS)
        .args(["serve", "--no-devices", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sockett"),
        "{out:?}"
    );
}

#[test]
fn gc_dry_run_on_an_empty_store_reports_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("glidefs.toml");
    std::fs::write(
        &config,
        format!("data_dir = \"{}\"\n", dir.path().display()),
    )
    .unwrap();
    let out = Command::new(GLIDEFS)
        .args(["gc", "--dry-run", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc --json is JSON");
    assert_eq!(v, serde_json::json!([]));
}

/// `glidefs gc` over three volumes whose second has a damaged manifest: the other two are
/// still collected and reported, the damaged one is reported with its error, and the exit
/// status is non-zero.
#[test]
fn gc_goes_on_after_a_bad_volume_and_exits_non_zero() {
    use glidefs_objstore::{open_store, Manifest, StoreConfig, VolumeStore};

    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    std::fs::create_dir_all(&store_dir).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = open_store(
            &format!("file://{}", store_dir.display()),
            &Default::default(),
        )
        .unwrap();
        for name in ["a", "b", "c"] {
            let vs = VolumeStore::new(store.clone(), name, StoreConfig::default()).unwrap();
            vs.load_manifest().await.unwrap();
            let mut m = Manifest::new(name, 4096, 1 << 20).successor();
            vs.publish_manifest(&mut m).await.unwrap();
        }
    });
    std::fs::write(
        store_dir.join("volumes/b/manifest/00000000000000000001"),
        b"not a manifest",
    )
    .unwrap();
    let config = dir.path().join("glidefs.toml");
    std::fs::write(
        &config,
        format!("data_dir = \"{}\"\n", dir.path().display()),
    )
    .unwrap();

    let out = Command::new(GLIDEFS)
        .args(["gc", "--json", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a failed volume must fail gc: {out:?}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("gc --json is JSON");
    let entries = v.as_array().expect("one entry per volume");
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["volume"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"], "{v}");
    assert!(entries[0].get("error").is_none(), "{v}");
    assert!(entries[2].get("error").is_none(), "{v}");
    assert_eq!(
        entries[2]["manifests_retained"],
        serde_json::json!([1]),
        "{v}"
    );
    let error = entries[1]["error"].as_str().expect("b's error");
    assert!(error.contains("`b`"), "{error}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("gc failed for 1 of 3 volumes: b"),
        "{stderr}"
    );

    // The text output says the same.
    let out = Command::new(GLIDEFS)
        .args(["gc", "--dry-run", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("b: gc failed:"), "{text}");
    assert!(
        text.contains("a: 0 manifests deleted") && text.contains("c: 0 manifests deleted"),
        "{text}"
    );
}

/// CLOCK_MONOTONIC in microseconds, the clock of systemd's `MONOTONIC_USEC`.
fn monotonic_usec() -> i128 {
    match sd_notify::NotifyState::monotonic_usec_now().expect("CLOCK_MONOTONIC") {
        sd_notify::NotifyState::MonotonicUsec(usec) => usec,
        other => panic!("not a monotonic time: {other}"),
    }
}

/// systemd 253+ refuses `RELOADING=1` without `MONOTONIC_USEC` (the reload fails); systemd
/// here may be older, so the test plays the service manager: `NOTIFY_SOCKET` is a datagram
/// socket of its own. Start: `READY=1`. SIGHUP: `RELOADING=1` with `MONOTONIC_USEC` = the
/// CLOCK_MONOTONIC time of the reload (between SIGHUP and the message), then `READY=1` from
/// the re-executed daemon.
#[test]
fn sighup_tells_systemd_reloading_with_the_monotonic_time_then_ready() {
    let dir = tempfile::tempdir().unwrap();
    let notify_path = dir.path().join("notify.sock");
    let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
    // A hang guard only: the daemon sends each message well within it.
    notify
        .set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .unwrap();
    let recv = || {
        let mut buf = [0u8; 4096];
        let n = notify.recv(&mut buf).expect("a notify message");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    let serve = Serve::start_with_env(dir.path(), &[("NOTIFY_SOCKET", &notify_path)]);
    assert_eq!(recv().lines().collect::<Vec<_>>(), ["READY=1"]);

    let before = monotonic_usec();
    let pid = serve.child.id().to_string();
    let st = Command::new("kill").args(["-HUP", &pid]).status().unwrap();
    assert!(st.success());
    let reloading = recv();
    let after = monotonic_usec();
    let lines: Vec<&str> = reloading.lines().collect();
    assert!(lines.contains(&"RELOADING=1"), "{reloading:?}");
    let usec: i128 = lines
        .iter()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .unwrap_or_else(|| panic!("no MONOTONIC_USEC with RELOADING=1: {reloading:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("MONOTONIC_USEC is not a number ({e}): {reloading:?}"));
    assert!(
        (before..=after).contains(&usec),
        "MONOTONIC_USEC={usec} is not the time of the reload ({before}..={after})"
    );
    assert_eq!(
        recv().lines().collect::<Vec<_>>(),
        ["READY=1"],
        "the re-executed daemon is ready"
    );
    // Still the same daemon (same pid), answering.
    assert_eq!(serve.json(&["list"])["volumes"], serde_json::json!([]));
    serve.terminate();
}

#[test]
fn volume_resize_grows_and_refuses_to_shrink() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(dir.path());
    serve.json(&["create", "cli-r", "--size", "64M", "--block-size", "64K"]);
    let r = serve.json(&["resize", "cli-r", "128M"]);
    assert_eq!(
        (
            r["name"].clone(),
            r["previous_size"].clone(),
            r["size"].clone()
        ),
        (
            serde_json::json!("cli-r"),
            serde_json::json!(64 << 20),
            serde_json::json!(128 << 20)
        )
    );
    assert!(r["device"].is_null(), "--no-devices: {r}");
    assert_eq!(serve.json(&["show", "cli-r"])["size"], 128 << 20);
    let out = serve.volume(&["resize", "cli-r", "256M"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("resized cli-r") && text.contains("256M"),
        "{text}"
    );
    // Shrinking: the API's error with both sizes, non-zero exit.
    let out = serve.volume(&["resize", "cli-r", "64M"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("invalid_size") && err.contains("268435456") && err.contains("67108864"),
        "{err}"
    );
    // Usage errors: a size that does not parse, a missing size.
    for args in [&["resize", "cli-r", "lots"][..], &["resize", "cli-r"][..]] {
        let out = serve.volume(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
    }
    assert_eq!(serve.json(&["show", "cli-r"])["size"], 256 << 20);
    serve.terminate();
}

#[test]
fn create_with_an_encryption_key_file_sends_an_absolute_path() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(dir.path());
    let key = dir.path().join("vol.key");
    std::fs::write(
        &key,
        "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff\n",
    )
    .unwrap();
    // A key file open to others is refused.
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    // A relative path, resolved by the CLI against its own working directory.
    let json_in_dir = |group: &str, args: &[&str]| -> serde_json::Value {
        let out = Command::new(GLIDEFS)
            .current_dir(dir.path())
            .args([group, "--json", "--socket"])
            .arg(&serve.socket)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "{group} {args:?}: {out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    let v = json_in_dir(
        "volume",
        &[
            "create",
            "enc",
            "--size",
            "8M",
            "--encryption-key-file",
            "vol.key",
        ],
    );
    assert_eq!(
        v["encryption_key_id"].as_str().map(str::len),
        Some(16),
        "{v}"
    );
    let out = serve.volume(&[
        "create",
        "x",
        "--size",
        "8M",
        "--encryption-key-file",
        "/k",
        "--encryption-key-env",
        "GLIDEFS_KEY_X",
    ]);
    assert_eq!(out.status.code(), Some(2), "both sources: usage error");

    // (Issue 45.) `snapshot attach` takes the key too: an encrypted volume's snapshot
    // attaches without `volume create --from --read-only`.
    let out = serve.run("snapshot", &["create", "enc", "s1"]);
    assert!(out.status.success(), "{out:?}");
    let out = serve.run("snapshot", &["attach", "enc@s1", "enc-s1"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("key_mismatch"),
        "no key: {out:?}"
    );
    let a = json_in_dir(
        "snapshot",
        &[
            "attach",
            "enc@s1",
            "enc-s1",
            "--encryption-key-file",
            "vol.key",
        ],
    );
    assert_eq!(
        (a["read_only"].clone(), a["snapshot"].clone()),
        (true.into(), "enc@s1".into()),
        "{a}"
    );
    assert_eq!(a["encryption_key_id"], v["encryption_key_id"], "{a}");
    let out = serve.run(
        "snapshot",
        &[
            "attach",
            "enc@s1",
            "y",
            "--encryption-key-file",
            "/k",
            "--encryption-key-env",
            "GLIDEFS_KEY_X",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "both sources: usage error");
    serve.terminate();
}

/// (Issue 45.) Output to a reader that went away (`glidefs volume list | head -0`: EPIPE):
/// the command stops writing quietly and keeps its own exit status; `println!` panicked
/// (exit 101).
#[test]
fn a_closed_stdout_pipe_ends_the_output_quietly() {
    let dir = tempfile::tempdir().unwrap();
    let serve = Serve::start(dir.path());
    let out = serve.volume(&["create", "v", "--size", "8M"]);
    assert!(out.status.success(), "{out:?}");
    let out = serve.run("snapshot", &["create", "v", "s1"]);
    assert!(out.status.success(), "{out:?}");
    let socket = serve.socket.to_str().unwrap();
    for args in [
        &["features"][..],
        &["volume", "list", "--socket", socket],
        &["volume", "show", "v", "--json", "--socket", socket],
        &["snapshot", "list", "v", "--socket", socket],
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(GLIDEFS)
            .args(args)
            .stdout(writer)
            .output()
            .expect("run glidefs");
        assert_eq!(out.status.code(), Some(0), "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
    serve.terminate();
}

/// Waits up to 60 s for `child` to exit by itself; kills it and fails when it does not.
fn exit_within_a_minute(mut child: std::process::Child, what: &str) -> std::process::Output {
    let start = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} still ran after 60 s: {out:?}");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// (Issue 45, item 8.) One daemon per data directory: a second `glidefs serve` on the data
/// directory of a running one (with a socket of its own) exits non-zero at once, naming the
/// directory and the running daemon's pid, and binds nothing; the first still answers with its
/// volume. `glidefs handoff` on the same config is not refused: the lock passes to it when the
/// first exits (0), and it serves the volume.
#[test]
fn a_second_serve_on_a_data_dir_in_use_is_refused_and_handoff_takes_it_over() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = Serve::start(dir.path());
    let out = first.volume(&["create", "v", "--size", "8M"]);
    assert!(out.status.success(), "{out:?}");

    let config = dir.path().join("glidefs.toml");
    let second_socket = dir.path().join("second.sock");
    let second_config = dir.path().join("second.toml");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        &first.socket.display().to_string(),
        &second_socket.display().to_string(),
    );
    std::fs::write(&second_config, text).unwrap();
    let second = Command::new(GLIDEFS)
        .args(["serve", "--no-devices", "--config"])
        .arg(&second_config)
        .env("GLIDEFS_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = exit_within_a_minute(second, "a second serve on the same data_dir");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    for needle in [
        dir.path().join("data").display().to_string(),
        format!("pid {}", first.child.id()),
    ] {
        assert!(stderr.contains(&needle), "`{needle}` missing: {stderr}");
    }
    assert!(!second_socket.exists(), "the second serve bound its socket");
    let list = first.json(&["list"]);
    assert_eq!(list["volumes"][0]["name"], "v", "{list}");

    let successor = Command::new(GLIDEFS)
        .args(["handoff", "--no-devices", "--config"])
        .arg(&config)
        .env("GLIDEFS_LOG", "warn")
        .spawn()
        .unwrap();
    let status = first.child.wait().unwrap();
    assert!(
        status.success(),
        "the first daemon after the hand-off: {status:?}"
    );
    std::mem::forget(first);
    let successor = Serve {
        child: successor,
        socket: dir.path().join("api.sock"),
    };
    let start = std::time::Instant::now();
    while std::os::unix::net::UnixStream::connect(&successor.socket).is_err() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "glidefs handoff did not listen"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let list = successor.json(&["list"]);
    assert_eq!(list["volumes"][0]["name"], "v", "{list}");
    successor.terminate();
}
