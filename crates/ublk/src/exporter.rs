//! [`UblkExporter`]: the [`Exporter`] `glidefs serve` uses. Every volume is served by a
//! [`VolumeDevice`] on `/dev/ublkbN`; the transport (zero-copy or USER_COPY) is negotiated per
//! device with the kernel, as `[ublk] transport` asks (`GLIDEFS_FORCE_USER_COPY=1` sets it).
//!
//! Contract (on top of [`crate::export`]'s):
//! - Deferred requests of every device run on the runtime handed to [`UblkExporter::new`];
//!   `attach` and `stop` block and must run on the blocking pool (the manager does that).
//! - `stop` deletes the device and returns only once no deferred task of it is left, so the
//!   manager may close the volume and delete its cache afterwards. A stop that fails leaves the
//!   device to the kernel's own teardown; the error says which step failed.
//! - `reattach` recovers the device a crashed daemon left (see [`Exporter::reattach`]);
//!   a failed recovery leaves that device QUIESCED, never deletes it.
//! - A device whose queues fit in what is left of `[ublk] own_thread_queues` gets a thread of
//!   its own per queue (its [`OwnShare`], given back when the device is dropped: stopped,
//!   detached or never started); every other device's queues run on one
//!   [`ublk_core::LoopPool`] shared by them all, started with the first such device
//!   (`[ublk] queue_threads` sizes it; `0` gives every queue a thread of its own). Threads
//!   are bounded by the two settings, whatever the device count.
//! - A kernel without ublk, or without a transport glidefs implements, is
//!   [`ExportError::Unsupported`] (the API answers `unsupported_kernel`).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use glidefs_volume::Volume;
use tokio::runtime::Handle;
use ublk_core::DeviceState;

use crate::config::UblkSection;
use crate::export::{Export, ExportError, ExportSpec, Exporter, Unavailable};
use crate::features::FeatureReport;
use crate::io_stats::IoStats;
use crate::volume_target::device::{TargetError, VolumeDevice, VolumeDeviceOptions};
use glidefs_model::api::QosLimits;
use glidefs_model::log::chain;

/// How long a recovery waits for a dead server's device to become QUIESCED.
const RECOVER_WAIT: Duration = Duration::from_secs(30);

/// Serves volumes as ublk block devices.
#[derive(Debug, Clone)]
pub struct UblkExporter {
    rt: Handle,
    ublk: UblkSection,
    /// The queue loop pool, started by the first device that needs it.
    pool: Arc<parking_lot::Mutex<Option<ublk_core::LoopPool>>>,
    /// Queues now served by threads of their own (at most `ublk.own_thread_queues()`).
    own_queues: Arc<parking_lot::Mutex<usize>>,
}

/// A device's queues counted against `[ublk] own_thread_queues`; given back when dropped.
#[derive(Debug)]
struct OwnShare {
    used: Arc<parking_lot::Mutex<usize>>,
    queues: usize,
}

impl Drop for OwnShare {
    fn drop(&mut self) {
        let mut used = self.used.lock();
        *used = used.saturating_sub(self.queues);
    }
}

impl UblkExporter {
    /// An exporter whose devices run their deferred work on `rt`, set up as `ublk` says.
    pub fn new(rt: Handle, ublk: &UblkSection) -> Self {
        UblkExporter {
            rt,
            ublk: ublk.clone(),
            pool: Arc::default(),
            own_queues: Arc::default(),
        }
    }

    /// The exporter for this kernel: [`UblkExporter`] when the kernel offers a transport,
    /// otherwise [`Unavailable`] with the reason (logged), so the daemon still starts and
    /// answers `unsupported_kernel` on create.
    pub fn for_this_kernel(rt: Handle, ublk: &UblkSection) -> Arc<dyn Exporter> {
        let report = FeatureReport::probe(ublk.transport);
        let why = match (&report.error, &report.transport_error, &report.transport) {
            (Some(e), _, _) => e.clone(),
            (None, Some(e), _) => e.clone(),
            (None, None, None) => "no ublk transport".to_string(),
            (None, None, Some(t)) => {
                tracing::info!(
                    kernel = %report.kernel,
                    transport = %t,
                    features = %report.features.join(" "),
                    "ublk available"
                );
                return Arc::new(UblkExporter::new(rt, ublk));
            }
        };
        tracing::warn!(kernel = %report.kernel, reason = %why, "ublk unavailable: volumes cannot get block devices");
        Arc::new(Unavailable(why))
    }
}

fn export_error(name: &str, e: TargetError) -> ExportError {
    if e.is_unsupported() {
        ExportError::Unsupported(Box::new(e))
    } else {
        failed(name, e)
    }
}

fn failed(name: &str, e: impl std::error::Error + Send + Sync + 'static) -> ExportError {
    ExportError::Failed {
        volume: name.to_string(),
        source: Box::new(e),
    }
}

