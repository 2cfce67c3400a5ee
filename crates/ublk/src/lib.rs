//! The volumes' block devices, the layer above the shared model (`glidefs-model`): a ublk
//! target per volume ([`volume_target`]), the [`export`] contract the daemon's volume manager
//! attaches volumes through and the [`exporter`] that keeps it with ublk devices, the
//! kernel's [`features`], per-device [`io_stats`], the `[ublk]` section of the daemon's
//! configuration ([`config`]) and the I/O-serving tokio [`runtime`].
//!
//! Imports: `ublk-core` (the transport), the engine (`glidefs-volume`) and `glidefs-model`.
//! Never the daemon nor the CLI: what the daemon needs from here it imports.

pub mod config;
pub mod export;
pub mod exporter;
pub mod features;
pub mod io_stats;
pub mod qos;
pub mod runtime;
pub mod volume_target;
