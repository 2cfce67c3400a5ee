//! `glidefs-s3-server --dir DIR --bucket NAME [--addr 127.0.0.1:PORT]`: the test kit's S3
//! server ([`glidefs_testkit::S3Listener`]: s3s + s3s-fs, SigV4 with the static key pair,
//! atomic conditional writes) as a process of its own, for scripts (`scripts/fio-soak`).
//!
//! Serves the buckets under DIR (creating DIR/NAME) on the address (port 0: any free port).
//! Once listening it prints to stdout, one per line, `endpoint http://ADDR`, `bucket NAME`,
//! `access_key_id KEY`, `secret_access_key SECRET`, `region REGION` and last `ready ADDR`.
//! SIGTERM or SIGINT stops it: it stops serving and exits 0; the directory stays.
//!
//! Faults (for soaks, `scripts/fault-soak`; see `glidefs_testkit::s3_server` for what each
//! does over HTTP):
//! - `--drop-replies PCT`: each request is served, then its reply is lost (the connection
//!   dropped) with probability PCT % (seeded by `--seed`);
//! - `--outage START:LEN` (repeatable): from START to START+LEN seconds after `ready` the
//!   store is down (connections dropped before a request is served);
//! - SIGUSR1 takes the store down, SIGUSR2 brings it back (until the next timed window).
//!
//! `--latency-ms MS` (benchmarks, `scripts/bench compare --store-latency`): every request
//! waits MS milliseconds before it is served, as a remote store's first-byte latency (the
//! requests of many connections wait side by side). Not with `--drop-replies`.
//!
//! Each outage change is reported on stderr (`glidefs-s3-server: outage on|off`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use glidefs_testkit::s3_server::{ACCESS_KEY, REGION, SECRET_KEY};
use glidefs_testkit::{Fault, FaultPlan, FaultRule, S3Listener};
use tokio::signal::unix::{signal, SignalKind};

/// An S3 protocol server over a directory (for tests and scripts, not production).
#[derive(Debug, Parser)]
#[command(name = "glidefs-s3-server")]
struct Args {
    /// Directory holding the buckets (one sub-directory each); created if missing.
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Bucket to create (a sub-directory of --dir).
    #[arg(long, value_name = "NAME", default_value = "glidefs")]
    bucket: String,
    /// Address to listen on (port 0: any free port, printed in the `ready` line).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:0")]
    addr: SocketAddr,
    /// Lose the reply of this percentage of requests after serving them (0..=100).
    #[arg(long, value_name = "PCT", default_value_t = 0.0)]
    drop_replies: f64,
    /// Seed of the reply-dropping RNG.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// An outage window START:LEN in seconds after `ready` (repeatable).
    #[arg(long, value_name = "START:LEN", value_parser = parse_window)]
    outage: Vec<(u64, u64)>,
    /// Wait this many milliseconds before serving each request (a remote store's latency).
    #[arg(long, value_name = "MS", default_value_t = 0)]
    latency_ms: u64,
}

/// `START:LEN` in seconds.
fn parse_window(s: &str) -> Result<(u64, u64), String> {
    let (start, len) = s
        .split_once(':')
        .ok_or_else(|| format!("expected START:LEN in seconds, got `{s}`"))?;
    let num = |v: &str| {
        v.parse::<u64>()
            .map_err(|e| format!("`{v}` in `{s}` is not a number of seconds: {e}"))
    };
    Ok((num(start)?, num(len)?))
}

/// Runs the timed outage windows, in order of start.
async fn outage_windows(plan: Arc<FaultPlan>, mut windows: Vec<(u64, u64)>) {
    windows.sort_unstable();
    let t0 = tokio::time::Instant::now();
    for (start, len) in windows {
        tokio::time::sleep_until(t0 + Duration::from_secs(start)).await;
        plan.set_outage(true);
        eprintln!("glidefs-s3-server: outage on (window {start}:{len})");
        tokio::time::sleep_until(t0 + Duration::from_secs(start + len)).await;
        plan.set_outage(false);
        eprintln!("glidefs-s3-server: outage off (window {start}:{len})");
    }
}

async fn serve(args: Args) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    let mut usr1 =
        signal(SignalKind::user_defined1()).map_err(|e| format!("SIGUSR1 handler: {e}"))?;
    let mut usr2 =
        signal(SignalKind::user_defined2()).map_err(|e| format!("SIGUSR2 handler: {e}"))?;
    if !(0.0..=100.0).contains(&args.drop_replies) {
        return Err(format!(
            "--drop-replies must be 0..=100, got {}",
            args.drop_replies
        ));
    }
    if args.latency_ms > 0 && args.drop_replies > 0.0 {
        return Err(
            "--latency-ms and --drop-replies do not combine (one fault per request)".into(),
        );
    }
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let plan = Arc::new(FaultPlan::new(args.seed));
    if args.drop_replies > 0.0 {
        plan.inject(FaultRule::new(Fault::LostAck).probability(args.drop_replies / 100.0));
    }
    if args.latency_ms > 0 {
        let latency = Duration::from_millis(args.latency_ms);
        plan.inject(FaultRule::new(Fault::Stall(latency)));
    }
    let listener =
        S3Listener::serve_with_faults(&args.dir, &args.bucket, args.addr, Some(plan.clone()))
            .await
            .map_err(|e| e.to_string())?;
    let addr = listener.addr();
    println!("endpoint {}", listener.endpoint());
    println!("bucket {}", args.bucket);
    println!("access_key_id {ACCESS_KEY}");
    println!("secret_access_key {SECRET_KEY}");
    println!("region {REGION}");
    println!("ready {addr}");
    let windows = tokio::spawn(outage_windows(plan.clone(), args.outage.clone()));
    let why = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = usr1.recv() => {
                plan.set_outage(true);
                eprintln!("glidefs-s3-server: outage on (SIGUSR1)");
            }
            _ = usr2.recv() => {
                plan.set_outage(false);
                eprintln!("glidefs-s3-server: outage off (SIGUSR2)");
            }
        }
    };
    windows.abort();
    drop(listener);
    eprintln!("glidefs-s3-server: {} faults injected", plan.faults_fired());
    eprintln!("glidefs-s3-server: {why}: stopped serving {addr}");
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("glidefs-s3-server: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(serve(args));
    // Connection tasks were aborted with the listener; do not wait on stragglers.
    rt.shutdown_timeout(std::time::Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("glidefs-s3-server: {e}");
            ExitCode::FAILURE
        }
    }
}
