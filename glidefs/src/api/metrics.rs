//! `GET /metrics`: Prometheus text exposition (format 0.0.4), written by hand.
//!
//! Per volume (label `volume`): I/O requests, bytes, errors and latency histograms per `op`
//! (from the device's [`IoStats`](crate::io_stats::IoStats)); dirty / syncing / cached bytes;
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

use crate::io_stats::{bucket_upper_bound_us, op_name, IO_OPS, LATENCY_BUCKETS};
use crate::manager::VolumeMetrics;

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

/// Writes one family with one sample per volume.
fn per_volume(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    vols: &[VolumeMetrics],
    value: impl Fn(&VolumeMetrics) -> Option<f64>,
) {
    header(out, name, kind, help);
    for v in vols {
        if let Some(x) = value(v) {
            let _ = writeln!(out, "{name}{{volume=\"{}\"}} {x}", label(&v.name));
        }
    }
}

/// Renders everything.
pub fn render(vols: &[VolumeMetrics], api: &ApiCounters) -> String {
    let mut out = String::with_capacity(4096 + vols.len() * 4096);
    io_families(&mut out, vols);
    let stat = |f: fn(&glidefs_volume::VolumeStats, u64) -> u64| {
        move |v: &VolumeMetrics| v.stats.as_ref().map(|s| f(s, v.block_size) as f64)
    };
    let o = &mut out;
    per_volume(
        o,
        "glidefs_volume_up",
        "gauge",
        "1 when the volume is open, 0 when it is recovering or failed to open.",
        vols,
        |v| Some(if v.stats.is_some() { 1.0 } else { 0.0 }),
    );
    per_volume(
        o,
        "glidefs_volume_recovering",
        "gauge",
        "1 while the volume is re-opened in the background (the object store did not answer).",
        vols,
        |v| Some(if v.recovering { 1.0 } else { 0.0 }),
    );
    per_volume(
        o,
        "glidefs_volume_fenced",
        "gauge",
        "1 when another writer fenced the volume.",
        vols,
        |v| Some(if v.fenced { 1.0 } else { 0.0 }),
    );
    per_volume(
        o,
        "glidefs_volume_dirty_bytes",
        "gauge",
        "Bytes written locally and not yet being flushed.",
        vols,
        stat(|s, bs| s.cache.dirty * bs),
    );
    per_volume(
        o,
        "glidefs_volume_syncing_bytes",
        "gauge",
        "Bytes being flushed to the store.",
        vols,
        stat(|s, bs| s.cache.syncing * bs),
    );
    per_volume(
        o,
        "glidefs_volume_cache_bytes",
        "gauge",
        "Bytes of the volume held on local disk.",
        vols,
        stat(|s, bs| (s.cache.clean + s.cache.dirty + s.cache.syncing) * bs),
    );
    per_volume(
        o,
        "glidefs_volume_manifest_generation",
        "gauge",
        "Latest manifest generation loaded or published.",
        vols,
        stat(|s, _| s.manifest_generation),
    );
    per_volume(
        o,
        "glidefs_volume_blocks_fetched_total",
        "counter",
        "Blocks fetched from the object store.",
        vols,
        stat(|s, _| s.blocks_fetched),
    );
    let dev =
        |f: fn(&crate::io_stats::IoStats) -> u64| move |v: &VolumeMetrics| Some(f(&v.io) as f64);
    per_volume(
        o,
        "glidefs_volume_read_cache_hits_total",
        "counter",
        "READ requests served entirely from the local cache.",
        vols,
        dev(|io| {
            io.op(ublk_core::IoOp::Read)
                .count
                .saturating_sub(io.cold_reads)
        }),
    );
    per_volume(
        o,
        "glidefs_volume_read_cache_misses_total",
        "counter",
        "READ requests that needed blocks from the object store.",
        vols,
        dev(|io| io.cold_reads),
    );
    per_volume(
        o,
        "glidefs_volume_cold_read_bytes_total",
        "counter",
        "Bytes of READ requests that were not local when they arrived.",
        vols,
        dev(|io| io.cold_read_bytes),
    );
    per_volume(
        o,
        "glidefs_volume_io_inline_total",
        "counter",
        "Requests answered on the queue thread (inline fast path).",
        vols,
        dev(|io| io.inline),
    );
    per_volume(
        o,
        "glidefs_volume_io_deferred_total",
        "counter",
        "Requests (or FUA durability steps) deferred to the async runtime.",
        vols,
        dev(|io| io.deferred),
    );
    per_volume(
        o,
        "glidefs_volume_fua_writes_total",
        "counter",
        "FUA writes made durable before completion.",
        vols,
        dev(|io| io.fua_writes),
    );
    per_volume(
        o,
        "glidefs_volume_fetches_coalesced_total",
        "counter",
        "Fetches that joined one already in flight.",
        vols,
        stat(|s, _| s.fetches_coalesced),
    );
    per_volume(
        o,
        "glidefs_volume_readahead_total",
        "counter",
        "Readahead fetches started.",
        vols,
        stat(|s, _| s.readahead_started),
    );
    per_volume(
        o,
        "glidefs_volume_packs_uploaded_total",
        "counter",
        "Packs uploaded to the store.",
        vols,
        stat(|s, _| s.packs_uploaded),
    );
    per_volume(
        o,
        "glidefs_volume_flushes_total",
        "counter",
        "Successful flushes to the object store.",
        vols,
        |v| Some(v.flush.count.load(Ordering::Relaxed) as f64),
    );
    per_volume(
        o,
        "glidefs_volume_flush_bytes_total",
        "counter",
        "Bytes uploaded by flushes.",
        vols,
        |v| Some(v.flush.bytes.load(Ordering::Relaxed) as f64),
    );
    per_volume(
        o,
        "glidefs_volume_flush_errors_total",
        "counter",
        "Failed flushes.",
        vols,
        |v| Some(v.flush.errors.load(Ordering::Relaxed) as f64),
    );
    per_volume(
        o,
        "glidefs_volume_flush_duration_seconds_total",
        "counter",
        "Time spent in successful flushes.",
        vols,
        |v| Some(v.flush.duration_us.load(Ordering::Relaxed) as f64 / 1e6),
    );
    per_volume(
        o,
        "glidefs_volume_flush_lag_seconds",
        "gauge",
        "Age of the oldest data not yet in the object store.",
        vols,
        |v| Some(v.flush.lag().as_secs_f64()),
    );

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
    type Pick = fn(&crate::io_stats::OpStats) -> u64;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io_stats::IoRecorder;
    use std::sync::Arc;
    use std::time::Duration;
    use ublk_core::IoOp;

    #[test]
    fn histogram_is_cumulative_and_errors_are_by_code() {
        let r = IoRecorder::default();
        r.record(IoOp::Write, 4096, 4096, Duration::from_micros(30));
        r.record(IoOp::Write, 4096, 4096, Duration::from_millis(2));
        let vols = vec![VolumeMetrics {
            name: "v1".into(),
            io: r.snapshot(),
            stats: None,
            recovering: true,
            block_size: 4096,
            fenced: false,
            flush: Arc::default(),
        }];
        let api = ApiCounters::default();
        api.error("not_found");
        api.error("not_found");
        let text = render(&vols, &api);
        assert!(text.contains("glidefs_volume_io_latency_seconds_bucket{volume=\"v1\",op=\"write\",le=\"0.000032\"} 1"), "{text}");
        assert!(text.contains(
            "glidefs_volume_io_latency_seconds_bucket{volume=\"v1\",op=\"write\",le=\"0.004096\"} 2"
        ));
        assert!(
            text.contains("glidefs_volume_io_latency_seconds_count{volume=\"v1\",op=\"write\"} 2")
        );
        assert!(text.contains("glidefs_volume_io_bytes_total{volume=\"v1\",op=\"write\"} 8192"));
        assert!(text.contains("glidefs_volume_up{volume=\"v1\"} 0"));
        assert!(text.contains("glidefs_volume_recovering{volume=\"v1\"} 1"));
        assert!(text.contains("glidefs_api_errors_total{code=\"not_found\"} 2"));
    }
}
