//! glidefs: the binary (`glidefs serve`, `glidefs volume ...`, `glidefs csi`, ...) and its
//! command line, the top layer of the workspace.
//!
//! Layers, bottom up; each imports only those below it:
//! 1. `glidefs-model` (`crates/model`): the API's documents, byte sizes, error chains for
//!    logs. No I/O.
//! 2. `glidefs-ublk` (`crates/ublk`): the volumes' block devices — the ublk target that
//!    serves a volume, the exporter contract and its ublk exporter, the kernel's feature
//!    report, per-device I/O counters, the I/O-serving runtime. With `glidefs-client`
//!    (`crates/client`, the API client) beside it.
//! 3. `glidefs-daemon` (`crates/daemon`): `glidefs serve` — configuration and environment,
//!    the HTTP API, the volume manager, the server's start, stop and hand-off, logging,
//!    `glidefs gc`.
//! 4. this crate: [`cli`] (arguments, the `glidefs volume ...` and `glidefs snapshot ...`
//!    commands) and [`csi`] (`glidefs csi`, the Kubernetes CSI driver of `crates/csi` on the
//!    API client), and `main.rs`.
//!
//! The lower layers are re-exported here under the module names they had when they were
//! modules of this crate ([`daemon`], [`ublk`], [`client`], [`model`], [`size`]), so that the
//! end-to-end tests (`tests/`, test targets of this package) and the binary name one path
//! for each: `glidefs::daemon::server`, `glidefs::ublk::export::NoDevices`,
//! `glidefs::client::Client`, `glidefs::model::VolumeInfo`. They are re-exports, not a
//! second copy: new code in a lower crate imports the crate itself.
//!
//! Words: a *device* is a block device (`/dev/ublkbN`, served by a
//! [`ublk::volume_target::device::VolumeDevice`]); an *exporter* ([`ublk::export::Exporter`]) is how
//! the manager gets a device for a volume, and an *export* is one volume being served.

pub mod cli;
pub mod csi;

pub use glidefs_client as client;
pub use glidefs_daemon as daemon;
pub use glidefs_model::api as model;
pub use glidefs_model::size;
pub use glidefs_model::BoxError;
pub use glidefs_ublk as ublk;
