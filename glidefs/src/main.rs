use std::fmt::Write as _;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

use glidefs::cli::args::{Cli, Command};
use glidefs::cli::output;
use glidefs::daemon::config::Config;
use glidefs::daemon::config::UblkSection;
use glidefs::daemon::environment::Environment;
use glidefs::daemon::server::Ending;
use glidefs::ublk::export::{Exporter, NoDevices};
use glidefs::ublk::exporter::UblkExporter;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// The exporter `serve` uses: ublk devices when this kernel has them.
fn exporter(no_devices: bool, ublk: &UblkSection, rt: tokio::runtime::Handle) -> Arc<dyn Exporter> {
    if no_devices {
        return Arc::new(NoDevices);
    }
    UblkExporter::for_this_kernel(rt, ublk)
}

/// The daemon's file creation mask: whatever umask it was started under, the files it writes
/// (volume caches, WAL, checkpoints, `state.json`, `owner-id`, the `file://` store) are 0600
/// and its directories 0700. The API socket and its directory get their modes explicitly.
const DAEMON_UMASK: u32 = 0o077;

/// `serve`, or `handoff` (`take_over` first). SIGHUP ends in an exec of this binary.
fn serve(
    args: &glidefs::cli::args::ServeArgs,
    env: &Environment,
    take_over: bool,
) -> anyhow::Result<()> {
    // Before anything is created (and before any thread exists: the mask is per process).
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(DAEMON_UMASK));
    let cfg = Config::locate(args.config.as_deref(), env)?;
    glidefs::daemon::logging::init(&cfg.log);
    tracing::info!(
        pid = std::process::id(),
        version = env!("CARGO_PKG_VERSION"),
        take_over,
        "glidefs starting"
    );
    glidefs::daemon::limits::raise_fd_limit();
    let rt = glidefs::ublk::runtime::serving().context("starting the tokio runtime")?;
    let lock = match take_over {
        true => Some(rt.block_on(glidefs::daemon::server::take_over(&cfg))?.1),
        false => None,
    };
    let devices = exporter(args.no_devices, &cfg.ublk, rt.handle().clone());
    // The data directory's lock is held until this process exits or execs (its descriptor is
    // close-on-exec): no other daemon starts on the data directory while this one still runs.
    let (ending, _lock) = rt.block_on(glidefs::daemon::server::run(&cfg, devices, lock))?;
    // Dropping the runtime would wait without bound for blocking tasks: a device step the
    // manager gave up on (wedged device) must not keep the process from exiting.
    rt.shutdown_timeout(std::time::Duration::from_secs(10));
    match ending {
        Ending::Reexec { devices } => {
            use std::os::unix::process::CommandExt;
            tracing::info!(devices, "re-executing glidefs");
            // `serve` with the same options (a `handoff` process must not take over again).
            let err = std::process::Command::new("/proc/self/exe")
                .arg("serve")
                .args(std::env::args_os().skip(2))
                .exec();
            Err(anyhow::anyhow!("re-executing /proc/self/exe failed: {err}"))
        }
        Ending::HandedOff { devices } => {
            tracing::info!(devices, "handed off");
            Ok(())
        }
        Ending::Stopped => Ok(()),
    }
}

/// Runs the command; an error is printed with its whole chain, each cause once (see
/// `glidefs_model::log::chain`), rather than anyhow's `Caused by:` list, which would repeat the
/// causes our messages already show.
fn main() -> std::process::ExitCode {
    // The one place the environment is read (see glidefs::daemon::environment).
    let env = Environment::from_vars(std::env::vars_os());
    match run(Cli::parse(), &env) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            output::stderr_line(&format!("Error: {}", glidefs_model::log::chain(e.as_ref())));
            std::process::ExitCode::FAILURE
        }
    }
}

/// Writes a command's output on stdout (a closed pipe ends it quietly: [`output`]).
fn write_out(text: &str) -> anyhow::Result<()> {
    output::stdout(text).context("writing the output to stdout")
}

fn run(cli: Cli, env: &Environment) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve(args) => serve(&args, env, false)?,
        Command::Handoff(args) => serve(&args, env, true)?,
        Command::Volume(args) => {
            let mut out = runtime()?.block_on(glidefs::cli::commands::run_volume(
                &args.target,
                env,
                &args.command,
            ))?;
            if !out.ends_with('\n') {
                out.push('\n');
            }
            write_out(&out)?;
        }
        Command::Snapshot(args) => {
            let out = runtime()?.block_on(glidefs::cli::snapshot::run_snapshot(
                &args.target,
                env,
                &args.command,
            ))?;
            write_out(&out)?;
        }
        Command::Features { json } => {
            let mut cfg = Config::default();
            cfg.apply_env(env);
            let report = glidefs::ublk::features::FeatureReport::probe(cfg.ublk.transport);
            write_out(&match json {
                true => format!("{}\n", serde_json::to_string_pretty(&report)?),
                false => report.text(),
            })?;
        }
        Command::Csi(args) => {
            let cfg = Config::locate(args.config.as_deref(), env)?;
            glidefs::daemon::logging::init(&cfg.log);
            let rt = runtime()?;
            rt.block_on(glidefs::csi::run(&args, &cfg, async {
                let mut term =
                    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                        .ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {}
                }
                tracing::info!("CSI driver stopping");
            }))?;
        }
        Command::Gc(args) => {
            let cfg = Config::locate(args.config.as_deref(), env)?;
            glidefs::daemon::logging::init(&cfg.log);
            let reports = runtime()?.block_on(glidefs::daemon::gc::run(
                &cfg,
                args.dry_run,
                args.volume.as_deref(),
            ))?;
            let mut out = String::new();
            if args.json {
                writeln!(out, "{}", serde_json::to_string_pretty(&reports)?)?;
            } else {
                for r in &reports {
                    if let Some(e) = &r.error {
                        writeln!(
                            out,
                            "{}{}: gc failed: {e}",
                            r.prefix
                                .as_deref()
                                .map(|p| format!("{p}/"))
                                .unwrap_or_default(),
                            r.volume
                        )?;
                        continue;
                    }
                    writeln!(
                        out,
                        "{}{}: {} manifests deleted, {} packs deleted ({} bytes), {} referenced, {} in grace{}",
                        r.prefix.as_deref().map(|p| format!("{p}/")).unwrap_or_default(),
                        r.volume,
                        r.manifests_deleted.len(),
                        r.packs_deleted,
                        r.bytes_deleted,
                        r.packs_referenced,
                        r.packs_in_grace,
                        if r.dry_run { " (dry run: nothing deleted)" } else { "" }
                    )?;
                }
                if reports.is_empty() {
                    writeln!(out, "no volumes in the store")?;
                }
            }
            write_out(&out)?;
            let failed = glidefs::daemon::gc::failures(&reports);
            if !failed.is_empty() {
                for (volume, error) in &failed {
                    output::stderr_line(&format!("glidefs gc: volume `{volume}`: {error}"));
                }
                anyhow::bail!(
                    "gc failed for {} of {} volumes: {}",
                    failed.len(),
                    reports.len(),
                    failed
                        .iter()
                        .map(|(v, _)| *v)
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
        }
    }
    Ok(())
}
