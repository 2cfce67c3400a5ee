//! The command line: arguments, the API client, the `glidefs volume ...` and
//! `glidefs snapshot ...` commands, and how their output is written ([`output`]).

pub mod args;
pub mod client;
pub mod commands;
pub(crate) mod endpoint;
pub mod output;
pub mod snapshot;
