use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use glidefs::cli::{Cli, Command};
use glidefs::config::Config;
use glidefs::device::{DeviceLayer, NoDevices};
use glidefs::ublk_layer::UblkDevices;

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")
}

/// The block-device layer `serve` uses: ublk devices when this kernel has them.
fn device_layer(no_devices: bool, rt: tokio::runtime::Handle) -> Arc<dyn DeviceLayer> {
    if no_devices {
        return Arc::new(NoDevices);
    }
    UblkDevices::for_this_kernel(rt)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => {
            let cfg = Config::locate(args.config.as_deref())?;
            glidefs::logging::init(&cfg.log);
            let rt = runtime()?;
            let devices = device_layer(args.no_devices, rt.handle().clone());
            rt.block_on(glidefs::server::run(&cfg, devices))?;
        }
        Command::Volume(args) => {
            let out =
                runtime()?.block_on(glidefs::commands::run_volume(&args.target, &args.command))?;
            print!("{out}");
            if !out.ends_with('\n') {
                println!();
            }
        }
        Command::Features { json } => {
            let report = glidefs::features::FeatureReport::probe();
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.text());
            }
        }
        Command::Gc(args) => {
            let cfg = Config::locate(args.config.as_deref())?;
            glidefs::logging::init(&cfg.log);
            let reports = runtime()?.block_on(glidefs::gc::run(
                &cfg,
                args.dry_run,
                args.volume.as_deref(),
            ))?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&reports)?);
            } else {
                for r in &reports {
                    println!(
                        "{}{}: {} manifests deleted, {} packs deleted ({} bytes), {} referenced, {} in grace{}",
                        r.prefix.as_deref().map(|p| format!("{p}/")).unwrap_or_default(),
                        r.volume,
                        r.manifests_deleted.len(),
                        r.packs_deleted,
                        r.bytes_deleted,
                        r.packs_referenced,
                        r.packs_in_grace,
                        if r.dry_run { " (dry run: nothing deleted)" } else { "" }
                    );
                }
                if reports.is_empty() {
                    println!("no volumes in the store");
                }
            }
        }
    }
    Ok(())
}
