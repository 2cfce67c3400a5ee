//! How the volume manager exposes a volume as a block device, behind a trait so that the
//! control plane runs and tests without a kernel.
//!
//! Contract:
//! - [`DeviceLayer::attach`] is blocking (device creation talks to the kernel): the manager
//!   calls it on the blocking pool. On success the device serves `volume` until
//!   [`AttachedDevice::stop`]; the layer owns its threads. On failure nothing is left behind.
//! - [`AttachedDevice::stop`] is blocking: it stops serving, waits for in-flight requests and
//!   deletes the device. After it returns the layer holds no reference to the volume's cache
//!   files, so the manager may close the volume and delete its directory.
//! - [`AttachedDevice::io_stats`] is cheap and lock-free enough to call on every `/metrics`
//!   scrape. [`IoRecorder`] is a ready-made set of atomic counters an implementation can record
//!   into and snapshot.
//! - A kernel without ublk (or without a transport glidefs implements) is
//!   [`DeviceLayerError::Unsupported`], which the API reports as `unsupported_kernel` (501).
//!
//! [`NoDevices`] serves volumes with no block device at all (path and transport `None`): for
//! tests and `glidefs serve --no-devices`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use glidefs_volume::Volume;
use serde::Serialize;
pub use ublk_core::IoOp;

/// What the device for a volume looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct DeviceSpec {
    /// Hardware queues (one serving thread each).
    pub queues: u16,
    /// Requests in flight per queue.
    pub queue_depth: u16,
    /// Refuse writes, discards and write-zeroes at the device.
    pub read_only: bool,
    /// Largest single I/O in bytes.
    pub max_io_bytes: u32,
}

/// Why a device could not be attached or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DeviceLayerError {
    /// The kernel cannot serve ublk devices (no driver, too old, no permission for the control
    /// device). The message says what is missing.
    #[error("block devices are not supported here: {0}")]
    Unsupported(String),
    /// Creating, starting or stopping the device failed.
    #[error("device for volume `{volume}` failed: {message}")]
    Failed { volume: String, message: String },
}

/// Exposes volumes as block devices.
pub trait DeviceLayer: Send + Sync + 'static {
    /// Expose `volume` as a block device; blocking call (run it in spawn_blocking).
    fn attach(
        &self,
        name: &str,
        volume: Arc<Volume>,
        spec: &DeviceSpec,
    ) -> Result<Box<dyn AttachedDevice>, DeviceLayerError>;
}

/// One attached device.
pub trait AttachedDevice: Send + Sync {
    /// Kernel device id (`N` of `/dev/ublkbN`), when there is a device.
    fn id(&self) -> Option<u32>;
    /// Block device path, when there is a device.
    fn path(&self) -> Option<String>;
    /// Transport in use (`zero-copy`, `user-copy`), when there is a device.
    fn transport(&self) -> Option<String>;
    /// Counters and latency histograms since attach.
    fn io_stats(&self) -> IoStats;
    /// Stop serving and delete the device (blocking).
    fn stop(self: Box<Self>) -> Result<(), DeviceLayerError>;
}

/// Upper bounds (inclusive, microseconds) of the latency histogram buckets; a last, implicit
/// bucket holds everything slower.
pub const LATENCY_BOUNDS_US: [u64; 14] = [
    50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000,
];

/// Buckets of a histogram: one per bound plus the overflow bucket.
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS_US.len() + 1;

/// Request kinds counted, in [`IoStats::ops`] order (ublk-core's [`IoOp`], re-exported so a
/// device implementation records what its requests carry).
pub const IO_OPS: [IoOp; 5] = [
    IoOp::Read,
    IoOp::Write,
    IoOp::Flush,
    IoOp::Discard,
    IoOp::WriteZeroes,
];

/// Label value of `op` in metrics.
pub fn op_name(op: IoOp) -> &'static str {
    match op {
        IoOp::Read => "read",
        IoOp::Write => "write",
        IoOp::Flush => "flush",
        IoOp::Discard => "discard",
        IoOp::WriteZeroes => "write_zeroes",
    }
}

fn op_index(op: IoOp) -> usize {
    match op {
        IoOp::Read => 0,
        IoOp::Write => 1,
        IoOp::Flush => 2,
        IoOp::Discard => 3,
        IoOp::WriteZeroes => 4,
    }
}

