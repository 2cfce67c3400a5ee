//! `glidefs-s3-server --dir DIR --bucket NAME [--addr 127.0.0.1:PORT]`: the test kit's S3
//! server ([`glidefs_testkit::S3Listener`]: s3s + s3s-fs, SigV4 with the static key pair,
//! atomic conditional writes) as a process of its own, for scripts (`scripts/fio-soak`).
//!
//! Serves the buckets under DIR (creating DIR/NAME) on the address (port 0: any free port).
//! Once listening it prints to stdout, one per line, `endpoint http://ADDR`, `bucket NAME`,
//! `access_key_id KEY`, `secret_access_key SECRET`, `region REGION` and last `ready ADDR`.
//! SIGTERM or SIGINT stops it: it stops serving and exits 0; the directory stays.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use glidefs_testkit::s3_server::{ACCESS_KEY, REGION, SECRET_KEY};
use glidefs_testkit::S3Listener;
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
}

async fn serve(args: Args) -> Result<(), String> {
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    std::fs::create_dir_all(&args.dir)
        .map_err(|e| format!("cannot create {}: {e}", args.dir.display()))?;
    let listener = S3Listener::serve(&args.dir, &args.bucket, args.addr)
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.addr();
    println!("endpoint {}", listener.endpoint());
    println!("bucket {}", args.bucket);
    println!("access_key_id {ACCESS_KEY}");
    println!("secret_access_key {SECRET_KEY}");
    println!("region {REGION}");
    println!("ready {addr}");
    let why = tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    };
    drop(listener);
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
