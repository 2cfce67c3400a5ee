//! The command line: arguments, the API client, the `glidefs volume ...` and
//! `glidefs snapshot ...` commands.

pub mod args;
pub mod client;
pub(crate) mod client_tls;
pub mod commands;
pub mod snapshot;