/// Why the device a previous daemon left cannot be taken over.
#[derive(Debug, thiserror::Error)]
enum RecoverError {
    #[error("deleting the unstarted device {id} failed: {source}")]
    DeleteUnstarted {
        id: u32,
        #[source]
        source: ublk_core::Error,
    },
    #[error(
        "device {id} is {state} and served by pid {pid} (another glidefs on this data directory?)"
    )]
    ServedElsewhere {
        id: u32,
        state: DeviceState,
        pid: i32,
    },
}

impl UblkExporter {
    /// The shared queue loop pool (started on first use), or `None` for a thread per queue.
    fn pool(&self, name: &str) -> Result<Option<ublk_core::LoopPool>, ExportError> {
        let Some(threads) = self.ublk.pool_threads() else {
            return Ok(None);
        };
        let mut pool = self.pool.lock();
        if let Some(p) = pool.as_ref() {
            return Ok(Some(p.clone()));
        }
        let started = ublk_core::LoopPool::new(threads).map_err(|e| failed(name, e))?;
        tracing::info!(threads, "queue loop pool started");
        *pool = Some(started.clone());
        Ok(Some(started))
    }

    /// Who serves a device of `queues` queues: threads of its own while they fit in
    /// `own_thread_queues` (with the share to hold while it runs), else the pool.
    fn serving(
        &self,
        name: &str,
        queues: u16,
    ) -> Result<(Option<ublk_core::LoopPool>, Option<OwnShare>), ExportError> {
        let queues = usize::from(queues);
        let limit = self.ublk.own_thread_queues();
        {
            let mut used = self.own_queues.lock();
            if used.saturating_add(queues) <= limit {
                *used += queues;
                let share = OwnShare {
                    used: Arc::clone(&self.own_queues),
                    queues,
                };
                tracing::debug!(volume = name, queues, "queues on threads of their own");
                return Ok((None, Some(share)));
            }
        }
        tracing::debug!(volume = name, queues, "queues on the shared pool");
        Ok((self.pool(name)?, None))
    }

    /// The device options of `spec` under this exporter's `[ublk]` settings, with the share
    /// of own-thread queues the device holds while it runs.
    fn options(
        &self,
        name: &str,
        spec: &ExportSpec,
        id: Option<u32>,
    ) -> Result<(VolumeDeviceOptions, Option<OwnShare>), ExportError> {
        let (pool, own) = self.serving(name, spec.queues)?;
        let opts = VolumeDeviceOptions {
            queues: spec.queues,
            depth: spec.queue_depth,
            max_io_bytes: spec.max_io_bytes,
            read_only: spec.read_only,
            transport: self.ublk.transport.preference(),
            id,
            fault_ring_after: self.ublk.fault_ring_after,
            pool,
            batch_io: self.ublk.batch_io.option(),
            qos: spec.qos,
        };
        Ok((opts, own))
    }

    fn create(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
        id: Option<u32>,
    ) -> Result<Box<dyn Export>, ExportError> {
        let (opts, own) = self.options(name, spec, id)?;
        let dev = VolumeDevice::create(volume, self.rt.clone(), &opts)
            .map_err(|e| export_error(name, e))?;
        Ok(Box::new(UblkDevice {
            dev,
            name: name.to_string(),
            _own: own,
        }))
    }
}

/// Whether process `pid` exists.
fn alive(pid: i32) -> bool {
    pid > 0 && Path::new(&format!("/proc/{pid}")).exists()
}

