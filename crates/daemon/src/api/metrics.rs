//! `GET /metrics`: Prometheus text exposition (format 0.0.4). The per-volume families are a
//! table (`PER_VOLUME`: name, type, help, where the value comes from) rendered by one loop;
//! `metrics_tests` checks the whole output against the exposition format.
//!
//! Per volume (label `volume`): I/O requests, bytes, errors and latency histograms per `op`
//! (from the device's [`IoStats`]); dirty / syncing / cached bytes;
//! read cache hits and misses (READ requests served locally / needing the store, from the
//! device), cold-read bytes, inline vs deferred requests, FUA writes; blocks fetched from the
//! store, coalesced fetches, readahead; flush count, bytes, errors, duration, lag;
//! manifest generation; fenced, up and recovering flags. Daemon-wide: API requests and
//! errors by `code`; per listener (`unix`, `tcp`): open connections, connections refused at
//! the limit and closed by a timeout.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::OwnedSemaphorePermit;

use glidefs_volume::VolumeStats;

use ublk_core::IoOp;

use crate::manager::VolumeMetrics;
use glidefs_ublk::io_stats::{bucket_upper_bound_us, op_name, IoStats, IO_OPS, LATENCY_BUCKETS};

/// Daemon-wide API counters.
#[derive(Debug, Default)]
pub struct ApiCounters {
    pub requests: AtomicU64,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    /// Connections of the unix socket.
    pub unix: Arc<ConnCounters>,
    /// Connections of the TCP listener.
    pub tcp: Arc<ConnCounters>,
}

/// Connections of one listener: open now, refused at the limit, closed by a timeout.
#[derive(Debug, Default)]
pub struct ConnCounters {
    open: AtomicU64,
    refused: AtomicU64,
    timed_out: AtomicU64,
}

impl ConnCounters {
    /// A connection was accepted under `permit`: counted open until the guard drops.
    pub fn opened(self: &Arc<Self>, permit: OwnedSemaphorePermit) -> OpenConnection {
        self.open.fetch_add(1, Ordering::Relaxed);
        OpenConnection {
            counters: self.clone(),
            permit: Some(permit),
        }
    }

    /// A connection was closed at once: the listener was at its limit.
    pub fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// A connection was closed by the header-read or idle timeout.
    pub fn timed_out(&self) {
        self.timed_out.fetch_add(1, Ordering::Relaxed);
    }
}

