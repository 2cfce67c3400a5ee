//! [`VolumeDevice`]: a ublk device serving one volume through a [`VolumeTarget`]
//! (`target.rs`).
//!
//! Contract: `create`, `stop` and `detach` are blocking (they talk to the kernel): call them
//! from `spawn_blocking`, never from an async worker of `rt` (deferred requests of the device
//! run on `rt` and `create` may already wait for one: the kernel reads the partition table).
//! `stop` deletes the device, then waits up to [`DRAIN_TIMEOUT`] for the target's deferred
//! tasks, so that once it returned Ok nothing of this device touches the volume any more
//! and the caller may close it. Both first end the QoS waits (`VolumeTarget::unthrottle`):
//! a throttled request is served at once rather than after its wait, which at a low rate
//! outlasts every deadline here. `detach` (hand-off) waits only [`DETACH_DRAIN_TIMEOUT`]:
//! the kernel reissues those requests to the successor, and tasks still running end with
//! the process before the successor opens the cache.

use std::sync::Arc;
use std::time::{Duration, Instant};

use glidefs_volume::Volume;
use ublk_core::{Device, DeviceConfig, QueueOptions, Transport, TransportPreference};

use super::target::VolumeTarget;
use crate::io_stats::IoStats;
use glidefs_model::api::QosLimits;
use glidefs_model::log::chain;

/// How long `stop` waits for deferred tasks (a fetch stuck on the network) to finish.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long `detach` (hand-off) waits for them: their requests were left to the kernel,
/// which reissues them to the successor, so their answers are discarded, and every second
/// here is a second of the hand-off's I/O stall (the queue loops already gave them the
/// drain budget).
pub const DETACH_DRAIN_TIMEOUT: Duration = Duration::from_millis(500);

/// Shape of the device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeDeviceOptions {
    /// Hardware queues (each with its own ring, on `pool` or on a thread of its own).
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
    /// Largest request in bytes (a 4 KiB multiple); also the scratch slot size per tag.
    pub max_io_bytes: u32,
    /// Refuse WRITE, DISCARD and WRITE_ZEROES with `EROFS`.
    pub read_only: bool,
    /// Transport preference.
    pub transport: TransportPreference,
    /// Device id to ask for; `None` lets the kernel choose.
    pub id: Option<u32>,
    /// Test hook: see [`ublk_core::QueueOptions::fault_ring_after`].
    pub fault_ring_after: Option<u64>,
    /// Serve the queues on this shared pool; `None`: a thread per queue.
    pub pool: Option<ublk_core::LoopPool>,
    /// `UBLK_F_BATCH_IO` for a new device (a recovered one keeps its own mode).
    pub batch_io: ublk_core::BatchIo,
    /// The volume's QoS limits at start ([`VolumeDevice::set_qos`] changes them).
    pub qos: QosLimits,
}

impl Default for VolumeDeviceOptions {
    fn default() -> Self {
        VolumeDeviceOptions {
            queues: 1,
            depth: 64,
            max_io_bytes: 512 * 1024,
            read_only: false,
            transport: TransportPreference::PreferZeroCopy,
            id: None,
            fault_ring_after: None,
            qos: QosLimits::default(),
            pool: None,
            batch_io: ublk_core::BatchIo::Off,
        }
    }
}

/// Why a volume device could not be created, stopped or detached.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TargetError {
    #[error("volume `{volume}`: starting the commit pool's threads failed: {source}")]
    CommitThread {
        volume: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume `{volume}`: ublk device {step} failed: {source}")]
    Device {
        volume: String,
        step: &'static str,
        #[source]
        source: ublk_core::Error,
    },
    #[error("volume `{volume}`: {count} deferred requests still running {waited:?} after the device {step}")]
    Drain {
        volume: String,
        step: &'static str,
        count: usize,
        waited: Duration,
    },
}

impl TargetError {
    /// The kernel cannot serve ublk devices here (no driver, too old, no transport): an
    /// "unsupported kernel" condition rather than a failure of this device.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self,
            TargetError::Device {
                source: ublk_core::Error::Features(_) | ublk_core::Error::Transport(_),
                ..
            }
        )
    }
}

/// A ublk block device serving one volume.
#[derive(Debug)]
pub struct VolumeDevice {
    device: Device<VolumeTarget>,
    target: Arc<VolumeTarget>,
    volume: String,
}

