//! Lock-free per-device I/O counters: recorded by the volume target
//! ([`crate::volume_target`]), reported by the exporter ([`crate::export`]) and rendered by
//! `/metrics` (the daemon's `api::metrics`).
//!
//! In the volume target every request is recorded exactly once, when its result is final: at `after_read` /
//! `after_write` for requests that moved data (inline or deferred), at `make_durable`'s
//! completion for successful FUA writes, and where a request is completed with a result
//! directly (errors, FLUSH, DISCARD, WRITE_ZEROES). Latency is measured from `dispatch`.
//!
//! Latency histograms use log2 microsecond buckets: bucket 0 holds latencies below 1 µs,
//! bucket `i` (1..LATENCY_BUCKETS-1) holds `[2^(i-1), 2^i)` µs, and the last bucket holds
//! everything from `2^(LATENCY_BUCKETS-2)` µs up (about 18 minutes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ublk_core::IoOp;

/// Number of latency buckets (see module docs).
pub const LATENCY_BUCKETS: usize = 32;

/// Exclusive upper bound in microseconds of latency bucket `i`; `None` for the last bucket.
pub fn bucket_upper_bound_us(i: usize) -> Option<u64> {
    (i + 1 < LATENCY_BUCKETS).then(|| 1u64 << i)
}

/// Bucket index of a latency (see module docs).
pub fn bucket_of(latency: Duration) -> usize {
    let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
    // 0 -> 0, 1 -> 1, 2..=3 -> 2, 4..=7 -> 3, ...
    let idx = (u64::BITS - us.leading_zeros()) as usize;
    idx.min(LATENCY_BUCKETS - 1)
}

/// The operations counted, in [`IoStats::ops`] order.
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

/// Counters of one operation, as a snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpStats {
    /// Requests completed (successfully or not).
    pub count: u64,
    /// Bytes of successful requests.
    pub bytes: u64,
    /// Requests completed with an error.
    pub errors: u64,
    /// Requests per log2-µs latency bucket (not cumulative; see the module docs).
    pub latency_buckets: [u64; LATENCY_BUCKETS],
    /// Sum of all latencies in microseconds.
    pub latency_sum_us: u64,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            count: 0,
            bytes: 0,
            errors: 0,
            latency_buckets: [0; LATENCY_BUCKETS],
            latency_sum_us: 0,
        }
    }
}

/// A snapshot of a device's counters (each counter read once; not atomic across counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IoStats {
    /// Per operation, indexed like [`IO_OPS`]: read, write, flush, discard, write-zeroes.
    pub ops: [OpStats; 5],
    /// Requests served on the fast path: on the loop thread, or (a request the QoS limits
    /// held back) from its task once its wait was over, which is also counted in `deferred`.
    pub inline: u64,
    /// Deferrals to the async runtime: requests deferred at dispatch, plus one per FUA
    /// write's durability step.
    pub deferred: u64,
    /// READs that needed blocks from the object store.
    pub cold_reads: u64,
    /// Bytes of those READs that were not local when they arrived.
    pub cold_read_bytes: u64,
    /// Bytes served from the scratch memfd: fetched pieces that were still not local when
    /// the READ was re-planned (a fetched block is normally kept Clean and then read from
    /// the clean file; eviction racing with the read leaves it remote).
    pub scratch_bytes: u64,
    /// WRITEs with FUA made durable before completion.
    pub fua_writes: u64,
    /// READs and WRITEs that waited for the volume's QoS limits (`crate::qos`).
    pub throttled: u64,
    /// Their waits, summed, in nanoseconds.
    pub throttled_ns: u64,
}

impl IoStats {
    /// The counters of one operation.
    pub fn op(&self, op: IoOp) -> &OpStats {
        &self.ops[op_index(op)]
    }
}

