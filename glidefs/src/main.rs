use anyhow::Context;
use clap::Parser;
use glidefs::cli::{Cli, Command};

#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Features => {
            let features = ublk_core::KernelFeatures::probe().context("probing ublk support")?;
            println!("kernel: {}", ublk_core::features::kernel_release());
            println!("ublk features: {features}");
            println!(
                "zero-copy (SUPPORT_ZERO_COPY|AUTO_BUF_REG): {}",
                features.zero_copy()
            );
            println!("user-copy (USER_COPY): {}", features.user_copy());
            println!(
                "user recovery (USER_RECOVERY): {}",
                features.user_recovery()
            );
        }
    }
    Ok(())
}
