//! How the volume manager exposes a volume as a block device, behind a trait so that the
//! control plane runs and tests without a kernel. An [`Exporter`] makes the device; the
//! [`Export`] it returns is that volume being served, until stopped. (A *device* is always
//! the block device itself.)
//!
//! Contract:
//! - [`Exporter::attach`] and [`Exporter::reattach`] are blocking (device creation
//!   talks to the kernel): the manager calls them on the blocking pool. On success the device serves `volume` until
//!   [`Export::stop`]; the exporter owns its threads. On failure nothing is left behind.
//! - [`Export::stop`] is blocking: it stops serving, waits for in-flight requests and
//!   deletes the device. After it returns the exporter holds no reference to the volume's cache
//!   files, so the manager may close the volume and delete its directory.
//! - [`Export::io_stats`] is cheap and lock-free enough to call on every `/metrics`
//!   scrape ([`crate::io_stats::IoRecorder`] is the set of atomic counters behind it).
//! - A kernel without ublk (or without a transport glidefs implements) is
//!   [`ExportError::Unsupported`], which the API reports as `unsupported_kernel` (501).
//!
//! [`NoDevices`] serves volumes with no block device at all (path and transport `None`): for
//! tests and `glidefs serve --no-devices`.

use std::sync::Arc;

pub use crate::io_stats::IoStats;
use glidefs_model::api::QosLimits;
use glidefs_model::BoxError;
use glidefs_volume::Volume;
use serde::Serialize;

/// What the device for a volume looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ExportSpec {
    /// Hardware queues (one serving thread each).
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Refuse writes, discards and write-zeroes at the device.
    pub read_only: bool,
    /// Largest single I/O in bytes.
    pub max_io_bytes: u32,
    /// The volume's QoS limits when it starts serving ([`Export::set_qos`] changes them).
    pub qos: QosLimits,
}

/// Why a device could not be attached or stopped. The cause is kept as the error's source.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExportError {
    /// The kernel cannot serve ublk devices (no driver, too old, no permission for the control
    /// device). The cause says what is missing.
    #[error("block devices are not supported here: {0}")]
    Unsupported(#[source] BoxError),
    /// Something has the block device open (a mounted filesystem, a VM's disk): a remove
    /// without `force` leaves it serving ([`Exporter::stop_if_unused`]).
    #[error("device for volume `{volume}` is in use: {detail}")]
    Busy { volume: String, detail: String },
    /// Creating, starting or stopping the device failed.
    #[error("device for volume `{volume}` failed: {source}")]
    Failed {
        volume: String,
        #[source]
        source: BoxError,
    },
}

/// Exposes volumes as block devices.
pub trait Exporter: Send + Sync + 'static {
    /// Expose `volume` as a block device; blocking call (run it in spawn_blocking).
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError>;

    /// Expose `volume` again on the device `id` a previous daemon served it on: after a crash
    /// (or a hand-off) the kernel keeps that device QUIESCED, with any filesystem on it
    /// mounted, and this takes it over; when the device is gone (clean shutdown, reboot) a
    /// new one is attached, asking for the same id. Blocking. The default just attaches.
    fn reattach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
        id: u32,
    ) -> Result<Box<dyn Export>, ExportError> {
        let _ = id;
        self.attach(name, volume, spec)
    }

    /// Whether device `id` of volume `name` can change its capacity ([`Exporter::resize`]):
    /// asked before the volume grows, so that where the kernel cannot, nothing changes.
    /// Blocking. The default (an exporter with no resize): [`ExportError::Unsupported`].
    fn check_resize(&self, name: &str, id: u32) -> Result<(), ExportError> {
        Err(ExportError::Unsupported(
            format!("device {id} of volume `{name}` cannot be resized by this exporter").into(),
        ))
    }

    /// Grows device `id` of volume `name` to `size` bytes while it serves (the volume has
    /// grown already); a device already of that size is left alone, a larger one is an error
    /// (never shrunk). Blocking. The default: [`ExportError::Unsupported`].
    fn resize(&self, name: &str, id: u32, size: u64) -> Result<(), ExportError> {
        let _ = size;
        self.check_resize(name, id)
    }

    /// Stops device `id` of volume `name` only when nothing has it open: a remove without
    /// `force` calls it while the device still serves, before [`Export::stop`]. Refused with
    /// [`ExportError::Busy`] (the device goes on serving) when something has it open; after
    /// `Ok` the device may already be stopped, and `stop` finishes the job (deletes it).
    /// Blocking. The default (no kernel device that anything could open): `Ok`.
    fn stop_if_unused(&self, name: &str, id: u32) -> Result<(), ExportError> {
        let _ = (name, id);
        Ok(())
    }
}

/// One attached device.
pub trait Export: Send + Sync {
    /// Kernel device id (`N` of `/dev/ublkbN`), when there is a device.
    fn id(&self) -> Option<u32>;
    /// Block device path, when there is a device.
    fn path(&self) -> Option<String>;
    /// Transport in use (`zero-copy`, `user-copy`), when there is a device.
    fn transport(&self) -> Option<String>;
    /// Counters and latency histograms since attach.
    fn io_stats(&self) -> IoStats;
    /// Replaces the volume's QoS limits while it serves ([`crate::qos`]): from the next
    /// request on. Cheap (no kernel call). The default (nothing to limit): nothing.
    fn set_qos(&self, limits: &QosLimits) {
        let _ = limits;
    }
    /// Stop serving and delete the device (blocking).
    fn stop(self: Box<Self>) -> Result<(), ExportError>;

    /// Stop serving but keep the device for a successor (hand-off): the kernel holds new
    /// I/O until [`Exporter::reattach`] in the next daemon takes it over. Returns the
    /// device id kept, `None` when there is no device to keep (then this is `stop`).
    /// Blocking. Like `stop`, nothing of the device touches the volume afterwards.
    fn detach(self: Box<Self>) -> Result<Option<u32>, ExportError> {
        self.stop().map(|()| None)
    }
}

/// Serves volumes without block devices: `attach` always succeeds, nothing is exported.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDevices;

/// The "device" of [`NoDevices`]: no id, no path, no transport, zero counters.
#[derive(Debug)]
struct Detached;

impl Exporter for NoDevices {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        Ok(Box::new(Detached))
    }
}

impl Export for Detached {
    fn id(&self) -> Option<u32> {
        None
    }
    fn path(&self) -> Option<String> {
        None
    }
    fn transport(&self) -> Option<String> {
        None
    }
    fn io_stats(&self) -> IoStats {
        IoStats::default()
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        Ok(())
    }
}

/// Refuses every attach with [`ExportError::Unsupported`] and the given reason: the
/// exporter of a daemon that cannot create block devices here (creates answer 501
/// `unsupported_kernel`; `--no-devices` serves volumes without devices instead).
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl Exporter for Unavailable {
    fn attach(
        &self,
        name: &str,
        _volume: Arc<Volume>,
        _spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        Err(ExportError::Unsupported(
            format!("cannot create a device for volume `{name}`: {}", self.0).into(),
        ))
    }
}