/// An open connection (see [`ConnCounters::opened`]).
#[derive(Debug)]
pub struct OpenConnection {
    counters: Arc<ConnCounters>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        // The slot is free before the gauge says so: a client that reads the gauge and then
        // connects is not refused.
        drop(self.permit.take());
        self.counters.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl ApiCounters {
    /// Counts one error response.
    pub fn error(&self, code: &'static str) {
        *self.errors.lock().entry(code).or_default() += 1;
    }
}

/// Writes a family's HELP and TYPE lines.
fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Where a per-volume figure comes from.
#[derive(Clone, Copy)]
enum Value {
    /// The volume's entry (state flags, flush counters).
    Volume(fn(&VolumeMetrics) -> f64),
    /// The device's counters (zero without a device).
    Device(fn(&IoStats) -> u64),
    /// A device's counter of nanoseconds, shown in seconds.
    DeviceNanos(fn(&IoStats) -> u64),
    /// The engine's figures and the block size; no sample for a volume that is not open.
    Stats(fn(&VolumeStats, u64) -> u64),
}

impl Value {
    fn of(self, v: &VolumeMetrics) -> Option<f64> {
        match self {
            Value::Volume(f) => Some(f(v)),
            Value::Device(f) => Some(f(&v.io) as f64),
            Value::DeviceNanos(f) => Some(f(&v.io) as f64 / 1e9),
            Value::Stats(f) => v.stats.as_ref().map(|s| f(s, v.block_size) as f64),
        }
    }
}

fn write_amplification(v: &VolumeMetrics) -> f64 {
    let written = v.io.op(IoOp::Write).bytes;
    match &v.stats {
        Some(s) if written > 0 => s.bytes_uploaded as f64 / written as f64,
        _ => 0.0,
    }
}

fn flag(b: bool) -> f64 {
    f64::from(u8::from(b))
}

fn load(n: &AtomicU64) -> f64 {
    n.load(Ordering::Relaxed) as f64
}

/// The families with one sample per volume (label `volume`): name, type, help, value.
#[rustfmt::skip] // one family per three lines
const PER_VOLUME: [(&str, &str, &str, Value); 29] = [
    ("glidefs_volume_up", "gauge",
        "1 when the volume is open, 0 when it is recovering or failed to open.",
        Value::Volume(|v| flag(v.stats.is_some()))),
    ("glidefs_volume_recovering", "gauge",
        "1 while the volume is re-opened in the background (the object store did not answer).",
        Value::Volume(|v| flag(v.recovering))),
    ("glidefs_volume_fenced", "gauge",
        "1 when another writer fenced the volume.",
        Value::Volume(|v| flag(v.fenced))),
    ("glidefs_volume_dirty_bytes", "gauge",
        "Bytes written locally and not yet being flushed.",
        Value::Stats(|s, bs| s.cache.dirty * bs)),
    ("glidefs_volume_syncing_bytes", "gauge",
        "Bytes being flushed to the store.",
        Value::Stats(|s, bs| s.cache.syncing * bs)),
    ("glidefs_volume_cache_bytes", "gauge",
        "Bytes of the volume held on local disk.",
        Value::Stats(|s, bs| (s.cache.clean + s.cache.dirty + s.cache.syncing) * bs)),
    ("glidefs_volume_manifest_generation", "gauge",
        "Latest manifest generation loaded or published.",
        Value::Stats(|s, _| s.manifest_generation)),
    ("glidefs_volume_blocks_fetched_total", "counter",
        "Blocks fetched from the object store.",
        Value::Stats(|s, _| s.blocks_fetched)),
    ("glidefs_volume_read_cache_hits_total", "counter",
        "READ requests served entirely from the local cache.",
        Value::Device(|io| io.op(IoOp::Read).count.saturating_sub(io.cold_reads))),
    ("glidefs_volume_read_cache_misses_total", "counter",
        "READ requests that needed blocks from the object store.",
        Value::Device(|io| io.cold_reads)),
    ("glidefs_volume_cold_read_bytes_total", "counter",
        "Bytes of READ requests that were not local when they arrived.",
        Value::Device(|io| io.cold_read_bytes)),
    ("glidefs_volume_io_inline_total", "counter",
        "Requests served on the fast path (on the queue thread, or after a QoS wait).",
        Value::Device(|io| io.inline)),
    ("glidefs_volume_io_deferred_total", "counter",
        "Requests (or FUA durability steps) deferred to the async runtime.",
        Value::Device(|io| io.deferred)),
    ("glidefs_volume_fua_writes_total", "counter",
        "FUA writes made durable before completion.",
        Value::Device(|io| io.fua_writes)),
    ("glidefs_volume_throttled_total", "counter",
        "READ and WRITE requests that waited for the volume's QoS limits.",
        Value::Device(|io| io.throttled)),
    ("glidefs_volume_throttled_seconds_total", "counter",
        "Seconds those requests waited, summed.",
        Value::DeviceNanos(|io| io.throttled_ns)),
    ("glidefs_volume_fetches_coalesced_total", "counter",
        "Fetches that joined one already in flight.",
        Value::Stats(|s, _| s.fetches_coalesced)),
    ("glidefs_volume_readahead_total", "counter",
        "Readahead fetches started.",
        Value::Stats(|s, _| s.readahead_started)),
    ("glidefs_volume_packs_uploaded_total", "counter",
        "Packs uploaded to the store.",
        Value::Stats(|s, _| s.packs_uploaded)),
    ("glidefs_volume_stored_bytes", "gauge",
        "Bytes of the volume's pack objects in the store (last compaction or GC pass, plus uploads since).",
        Value::Stats(|s, _| s.stored_bytes)),
    ("glidefs_volume_live_bytes", "gauge",
        "Bytes of the blocks the latest manifest maps (compressed frames).",
        Value::Stats(|s, _| s.live_bytes)),
    ("glidefs_volume_uploaded_bytes_total", "counter",
        "Bytes uploaded to the store (flushes and compaction).",
        Value::Stats(|s, _| s.bytes_uploaded)),
    ("glidefs_volume_compacted_bytes_total", "counter",
        "Live bytes copied by compaction passes that published.",
        Value::Stats(|s, _| s.bytes_compacted)),
    ("glidefs_volume_write_amplification", "gauge",
        "Bytes uploaded per byte the guest wrote through the device (0 before any write).",
        Value::Volume(write_amplification)),
    ("glidefs_volume_flushes_total", "counter",
        "Successful flushes to the object store.",
        Value::Volume(|v| load(&v.flush.count))),
    ("glidefs_volume_flush_bytes_total", "counter",
        "Bytes uploaded by flushes.",
        Value::Volume(|v| load(&v.flush.bytes))),
    ("glidefs_volume_flush_errors_total", "counter",
        "Failed flushes.",
        Value::Volume(|v| load(&v.flush.errors))),
    ("glidefs_volume_flush_duration_seconds_total", "counter",
        "Time spent in successful flushes.",
        Value::Volume(|v| load(&v.flush.duration_us) / 1e6)),
    ("glidefs_volume_flush_lag_seconds", "gauge",
        "Age of the oldest data not yet in the object store.",
        Value::Volume(|v| v.flush.lag().as_secs_f64())),
];

/// Renders everything.
pub(crate) fn render(vols: &[VolumeMetrics], api: &ApiCounters) -> String {
    let mut out = String::with_capacity(4096 + vols.len() * 4096);
    io_families(&mut out, vols);
    for (name, kind, help, value) in PER_VOLUME {
        header(&mut out, name, kind, help);
        for v in vols {
            if let Some(x) = value.of(v) {
                let _ = writeln!(out, "{name}{{volume=\"{}\"}} {x}", label(&v.name));
            }
        }
    }

    let _ = writeln!(out, "# HELP glidefs_volumes Volumes registered.\n# TYPE glidefs_volumes gauge\nglidefs_volumes {}", vols.len());
    let _ = writeln!(out, "# HELP glidefs_api_requests_total API requests served.\n# TYPE glidefs_api_requests_total counter\nglidefs_api_requests_total {}", api.requests.load(Ordering::Relaxed));
    let _ = writeln!(out, "# HELP glidefs_api_errors_total API error responses by code.\n# TYPE glidefs_api_errors_total counter");
    for (code, n) in api.errors.lock().iter() {
        let _ = writeln!(out, "glidefs_api_errors_total{{code=\"{code}\"}} {n}");
    }
    type Pick = fn(&ConnCounters) -> &AtomicU64;
    let conns: [(&str, &str, &str, Pick); 3] = [
        (
            "glidefs_api_connections",
            "gauge",
            "Open API connections by listener.",
            |c| &c.open,
        ),
        (
            "glidefs_api_connections_refused_total",
            "counter",
            "API connections closed at once because the listener was at api.max_connections.",
            |c| &c.refused,
        ),
        (
            "glidefs_api_connections_timed_out_total",
            "counter",
            "API connections closed by the header-read or idle timeout.",
            |c| &c.timed_out,
        ),
    ];
    for (name, kind, help, pick) in conns {
        header(&mut out, name, kind, help);
        for (listener, c) in [("unix", &api.unix), ("tcp", &api.tcp)] {
            let n = pick(c).load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}{{listener=\"{listener}\"}} {n}");
        }
    }
    out
}

fn io_families(out: &mut String, vols: &[VolumeMetrics]) {
    type Pick = fn(&glidefs_ublk::io_stats::OpStats) -> u64;
    let counters: [(&str, &str, Pick); 3] = [
        (
            "glidefs_volume_io_requests_total",
            "Block requests completed.",
            |o| o.count,
        ),
        (
            "glidefs_volume_io_bytes_total",
            "Bytes moved by successful block requests.",
            |o| o.bytes,
        ),
        (
            "glidefs_volume_io_errors_total",
            "Block requests completed with an error.",
            |o| o.errors,
        ),
    ];
    for (name, help, pick) in counters {
        header(out, name, "counter", help);
        for v in vols {
            for op in IO_OPS {
                let _ = writeln!(
                    out,
                    "{name}{{volume=\"{}\",op=\"{}\"}} {}",
                    label(&v.name),
                    op_name(op),
                    pick(v.io.op(op))
                );
            }
        }
    }
    let name = "glidefs_volume_io_latency_seconds";
    header(out, name, "histogram", "Block request latency.");
    for v in vols {
        for op in IO_OPS {
            let s = v.io.op(op);
            let labels = format!("volume=\"{}\",op=\"{}\"", label(&v.name), op_name(op));
            let mut cumulative = 0;
            // Log2 buckets hold [2^(i-1), 2^i) µs: the bound of bucket i is 2^i µs, which
            // Prometheus reads as `le` (a request of exactly 2^i µs counts one bucket up).
            for (i, n) in s
                .latency_buckets
                .iter()
                .enumerate()
                .take(LATENCY_BUCKETS - 1)
            {
                cumulative += n;
                let bound = bucket_upper_bound_us(i).unwrap_or(u64::MAX);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{{labels},le=\"{}\"}} {cumulative}",
                    bound as f64 / 1e6
                );
            }
            let total: u64 = s.latency_buckets.iter().sum();
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {total}");
            let _ = writeln!(
                out,
                "{name}_sum{{{labels}}} {}",
                s.latency_sum_us as f64 / 1e6
            );
            let _ = writeln!(out, "{name}_count{{{labels}}} {total}");
        }
    }
}
