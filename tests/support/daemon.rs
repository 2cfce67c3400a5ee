//! Shared by the daemon kernel tests: the `glidefs serve` child process driven through its
//! CLI, the object store it uses (a local directory or the in-process S3 server), mounts, and
//! small command helpers. Every helper fails the test with the output that explains why.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use glidefs_testkit::S3Server;
use serde_json::Value;
use ublk_core::Transport;

/// The binary under test: `$GLIDEFS_BIN` when set (a copy taken before a rebuild), else
/// the one cargo built with this test.
pub fn glidefs() -> String {
    std::env::var("GLIDEFS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_glidefs").to_string())
}
/// How long the daemon may take to listen, or to exit after SIGTERM.
pub const DAEMON_LIMIT: Duration = Duration::from_secs(90);
/// How long one CLI call may take: a daemon that stops answering (a restore that never
/// ends leaves clients waiting in the listen backlog) fails the test with its log, not a
/// hang that only the VM's timeout ends.
pub const CLI_LIMIT: Duration = Duration::from_secs(240);

/// The kernel log's last 40 lines (I/O errors, file system messages, hung tasks), for a
/// failed test.
pub fn kernel_log_tail() -> String {
    match Command::new("dmesg").output() {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(40)..].join("\n")
        }
        Err(e) => format!("(dmesg: {e})"),
    }
}

/// Each thread of process `pid`: its name, what it waits in (`wchan`) and its kernel stack
/// (root only), for a test that fails because the daemon stopped answering.
pub fn thread_stacks(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("(process {pid} is gone)\n");
    };
    let mut out = String::new();
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap_or_default();
        out.push_str(&format!(
            "thread {} {} wchan={}\n{}",
            task.file_name().to_string_lossy(),
            read("comm").trim(),
            read("wchan"),
            read("stack")
        ));
    }
    out
}

/// Runs `cmd` to completion, its stdout and stderr captured; `Err` (after killing it) when it
/// runs longer than `limit`.
pub fn output_within(cmd: &mut Command, limit: Duration) -> std::io::Result<Output> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = libc::pid_t::try_from(child.id()).map_err(std::io::Error::other)?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out,
        Err(_) => {
            // SAFETY: signalling our own child, which the waiting thread has not sent output
            // for; were it reaped in the instant since, the pid names nothing (or, rarely, a
            // process that reused it: acceptable in a test that is failing anyway).
            unsafe { libc::kill(pid, libc::SIGKILL) };
            let _ = rx.recv();
            Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{cmd:?} still running after {limit:?} (killed)"),
            ))
        }
    }
}

/// Runs a command (stdin closed); fails the test with its output unless it exits 0 within
/// [`CLI_LIMIT`]. One stuck on a wedged device (`sync`, `mkfs`, `e2fsck`, `mount`) is
/// killed and fails the test with the kernel log's tail, instead of a hang that only the
/// VM's timeout ends.
pub fn run(cmd: &str, args: &[&str]) -> Output {
    let out = output_or_fail(
        Command::new(cmd).args(args),
        CLI_LIMIT,
        &format!("{cmd} {args:?}"),
    );
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Runs a shell one-liner (stdin closed) and returns its output whatever its status (the
/// caller checks it, or ignores it for best-effort cleanup); bounded like [`run`].
pub fn sh(script: &str) -> Output {
    output_or_fail(Command::new("sh").args(["-c", script]), CLI_LIMIT, script)
}

/// `cmd`'s output once it exits, within `limit`; fails the test (after killing it) with the
/// kernel log's tail when it runs longer.
fn output_or_fail(cmd: &mut Command, limit: Duration, what: &str) -> Output {
    output_within(cmd, limit).unwrap_or_else(|e| {
        if e.kind() == std::io::ErrorKind::TimedOut {
            panic!("{what}: {e}\nkernel log (tail):\n{}", kernel_log_tail());
        }
        panic!("cannot run {what} (is it installed?): {e}")
    })
}

/// Where the daemon keeps volumes durably.
pub enum Store {
    /// The embedded default: a local directory.
    Local(PathBuf),
    /// The in-process S3 server (and the runtime it runs on).
    S3 {
        server: Box<S3Server>,
        rt: tokio::runtime::Runtime,
    },
}

impl Store {
    pub fn local(work: &Path) -> Store {
        Store::Local(work.join("store"))
    }

    pub fn s3() -> Store {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime for the S3 server");
        let server = rt
            .block_on(S3Server::start_with_bucket("glidefs-demo"))
            .expect("start the S3 server");
        println!("S3 server at {} (bucket glidefs-demo)", server.endpoint);
        Store::S3 {
            server: Box::new(server),
            rt,
        }
    }

    pub fn url(&self) -> String {
        match self {
            Store::Local(dir) => format!("file://{}", dir.display()),
            Store::S3 { server, .. } => format!("s3://{}", server.bucket),
        }
    }

    /// Environment the daemon needs to reach the store.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        match self {
            Store::Local(_) => Vec::new(),
            Store::S3 { server, .. } => vec![
                ("GLIDEFS_S3_ENDPOINT", server.endpoint.clone()),
                ("AWS_ACCESS_KEY_ID", server.access_key.clone()),
                ("AWS_SECRET_ACCESS_KEY", server.secret.clone()),
                ("AWS_REGION", server.region.clone()),
            ],
        }
    }

    /// Objects stored under `volumes/<volume>/`, read through the store's own protocol.
    pub fn objects(&self, volume: &str) -> usize {
        let prefix = format!("volumes/{volume}/");
        match self {
            Store::Local(dir) => walk(&dir.join(&prefix)),
            Store::S3 { server, rt } => {
                use futures::TryStreamExt;
                let store = server.object_store().expect("S3 client");
                let p = object_store::path::Path::from(prefix.as_str());
                rt.block_on(store.list(Some(&p)).try_collect::<Vec<_>>())
                    .expect("list the bucket over S3")
                    .len()
            }
        }
    }
}

