//! glidefs: the daemon and CLI that join the ublk transport (`ublk-core`) and the storage
//! engine (`crates/`). This is the only crate where both meet.

pub mod api;
pub mod cli;
pub mod client;
pub mod client_tls;
pub mod commands;
pub mod config;
pub mod device;
pub mod environment;
pub mod features;
pub mod gc;
pub mod io_stats;
pub mod logging;
pub mod manager;
pub mod model;
pub mod runtime;
pub mod server;
pub mod size;
pub mod target;
pub mod ublk_layer;

/// Any error, kept as the source of one of ours where the causes' types vary (device layers,
/// object store clients). A plain message converts into it with `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
