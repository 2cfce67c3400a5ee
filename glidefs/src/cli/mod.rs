//! The command line: arguments, the `glidefs volume ...` and `glidefs snapshot ...` commands
//! (on the API client, `glidefs-client`), and how their output is written ([`output`]).

pub mod args;
pub mod commands;
pub mod output;
pub mod qos;
pub mod snapshot;
pub mod warmset;