/// Files below `dir` (0 when it does not exist).
pub fn walk(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            if e.path().is_dir() {
                walk(&e.path())
            } else {
                1
            }
        })
        .sum()
}

/// A running `glidefs serve`; SIGTERM (then SIGKILL) on drop.
pub struct Daemon {
    child: Option<Child>,
    pub socket: PathBuf,
    log: PathBuf,
}

impl Daemon {
    /// Writes a config under `work` and starts the daemon on it.
    pub fn start(work: &Path, store: &Store, t: Transport) -> Daemon {
        Self::spawn(work, store, t, "serve")
    }

    /// The daemon's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// `glidefs handoff`: a new daemon that takes the devices over from this one, which must
    /// exit 0. Returns the new one, answering. I/O on the devices is held meanwhile.
    pub fn handoff(mut self, work: &Path, store: &Store, t: Transport) -> Daemon {
        let mut old = self.child.take().expect("daemon running");
        // The successor runs on the predecessor's config (`work/glidefs.toml`).
        let config = std::fs::read_to_string(work.join("glidefs.toml")).expect("read the config");
        let mut new = Self::launch(work, &config, store, t, "handoff");
        // Reap the old one as soon as it exits (the new one waits for its pid to go away).
        let status = old.wait().expect("reap the old daemon");
        assert!(
            status.success(),
            "the old daemon after the hand-off: {status}\n{}",
            new.log_text()
        );
        new.await_ready("glidefs handoff");
        new
    }

