//! glidefs: the daemon and CLI that join the ublk transport (`ublk-core`) and the storage
//! engine (`crates/`). This is the only crate where both meet.
//!
//! Rooms:
//! - [`daemon`]: `glidefs serve` — configuration and environment, the HTTP API, the volume
//!   manager and its flusher, the server's start, stop and hand-off, logging, `glidefs gc`.
//! - [`ublk`]: the volumes' block devices — the ublk target that serves a volume
//!   ([`ublk::volume_target`]), the exporter the manager attaches volumes with, the kernel's
//!   feature report, per-device I/O counters.
//! - [`cli`]: the command line — arguments, the API client, the `glidefs volume ...` commands.
//! - [`csi`]: `glidefs csi`, the Kubernetes CSI driver (`crates/csi`) on the API client.
//! - [`model`] (the API's request and response types) and [`size`] (byte sizes with
//!   suffixes) are shared by the daemon and the CLI.
//!
//! Words: a *device* is a block device (`/dev/ublkbN`, served by a
//! [`ublk::volume_target::VolumeDevice`]); an *exporter* ([`daemon::export::Exporter`]) is how
//! the manager gets a device for a volume, and an *export* is one volume being served.

pub mod cli;
pub mod csi;
pub mod daemon;
pub mod model;
pub mod size;
pub mod ublk;

/// Any error, kept as the source of one of ours where the causes' types vary (exporters,
/// object store clients). A plain message converts into it with `.into()`.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
