//! glidefs' shared model, the bottom layer of the daemon and the CLI: what every layer above
//! speaks and none of them owns. No I/O, and no import of any other glidefs crate.
//!
//! - [`api`]: the JSON documents of the HTTP API (requests, answers, the error body), shared
//!   by the daemon's server and the API client.
//! - [`size`]: byte sizes as operators write them (`10G`), for config files, requests and
//!   the CLI's output.
//! - [`log`]: an error with its whole source chain, for log lines.
//! - [`BoxError`]: the boxed cause kept where the causes' types vary.
//!
//! The layers above, bottom to top: `glidefs-ublk` (the volumes' block devices),
//! `glidefs-client` (the API client), `glidefs-daemon` (`glidefs serve`), `glidefs` (the
//! binary and its CLI). Imports run downwards only.

pub mod api;
pub mod log;
pub mod size;

/// Any error, kept as the source of one of ours where the causes' types vary (exporters,
/// object store clients). A plain message converts into it with `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
