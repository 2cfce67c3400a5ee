//! Command-line interface.

use clap::{Parser, Subcommand};

/// glidefs: ublk block devices backed by a local write cache and an object store.
#[derive(Debug, Parser)]
#[command(name = "glidefs", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report the running kernel's ublk support and the transport glidefs would pick.
    Features,
}