/// A snapshot of one request kind's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct OpStats {
    /// Requests completed (successfully or not).
    pub count: u64,
    /// Bytes moved by successful requests.
    pub bytes: u64,
    /// Requests completed with an error.
    pub errors: u64,
    /// Requests per latency bucket (not cumulative; see [`LATENCY_BOUNDS_US`]).
    pub latency_buckets: [u64; LATENCY_BUCKETS],
    /// Sum of all latencies, microseconds.
    pub latency_sum_us: u64,
}

/// A snapshot of a device's I/O counters, indexed like [`IO_OPS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct IoStats {
    /// Per request kind: read, write, flush, discard, write-zeroes.
    pub ops: [OpStats; 5],
}

impl IoStats {
    /// The counters of one kind.
    pub fn op(&self, op: IoOp) -> &OpStats {
        &self.ops[op_index(op)]
    }
}

#[derive(Debug, Default)]
struct OpCounters {
    count: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

/// Lock-free counters a device implementation records each completed request into.
#[derive(Debug, Default)]
pub struct IoRecorder {
    ops: [OpCounters; 5],
}

impl IoRecorder {
    /// Records one completed request.
    pub fn record(&self, op: IoOp, bytes: u64, latency: Duration, ok: bool) {
        let c = &self.ops[op_index(op)];
        c.count.fetch_add(1, Ordering::Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_US.partition_point(|&b| b < us);
        c.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        c.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// A snapshot (each counter read once; not atomic across counters).
    pub fn snapshot(&self) -> IoStats {
        let mut out = IoStats::default();
        for (o, c) in out.ops.iter_mut().zip(&self.ops) {
            o.count = c.count.load(Ordering::Relaxed);
            o.bytes = c.bytes.load(Ordering::Relaxed);
            o.errors = c.errors.load(Ordering::Relaxed);
            o.latency_sum_us = c.sum_us.load(Ordering::Relaxed);
            for (b, a) in o.latency_buckets.iter_mut().zip(&c.buckets) {
                *b = a.load(Ordering::Relaxed);
            }
        }
        out
    }
}

/// Serves volumes without block devices: `attach` always succeeds, nothing is exported.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoDevices;

/// The "device" of [`NoDevices`]: no id, no path, no transport, zero counters.
#[derive(Debug)]
struct Detached;

impl DeviceLayer for NoDevices {
    fn attach(
        &self,
        _name: &str,
        _volume: Arc<Volume>,
        _spec: &DeviceSpec,
    ) -> Result<Box<dyn AttachedDevice>, DeviceLayerError> {
        Ok(Box::new(Detached))
    }
}

impl AttachedDevice for Detached {
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
    fn stop(self: Box<Self>) -> Result<(), DeviceLayerError> {
        Ok(())
    }
}

/// Refuses every attach with [`DeviceLayerError::Unsupported`] and the given reason: the
/// layer of a daemon that cannot create block devices here (creates answer 501
/// `unsupported_kernel`; `--no-devices` serves volumes without devices instead).
#[derive(Debug, Clone)]
pub struct Unavailable(pub String);

impl DeviceLayer for Unavailable {
    fn attach(
        &self,
        name: &str,
        _volume: Arc<Volume>,
        _spec: &DeviceSpec,
    ) -> Result<Box<dyn AttachedDevice>, DeviceLayerError> {
        Err(DeviceLayerError::Unsupported(format!(
            "cannot create a device for volume `{name}`: {}",
            self.0
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recorder_buckets_latencies_and_counts_errors() {
        let r = IoRecorder::default();
        r.record(IoOp::Read, 4096, Duration::from_micros(40), true);
        r.record(IoOp::Read, 4096, Duration::from_micros(100), true);
        r.record(IoOp::Read, 4096, Duration::from_secs(3), false);
        let s = r.snapshot();
        let read = s.op(IoOp::Read);
        assert_eq!((read.count, read.bytes, read.errors), (3, 8192, 1));
        assert_eq!(read.latency_buckets[0], 1, "40us <= 50us");
        assert_eq!(read.latency_buckets[1], 1, "100us <= 100us");
        assert_eq!(read.latency_buckets[LATENCY_BUCKETS - 1], 1, "3s overflows");
        assert_eq!(read.latency_sum_us, 3_000_140);
        assert_eq!(s.op(IoOp::Write).count, 0);
    }
}
