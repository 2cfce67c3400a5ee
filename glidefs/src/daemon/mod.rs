//! `glidefs serve`: everything the daemon runs besides the block devices themselves.

pub mod api;
pub mod config;
pub mod data_dir_lock;
pub mod environment;
pub mod export;
pub mod gc;
pub mod limits;
pub mod logging;
pub mod manager;
pub mod runtime;
pub mod server;