#[derive(Debug)]
struct OpCounters {
    count: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Default for OpCounters {
    fn default() -> Self {
        OpCounters {
            count: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

/// The live counters; [`IoRecorder::snapshot`] reads them.
#[derive(Debug, Default)]
pub struct IoRecorder {
    ops: [OpCounters; 5],
    pub(crate) inline: AtomicU64,
    pub(crate) deferred: AtomicU64,
    pub(crate) cold_reads: AtomicU64,
    pub(crate) cold_read_bytes: AtomicU64,
    pub(crate) scratch_bytes: AtomicU64,
    pub(crate) fua_writes: AtomicU64,
    pub(crate) throttled: AtomicU64,
    pub(crate) throttled_ns: AtomicU64,
}

impl IoRecorder {
    /// Records one finished request: `result` is what the request completes with.
    pub fn record(&self, op: IoOp, bytes: u64, result: i32, latency: Duration) {
        let c = &self.ops[op_index(op)];
        c.count.fetch_add(1, Ordering::Relaxed);
        if result >= 0 {
            c.bytes.fetch_add(bytes, Ordering::Relaxed);
        } else {
            c.errors.fetch_add(1, Ordering::Relaxed);
        }
        c.buckets[bucket_of(latency)].fetch_add(1, Ordering::Relaxed);
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        c.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub(crate) fn bump(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

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
        out.inline = self.inline.load(Ordering::Relaxed);
        out.deferred = self.deferred.load(Ordering::Relaxed);
        out.cold_reads = self.cold_reads.load(Ordering::Relaxed);
        out.cold_read_bytes = self.cold_read_bytes.load(Ordering::Relaxed);
        out.scratch_bytes = self.scratch_bytes.load(Ordering::Relaxed);
        out.fua_writes = self.fua_writes.load(Ordering::Relaxed);
        out.throttled = self.throttled.load(Ordering::Relaxed);
        out.throttled_ns = self.throttled_ns.load(Ordering::Relaxed);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_microseconds() {
        assert_eq!(bucket_of(Duration::from_nanos(999)), 0);
        assert_eq!(bucket_of(Duration::from_micros(1)), 1);
        assert_eq!(bucket_of(Duration::from_micros(3)), 2);
        assert_eq!(bucket_of(Duration::from_micros(4)), 3);
        assert_eq!(bucket_of(Duration::from_micros(1023)), 10);
        assert_eq!(bucket_of(Duration::from_micros(1024)), 11);
        assert_eq!(bucket_of(Duration::from_secs(1 << 40)), LATENCY_BUCKETS - 1);
        assert_eq!(bucket_upper_bound_us(0), Some(1));
        assert_eq!(bucket_upper_bound_us(10), Some(1024));
        assert_eq!(bucket_upper_bound_us(LATENCY_BUCKETS - 1), None);
        // Every bucket's latencies stay below its bound.
        for i in 0..LATENCY_BUCKETS - 1 {
            let bound = bucket_upper_bound_us(i).unwrap();
            assert_eq!(bucket_of(Duration::from_micros(bound - 1)).max(i), i);
            assert_eq!(bucket_of(Duration::from_micros(bound)), i + 1);
        }
    }

    #[test]
    fn record_counts_bytes_only_for_successes() {
        let s = IoRecorder::default();
        s.record(IoOp::Write, 4096, 4096, Duration::from_micros(10));
        s.record(IoOp::Write, 4096, -libc::EIO, Duration::from_micros(10));
        s.record(IoOp::Flush, 0, 0, Duration::from_millis(2));
        IoRecorder::bump(&s.inline, 2);
        let snap = s.snapshot();
        let w = snap.op(IoOp::Write);
        assert_eq!((w.count, w.bytes, w.errors), (2, 4096, 1));
        assert_eq!(w.latency_buckets[bucket_of(Duration::from_micros(10))], 2);
        assert_eq!(w.latency_sum_us, 20);
        assert_eq!(snap.op(IoOp::Flush).count, 1);
        assert_eq!(snap.op(IoOp::Read).count, 0);
        assert_eq!(snap.inline, 2);
    }
}