impl VolumeDevice {
    /// Creates a ublk device serving `volume`; `rt` runs deferred work. Blocking (call from
    /// `spawn_blocking`).
    pub fn create(
        volume: Arc<Volume>,
        rt: tokio::runtime::Handle,
        opts: &VolumeDeviceOptions,
    ) -> Result<VolumeDevice, TargetError> {
        let name = volume.config().name.clone();
        let size = volume.geometry().volume_size();
        let cache_dir = volume.config().dir.clone();
        let target = VolumeTarget::new(
            volume,
            rt,
            opts.queues,
            opts.depth,
            opts.max_io_bytes,
            opts.read_only,
            // No limits until the device is up: START_DEV waits for the kernel's partition
            // scan, whose READs a low read limit would hold past the attach's deadline
            // (found by review). The limits apply from the first request after it.
            &QosLimits::default(),
        )
        .map_err(|source| TargetError::CommitThread {
            volume: name.clone(),
            source,
        })?;
        let target = Arc::new(target);
        let mut cfg = DeviceConfig::new("glidefs", size);
        cfg.id = opts.id;
        cfg.queues = opts.queues;
        cfg.depth = opts.depth;
        cfg.max_io_bytes = opts.max_io_bytes;
        cfg.logical_block_shift = 9;
        cfg.physical_block_shift = 12;
        cfg.discard = true;
        // The store frees space in whole blocks (a discarded block is unmapped at flush).
        let bs = target.inner.volume.geometry().block_size();
        cfg.discard_granularity = if bs.is_power_of_two() { bs } else { 0 };
        cfg.read_only = opts.read_only;
        cfg.transport = opts.transport;
        cfg.queue.fault_ring_after = opts.fault_ring_after;
        cfg.queue.pool = opts.pool.clone();
        cfg.queue.batch_io = opts.batch_io;
        let device =
            Device::create(&cfg, Arc::clone(&target)).map_err(|source| TargetError::Device {
                volume: name.clone(),
                step: "create",
                source,
            })?;
        tracing::info!(
            volume = %name,
            device = %device.bdev_path(),
            transport = %device.transport(),
            queues = opts.queues,
            depth = opts.depth,
            batch_io = ?opts.batch_io,
            "volume device created"
        );
        target.set_qos(&opts.qos);
        warn_if_writes_leave_the_loop(&name, &cache_dir, device.transport());
        Ok(VolumeDevice {
            device,
            target,
            volume: name,
        })
    }

    /// Takes over device `id`, left QUIESCED by a previous server of the same volume (a
    /// crashed daemon, or one that handed off with [`VolumeDevice::detach`]): the kernel
    /// keeps the block device (and any filesystem on it) and reissues the requests the old
    /// server had not completed. Queue count, depth, request size and transport are the
    /// device's own; `opts` gives read-only and the test hook. Waits up to `wait` for the device to reach
    /// QUIESCED. A failure leaves the device QUIESCED (never deletes it). Blocking.
    pub fn recover(
        volume: Arc<Volume>,
        rt: tokio::runtime::Handle,
        id: u32,
        opts: &VolumeDeviceOptions,
        wait: Duration,
    ) -> Result<VolumeDevice, TargetError> {
        let read_only = opts.read_only;
        let name = volume.config().name.clone();
        let err = |step, source| TargetError::Device {
            volume: name.clone(),
            step,
            source,
        };
        let info = ublk_core::device_info(id).map_err(|e| err("recover (device info)", e))?;
        let size = volume.geometry().volume_size();
        // A smaller device is one whose volume grew (a resize the previous daemon did not
        // finish): it is grown once it serves again. A larger one is not this volume's.
        if info.capacity_bytes > size {
            return Err(err(
                "recover",
                ublk_core::Error::InvalidConfig(format!(
                    "device {id} has {} bytes, volume `{name}` has {size}",
                    info.capacity_bytes
                )),
            ));
        }
        let cache_dir = volume.config().dir.clone();
        let target = VolumeTarget::new(
            volume,
            rt,
            info.queues,
            info.depth,
            info.max_io_bytes,
            read_only,
            &opts.qos,
        )
        .map_err(|source| TargetError::CommitThread {
            volume: name.clone(),
            source,
        })?;
        let target = Arc::new(target);
        let queue = QueueOptions {
            fault_ring_after: opts.fault_ring_after,
            pool: opts.pool.clone(),
            ..QueueOptions::default()
        };
        let device = Device::recover(id, "glidefs", Arc::clone(&target), &queue, wait)
            .map_err(|e| err("recover", e))?;
        tracing::info!(
            volume = %name,
            device = %device.bdev_path(),
            transport = %device.transport(),
            "volume device recovered"
        );
        warn_if_writes_leave_the_loop(&name, &cache_dir, device.transport());
        if info.capacity_bytes != 0 && info.capacity_bytes < size {
            match ublk_core::update_size(id, size) {
                Ok(()) => {
                    tracing::info!(volume = %name, device = id, from = info.capacity_bytes, to = size, "recovered device grown to the volume's size (a resize the previous daemon did not finish)")
                }
                Err(e) => {
                    tracing::error!(volume = %name, device = id, size = info.capacity_bytes, volume_size = size, error = %chain(&e), "recovered device keeps its smaller size (resize the volume again to retry)")
                }
            }
        }
        Ok(VolumeDevice {
            device,
            target,
            volume: name,
        })
    }