impl Exporter for UblkExporter {
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
    ) -> Result<Box<dyn Export>, ExportError> {
        self.create(name, volume, spec, None)
    }

    /// A device left QUIESCED, or LIVE with its server dead (the kernel quiesces it once the
    /// dead server's char device is closed), is recovered; a device still served by a live
    /// process is an error (two daemons on one data directory); no device, or one that was
    /// never started, gets a new device with the same id (another free id when it is taken).
    fn reattach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &ExportSpec,
        id: u32,
    ) -> Result<Box<dyn Export>, ExportError> {
        let info = match ublk_core::device_info(id) {
            Ok(info) => info,
            Err(e) => {
                tracing::info!(volume = name, device = id, reason = %chain(&e), "no device to recover; creating one");
                return self
                    .create(name, Arc::clone(&volume), spec, Some(id))
                    .or_else(|e| {
                        tracing::warn!(volume = name, device = id, error = %chain(&e), "device id unavailable; asking for any");
                        self.create(name, volume, spec, None)
                    });
            }
        };
        let me = i32::try_from(std::process::id()).unwrap_or(-1);
        match info.state {
            DeviceState::Quiesced => {}
            // A dead server's device is quiesced by the kernel shortly; our own pid means this
            // process re-executed itself after detaching it (SIGHUP hand-off).
            DeviceState::Live if info.owner_pid == me || !alive(info.owner_pid) => {}
            DeviceState::Dead => {
                tracing::info!(
                    volume = name,
                    device = id,
                    "device was never started; replacing it"
                );
                ublk_core::delete_device(id)
                    .map_err(|source| failed(name, RecoverError::DeleteUnstarted { id, source }))?;
                return self.create(name, volume, spec, Some(id));
            }
            state => {
                let pid = info.owner_pid;
                return Err(failed(
                    name,
                    RecoverError::ServedElsewhere { id, state, pid },
                ));
            }
        }
        tracing::info!(volume = name, device = id, state = %info.state, "recovering the device a previous daemon left");
        let (opts, own) = self.options(name, spec, Some(id))?;
        let dev = VolumeDevice::recover(volume, self.rt.clone(), id, &opts, RECOVER_WAIT)
            .map_err(|e| export_error(name, e))?;
        Ok(Box::new(UblkDevice {
            dev,
            name: name.to_string(),
            _own: own,
        }))
    }

    /// The driver must advertise `UBLK_F_UPDATE_SIZE` (libublk sends UPDATE_SIZE whatever the
    /// device's own flags say; devices are created asking for the flag where it exists).
    fn check_resize(&self, name: &str, id: u32) -> Result<(), ExportError> {
        let features = ublk_core::KernelFeatures::probe()
            .map_err(|e| ExportError::Unsupported(Box::new(e)))?;
        if features.update_size() {
            Ok(())
        } else {
            Err(no_update_size(name, id))
        }
    }

    /// UPDATE_SIZE to `size` (after `check_resize`), then checks that the kernel reports it.
    fn resize(&self, name: &str, id: u32, size: u64) -> Result<(), ExportError> {
        self.check_resize(name, id)?;
        self.update_size(name, id, size)
    }

    /// TRY_STOP_DEV where the kernel has SAFE_STOP_DEV (any opener refuses), an `O_EXCL` probe
    /// elsewhere (a mount or another exclusive holder refuses): see `ublk_core::safe_stop`.
    /// A busy answer is asked again for up to [`BUSY_GRACE`]: udev probes a new device with a
    /// short open, which must not fail a remove; a mount does not go away.
    fn stop_if_unused(&self, name: &str, id: u32) -> Result<(), ExportError> {
        let deadline = std::time::Instant::now() + BUSY_GRACE;
        let mut answer = ublk_core::stop_if_unused(id);
        while matches!(answer, Err(ublk_core::SafeStopError::Busy { .. }))
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(100));
            answer = ublk_core::stop_if_unused(id);
        }
        match answer {
            Ok(how) => {
                tracing::debug!(volume = name, dev = id, ?how, "device not in use");
                Ok(())
            }
            Err(e @ ublk_core::SafeStopError::Busy { .. }) => Err(ExportError::Busy {
                volume: name.to_string(),
                detail: format!(
                    "{e} (or remove with force, and the device disappears under its users)"
                ),
            }),
            Err(e) => Err(failed(name, e)),
        }
    }
}

/// How long [`UblkExporter::stop_if_unused`] asks again while the device is busy.
const BUSY_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// Why a device's capacity was not changed.
#[derive(Debug, thiserror::Error)]
enum DeviceResizeError {
    #[error(
        "device {id} has {device} bytes, more than the {size} asked for: a device is never shrunk"
    )]
    WouldShrink { id: u32, device: u64, size: u64 },
    #[error("device {id} reports {device} bytes after UPDATE_SIZE to {size}")]
    NotApplied { id: u32, device: u64, size: u64 },
}

/// The `unsupported_kernel` answer when the driver lacks UPDATE_SIZE.
fn no_update_size(name: &str, id: u32) -> ExportError {
    ExportError::Unsupported(
        format!(
            "the kernel's ublk driver (kernel {}) has no UPDATE_SIZE (Linux 6.16+): device {id} of volume `{name}` cannot change its size",
            ublk_core::features::kernel_release()
        )
        .into(),
    )
}

impl UblkExporter {
    /// `resize` once the driver was found to have UPDATE_SIZE.
    fn update_size(&self, name: &str, id: u32, size: u64) -> Result<(), ExportError> {
        let device = ublk_core::device_info(id)
            .map_err(|e| failed(name, e))?
            .capacity_bytes;
        if device == size {
            return Ok(());
        }
        if device > size {
            return Err(failed(
                name,
                DeviceResizeError::WouldShrink { id, device, size },
            ));
        }
        ublk_core::update_size(id, size).map_err(|e| match e {
            ublk_core::ResizeError::Unsupported { .. } => no_update_size(name, id),
            e => failed(name, e),
        })?;
        let device = ublk_core::device_info(id)
            .map_err(|e| failed(name, e))?
            .capacity_bytes;
        if device != size {
            return Err(failed(
                name,
                DeviceResizeError::NotApplied { id, device, size },
            ));
        }
        tracing::info!(volume = name, device = id, size, "device resized");
        Ok(())
    }
}

