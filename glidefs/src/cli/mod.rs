//! The command line: arguments, the API client, the `glidefs volume ...` commands.

pub mod args;
pub mod client;
pub(crate) mod client_tls;
pub mod commands;