    /// Kernel device id (`N` of `/dev/ublkbN`).
    pub fn id(&self) -> u32 {
        self.device.id()
    }

    /// The block device path.
    pub fn bdev_path(&self) -> String {
        self.device.bdev_path()
    }

    /// The transport the kernel granted.
    pub fn transport(&self) -> Transport {
        self.device.transport()
    }

    /// Counters since create.
    pub fn stats(&self) -> IoStats {
        self.target.stats()
    }

    /// Replaces the volume's QoS limits while it serves (see [`crate::qos`]).
    pub fn set_qos(&self, limits: &QosLimits) {
        self.target.set_qos(limits);
    }

    /// Stops serving, deletes the device and waits for deferred tasks (blocking).
    pub fn stop(self) -> Result<(), TargetError> {
        let VolumeDevice {
            device,
            target,
            volume,
        } = self;
        // Throttled requests are served now, while STOP_DEV waits for them (see `drain`).
        target.unthrottle();
        device
            .stop_and_delete()
            .map_err(|source| TargetError::Device {
                volume: volume.clone(),
                step: "stop",
                source,
            })?;
        drain(&target, &volume, "stop", DRAIN_TIMEOUT)
    }

    /// Stops serving but leaves the device quiesced for a successor (hand-off); returns
    /// the device id. Blocking. Deferred tasks still running after [`DETACH_DRAIN_TIMEOUT`]
    /// (a fetch stuck in store retries) are only reported: the device is kept all the same
    /// (their requests were left to the kernel, which reissues them to the successor; their
    /// answers go to a queue that is gone). They may still write the cache while the volume
    /// closes: a reissued request writes the same bytes again, and they end with the process
    /// before the successor opens the cache.
    pub fn detach(self) -> Result<u32, TargetError> {
        let VolumeDevice {
            device,
            target,
            volume,
        } = self;
        // Throttled requests are served now, within the queues' drain budget.
        target.unthrottle();
        let id = device.detach().map_err(|source| TargetError::Device {
            volume: volume.clone(),
            step: "detach",
            source,
        })?;
        if let Err(e) = drain(&target, &volume, "detach", DETACH_DRAIN_TIMEOUT) {
            tracing::warn!(volume = %volume, device = id, error = %chain(&e), "device detached and kept for the successor, but deferred tasks are still running");
        }
        Ok(id)
    }
}

/// Waits until the target has no deferred task left (bounded by `limit`). Called after
/// [`VolumeTarget::unthrottle`]: a request waiting for the QoS limits would otherwise sleep
/// its whole wait (minutes, at a low rate) and outlast `limit`.
pub(super) fn drain(
    target: &VolumeTarget,
    volume: &str,
    step: &'static str,
    limit: Duration,
) -> Result<(), TargetError> {
    let start = Instant::now();
    loop {
        let count = target.in_flight();
        if count == 0 {
            return Ok(());
        }
        if start.elapsed() >= limit {
            return Err(TargetError::Drain {
                volume: volume.to_string(),
                step,
                count,
                waited: start.elapsed(),
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Warns when the volume's cache directory is on a file system that cannot take a buffered
/// write without blocking (ext4, tmpfs): there io_uring runs every zero-copy WRITE into the
/// cache on an io-wq worker thread, which makes small writes slower than USER_COPY's copy
/// (see `ublk_core::file_probe`). Data stays safe either way.
fn warn_if_writes_leave_the_loop(volume: &str, dir: &std::path::Path, transport: Transport) {
    if transport != Transport::ZeroCopy {
        return;
    }
    match ublk_core::inline_buffered_writes(dir) {
        Ok(true) => {}
        Ok(false) => tracing::warn!(
            volume,
            cache_dir = %dir.display(),
            "the cache's file system cannot take non-blocking buffered writes (ext4 and tmpfs \
             cannot): every zero-copy WRITE runs on an io_uring worker thread, slower than \
             copying for small writes; put the data directory on XFS for the fast path"
        ),
        Err(e) => {
            tracing::debug!(volume, cache_dir = %dir.display(), error = %chain(&e), "could not probe the cache's file system")
        }
    }
}
