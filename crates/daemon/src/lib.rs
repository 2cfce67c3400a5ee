//! `glidefs serve`: everything the daemon runs besides the block devices themselves. The
//! layer above the block devices (`glidefs-ublk`), the API client (`glidefs-client`, for a
//! hand-off from a running daemon) and the shared model (`glidefs-model`); below the binary
//! and its CLI (`glidefs`), which it never imports.
//!
//! Rooms, bottom up: [`environment`] and [`config`] (every input the daemon acts on),
//! [`limits`], [`secret`] (secrets on disk), [`data_dir_lock`], [`logging`]; the volume
//! [`manager`] (its operations one file each); the HTTP [`api`] over it; [`gc`]
//! (`glidefs gc`); the [`server`] that starts, stops and hands off all of it.

pub mod api;
pub mod config;
pub mod data_dir_lock;
pub mod environment;
pub mod gc;
pub mod limits;
pub mod logging;
pub mod manager;
pub mod secret;
pub mod server;