    /// SIGHUP: the daemon hands its devices off to a re-executed self (same pid). Returns
    /// once it answers again.
    pub fn sighup(&mut self) {
        let pid = libc::pid_t::try_from(self.child.as_ref().expect("running").id()).expect("pid");
        // SAFETY: signalling our own child, which has not been reaped.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0, "SIGHUP");
        // The old image removes the socket when it is done; the new one binds it again.
        let start = Instant::now();
        while self.socket.exists() && start.elapsed() < DAEMON_LIMIT {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.await_ready("glidefs (re-executed after SIGHUP)");
    }

    fn await_ready(&mut self, what: &str) {
        let start = Instant::now();
        loop {
            // Connecting is cheap; spawning the CLI (a debug binary, under emulation) is
            // not, and polling with it steals the CPU the starting daemon needs.
            let listening = std::os::unix::net::UnixStream::connect(&self.socket).is_ok();
            if listening && self.cli(&["list", "--json"]).status.success() {
                println!("{what} up in {:?}", start.elapsed());
                return;
            }
            if let Some(st) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "{what} exited ({st}) before listening:\n{}",
                    self.log_text()
                );
            }
            assert!(
                start.elapsed() < DAEMON_LIMIT,
                "{what} did not answer within {DAEMON_LIMIT:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `glidefs serve` (the usual config) with extra environment variables (fault hooks).
    pub fn start_with_env(
        work: &Path,
        store: &Store,
        t: Transport,
        env: &[(&str, &str)],
    ) -> Daemon {
        let config = default_config(work, store);
        let mut d = Self::launch_with(work, &config, store, t, "serve", env);
        d.await_ready("glidefs serve (with fault hooks)");
        d
    }

    /// `glidefs serve --no-devices` on the usual config: volumes without block devices (the
    /// CSI controller's own daemon).
    pub fn start_no_devices(work: &Path, store: &Store) -> Daemon {
        let config = default_config(work, store);
        let mut d = Self::launch_with(
            work,
            &config,
            store,
            Transport::UserCopy,
            "serve --no-devices",
            &[],
        );
        d.await_ready("glidefs serve --no-devices");
        d
    }

    /// Waits until the daemon exits by itself (within `limit`); returns its status.
    pub fn wait_for_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let child = self.child.as_mut().expect("daemon running");
        let start = Instant::now();
        loop {
            if let Some(status) = child.try_wait().expect("poll the daemon") {
                self.child = None;
                return status;
            }
            assert!(
                start.elapsed() < limit,
                "the daemon did not exit within {limit:?}:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn spawn(work: &Path, store: &Store, t: Transport, subcommand: &str) -> Daemon {
        let mut d = Self::spawn_child(work, store, t, subcommand);
        d.await_ready(&format!("glidefs {subcommand}"));
        d
    }

    /// `glidefs serve` on `config` (the whole TOML text, written to `work/glidefs.toml`;
    /// its API socket must be `work/api.sock`; the log goes to `work/serve.log`).
    pub fn start_with_config(work: &Path, config: &str, store: &Store, t: Transport) -> Daemon {
        let mut d = Self::launch(work, config, store, t, "serve");
        d.await_ready("glidefs serve");
        d
    }

    fn spawn_child(work: &Path, store: &Store, t: Transport, subcommand: &str) -> Daemon {
        Self::launch(work, &default_config(work, store), store, t, subcommand)
    }

    fn launch(work: &Path, text: &str, store: &Store, t: Transport, subcommand: &str) -> Daemon {
        Self::launch_with(work, text, store, t, subcommand, &[])
    }

    fn launch_with(
        work: &Path,
        text: &str,
        store: &Store,
        t: Transport,
        subcommand: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        std::fs::create_dir_all(work).expect("the daemon's work directory");
        let socket = work.join("api.sock");
        let config = work.join("glidefs.toml");
        let log = work.join("serve.log");
        std::fs::write(&config, text).expect("write the config");
        let logfile = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("daemon log");
        let mut cmd = Command::new(glidefs());
        cmd.args(subcommand.split(' '))
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::from(logfile.try_clone().expect("log fd")))
            .stderr(Stdio::from(logfile))
            .env_remove("GLIDEFS_FORCE_USER_COPY");
        if t == Transport::UserCopy {
            cmd.env("GLIDEFS_FORCE_USER_COPY", "1");
        }
        for (k, v) in store.env() {
            cmd.env(k, v);
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        PREEXISTING_DEVICES.get_or_init(ublk_core::ctrl::list_device_ids);
        let child = cmd.spawn().expect("spawn glidefs serve");
        if let Ok(pid) = i32::try_from(child.id()) {
            DAEMON_PIDS
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(pid);
        }
        Daemon {
            child: Some(child),
            socket,
            log,
        }
    }

    /// Prints the daemon log lines (all daemons of this work dir) that contain any of `keys`.
    pub fn print_log_lines(&self, keys: &[&str]) {
        for line in self.log_text().lines() {
            if keys.iter().any(|k| line.contains(k)) {
                println!("daemon log: {line}");
            }
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `glidefs volume ARGS --socket S`.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.command("volume", args)
    }

    /// `glidefs GROUP ARGS --socket S` (GROUP: `volume`, `snapshot`).
    /// Fails the test with the daemon's log if the call takes longer than [`CLI_LIMIT`].
    pub fn command(&self, group: &str, args: &[&str]) -> Output {
        let mut cmd = Command::new(glidefs());
        cmd.arg(group).args(args).arg("--socket").arg(&self.socket);
        output_within(&mut cmd, CLI_LIMIT).unwrap_or_else(|e| {
            panic!(
                "glidefs {group} {args:?}: {e}\ndaemon log:\n{}\nwhere the daemon's threads wait:\n{}\nkernel log:\n{}",
                self.log_text(),
                self.child.as_ref().map_or_else(String::new, |c| thread_stacks(c.id())),
                kernel_log_tail()
            )
        })
    }

    /// `glidefs volume ARGS --json`, which must succeed.
    pub fn json(&self, args: &[&str]) -> Value {
        self.json_of("volume", args)
    }

    /// `glidefs snapshot ARGS --json`, which must succeed.
    pub fn snapshot(&self, args: &[&str]) -> Value {
        self.json_of("snapshot", args)
    }

    /// `glidefs GROUP ARGS --json`, which must succeed.
    pub fn json_of(&self, group: &str, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        let out = self.command(group, &a);
        assert!(
            out.status.success(),
            "glidefs {group} {args:?} failed: {}{}\ndaemon log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log_text()
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("glidefs {group} {args:?}: not JSON ({e}): {out:?}"))
    }

    pub fn show(&self, name: &str) -> Value {
        self.json(&["show", name])
    }

    /// SIGKILL (a crash): no shutdown code runs. Returns once the process is reaped.
    pub fn kill9(mut self) {
        let mut child = self.child.take().expect("daemon running");
        child.kill().expect("SIGKILL the daemon");
        let status = child.wait().expect("reap the daemon");
        println!("daemon killed ({status})");
    }

    /// SIGTERM; the daemon must exit 0 within [`DAEMON_LIMIT`].
    pub fn stop(mut self) {
        let mut child = self.child.take().expect("daemon running");
        let status = terminate(&mut child);
        assert!(
            status.is_some_and(|s| s.success()),
            "glidefs serve after SIGTERM: {status:?}\n{}",
            self.log_text()
        );
        println!("daemon stopped cleanly (SIGTERM, exit 0)");
        for line in self.log_text().lines() {
            if line.contains("WARN") || line.contains("ERROR") {
                println!("daemon log: {line}");
            }
        }
    }
}

/// The kernel tests' usual config: data and socket under `work`, small blocks, 2 queues of
/// 32, flushes to the store after 1 MiB or 1 s.
pub fn default_config(work: &Path, store: &Store) -> String {
    format!(
        "data_dir = \"{}\"\n\
             [store]\nurl = \"{}\"\n\
             [api]\nsocket = \"{}\"\n\
             [volume_defaults]\nblock_size = \"64K\"\nqueues = 2\nqueue_depth = 32\n\
             max_io_bytes = \"512K\"\nflush_threshold_bytes = \"1M\"\nflush_interval_secs = 1\n\
             [log]\nfilter = \"info\"\n",
        work.join("data").display(),
        store.url(),
        work.join("api.sock").display()
    )
}

/// A config with its data dir at `data_dir` (a file system the test set up) and the socket
/// under `work`: one queue of 32 (every request through one loop thread), 64 KiB blocks, and
/// no flush to the store unless asked for.
pub fn one_queue_config(data_dir: &Path, work: &Path, store: &Store) -> String {
    format!(
        "data_dir = \"{}\"\n[store]\nurl = \"{}\"\n[api]\nsocket = \"{}\"\n\
         [volume_defaults]\nblock_size = \"64K\"\nqueues = 1\nqueue_depth = 32\n\
         flush_threshold_bytes = \"1G\"\nflush_interval_secs = 1000000\n[log]\nfilter = \"info\"\n",
        data_dir.display(),
        store.url(),
        work.join("api.sock").display()
    )
}

/// SIGTERM, wait up to [`DAEMON_LIMIT`], then SIGKILL. The exit status when it exited in time.
pub fn terminate(child: &mut Child) -> Option<std::process::ExitStatus> {
    let pid = libc::pid_t::try_from(child.id()).expect("pid");
    // SAFETY: signalling our own child, which has not been reaped yet.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let start = Instant::now();
    while start.elapsed() < DAEMON_LIMIT {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            terminate(&mut c);
            eprintln!("daemon log:\n{}", self.log_text());
        }
        if std::thread::panicking() {
            delete_devices_left_behind();
        }
    }
}

/// How long [`delete_devices_left_behind`] waits for one device's STOP_DEV and DEL_DEV.
const DELETE_LIMIT: Duration = Duration::from_secs(30);

/// Every daemon this test process started.
static DAEMON_PIDS: std::sync::Mutex<Vec<i32>> = std::sync::Mutex::new(Vec::new());

/// The ublk devices that existed before this test process started its first daemon: never
/// deleted here.
static PREEXISTING_DEVICES: std::sync::OnceLock<Vec<u32>> = std::sync::OnceLock::new();

/// After a failed test: deletes the ublk devices this test process's daemons left behind,
/// never anyone else's: a device counts as ours when it appeared after our first daemon
/// started and is served by one of our daemons or by nobody (the kernel reports a dead
/// server's pid as -1). A daemon that died (or was killed) leaves its devices QUIESCED,
/// holding the I/O of the test's own threads (a writer blocked in `write` sleeps
/// uninterruptibly); such a thread keeps the test binary from ever exiting, and the whole
/// kernel-test run would wait for it until its time limit. Deleting the device fails the held
/// I/O, so the thread returns.
pub fn delete_devices_left_behind() {
    let ours = DAEMON_PIDS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let before = PREEXISTING_DEVICES.get().cloned().unwrap_or_default();
    for info in ublk_core::ctrl::list_devices() {
        let served_by_us_or_nobody = info.owner_pid == -1 || ours.contains(&info.owner_pid);
        if before.contains(&info.id) || !served_by_us_or_nobody {
            continue;
        }
        let id = info.id;
        match glidefs_testkit::process::within(DELETE_LIMIT, move || {
            ublk_core::ctrl::delete_device(id)
        }) {
            Some(Ok(())) => eprintln!("test failed: deleted ublk device {id} it left behind"),
            Some(Err(e)) => eprintln!("test failed: deleting ublk device {id} it left: {e}"),
            None => eprintln!(
                "test failed: deleting ublk device {id} it left did not finish in {DELETE_LIMIT:?}"
            ),
        }
    }
}

/// A mounted filesystem; unmounted (lazily, if need be) on drop.
pub struct Mount {
    dir: PathBuf,
    mounted: bool,
}

impl Mount {
    pub fn new(dev: &str, dir: &Path) -> Mount {
        std::fs::create_dir_all(dir).expect("mount point");
        run("mount", &[dev, dir.to_str().expect("path")]);
        Mount {
            dir: dir.to_path_buf(),
            mounted: true,
        }
    }

    pub fn unmount(mut self) {
        run("umount", &[self.dir.to_str().expect("path")]);
        self.mounted = false;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}

pub fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v.pointer(key)
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

pub fn u64_of(v: &Value, key: &str) -> u64 {
    v.pointer(key)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{key} missing in {v}"))
}

/// Checks the device of a volume: it exists and runs the transport asked for.
pub fn device_of(info: &Value, t: Transport) -> String {
    let path = str_of(info, "/device/path").to_string();
    let transport = str_of(info, "/device/transport");
    println!(
        "volume {} on {path}, transport {transport}, kernel {}",
        str_of(info, "/name"),
        ublk_core::features::kernel_release()
    );
    assert_eq!(transport, t.name(), "the API reports the transport in use");
    assert!(Path::new(&path).exists(), "{path} does not exist");
    path
}

/// Runs one fio job on `dev` with crc32c verification (`verify_only`: re-check a previous
/// run's data without writing) and fails the test on any error, verify failure, or a run
/// longer than `limit` (a hang). Returns the job's JSON.
pub fn fio_verify(
    dev: &str,
    name: &str,
    job: &[&str],
    verify_only: bool,
    limit: Duration,
) -> Value {
    let mut args: Vec<String> = vec![
        format!("--name={name}"),
        format!("--filename={dev}"),
        "--direct=1".into(),
        "--ioengine=io_uring".into(),
        "--verify=crc32c".into(),
        "--do_verify=1".into(),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
        "--output-format=json".into(),
    ];
    if verify_only {
        args.push("--verify_only".into());
    }
    args.extend(job.iter().map(|a| a.to_string()));
    let what = format!(
        "fio {name}{}",
        if verify_only { " (verify only)" } else { "" }
    );
    let start = Instant::now();
    let out = output_or_fail(Command::new("fio").args(&args), limit, &what);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stderr}\n{stdout}",
        out.status
    );
    assert!(!stderr.contains("verify"), "{what}: {stderr}");
    let json: Value = serde_json::from_str(&stdout[stdout.find('{').unwrap_or(0)..])
        .unwrap_or_else(|e| panic!("{what}: fio json: {e}\n{stdout}"));
    let job = json["jobs"][0].clone();
    assert_eq!(job["error"].as_i64(), Some(0), "{what}: {job}");
    println!(
        "{what}: error=0 written={} B read+verified={} B in {:?}",
        job["write"]["io_bytes"].as_u64().unwrap_or(0),
        job["read"]["io_bytes"].as_u64().unwrap_or(0),
        start.elapsed()
    );
    job
}