/// One volume's ublk device.
#[derive(Debug)]
struct UblkDevice {
    dev: VolumeDevice,
    name: String,
    /// Held while the device runs on threads of its own (dropped after `dev`'s stop).
    _own: Option<OwnShare>,
}

impl Export for UblkDevice {
    fn id(&self) -> Option<u32> {
        Some(self.dev.id())
    }
    fn path(&self) -> Option<String> {
        Some(self.dev.bdev_path())
    }
    fn transport(&self) -> Option<String> {
        Some(self.dev.transport().name().to_string())
    }
    fn io_stats(&self) -> IoStats {
        self.dev.stats()
    }
    fn set_qos(&self, limits: &QosLimits) {
        self.dev.set_qos(limits);
    }
    fn stop(self: Box<Self>) -> Result<(), ExportError> {
        let UblkDevice { dev, name, _own } = *self;
        dev.stop().map_err(|e| export_error(&name, e))
    }
    fn detach(self: Box<Self>) -> Result<Option<u32>, ExportError> {
        let UblkDevice { dev, name, _own } = *self;
        dev.detach().map(Some).map_err(|e| export_error(&name, e))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error;

    use super::*;

    /// An exporter with `[ublk]`'s `queue_threads` and `own_thread_queues` (its runtime is
    /// never used by `serving`).
    fn exporter(
        queue_threads: u32,
        own_thread_queues: u32,
    ) -> (UblkExporter, tokio::runtime::Runtime) {
        let ublk = UblkSection {
            queue_threads: Some(queue_threads),
            own_thread_queues: Some(own_thread_queues),
            ..UblkSection::default()
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        (UblkExporter::new(rt.handle().clone(), &ublk), rt)
    }

    #[test]
    fn devices_get_threads_of_their_own_until_the_share_is_used_then_the_pool() {
        let (ex, _rt) = exporter(1, 4);
        let (pool, a) = ex.serving("a", 2).unwrap();
        assert!(pool.is_none() && a.is_some());
        let (pool, b) = ex.serving("b", 2).unwrap();
        assert!(pool.is_none() && b.is_some());
        // 4 of 4 in use: the next device goes to the pool, holding no share.
        let (pool, c) = ex.serving("c", 1).unwrap();
        assert!(pool.is_some() && c.is_none());
        assert_eq!(*ex.own_queues.lock(), 4);
        // A device that goes away gives its queues back.
        drop(a);
        assert_eq!(*ex.own_queues.lock(), 2);
        let (pool, d) = ex.serving("d", 2).unwrap();
        assert!(pool.is_none() && d.is_some());
        // A device with more queues than are left goes to the pool whole.
        drop(b);
        let (pool, e) = ex.serving("e", 3).unwrap();
        assert!(pool.is_some() && e.is_none());
        drop(d);
        assert_eq!(*ex.own_queues.lock(), 0);
    }

    #[test]
    fn without_a_pool_every_device_has_threads_and_zero_puts_every_device_on_the_pool() {
        let (ex, _rt) = exporter(0, 1);
        for name in ["a", "b", "c"] {
            let (pool, _share) = ex.serving(name, 4).unwrap();
            assert!(pool.is_none(), "{name}");
        }
        let (ex, _rt) = exporter(1, 0);
        let (pool, share) = ex.serving("a", 1).unwrap();
        assert!(pool.is_some() && share.is_none());
    }

    #[test]
    fn a_device_failure_keeps_its_cause_for_logs() {
        let os_error = || std::io::Error::from_raw_os_error(libc::ENOMEM);
        let target = TargetError::Device {
            volume: "v1".into(),
            step: "start",
            source: ublk_core::Error::QueueSetup {
                dev: 3,
                queue: 1,
                source: os_error(),
            },
        };
        let err = export_error("v1", target);
        // The log line shows every step down to the kernel's answer, each once.
        let shown = chain(&err).to_string();
        let cause = os_error().to_string();
        assert_eq!(shown.matches(&cause).count(), 1, "{shown}");
        assert!(shown.contains("device=3 queue=1"), "{shown}");
        assert!(shown.contains("volume `v1`"), "{shown}");
        // The cause is the typed error, not a copy of its text. (That the API answers
        // `device_failed` with it: the daemon's `api::error` tests.)
        let root = std::iter::successors(Some(&err as &(dyn Error + 'static)), |e| (*e).source())
            .last()
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .and_then(std::io::Error::raw_os_error);
        assert_eq!(root, Some(libc::ENOMEM));
    }
}
