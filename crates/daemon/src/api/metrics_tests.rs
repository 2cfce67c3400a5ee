//! Tests of `/metrics`: figures land where they belong, and the whole output is valid
//! Prometheus text exposition (0.0.4), checked by [`check_exposition`] (what `promtool check
//! metrics` checks of the format, without needing Prometheus installed).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use glidefs_volume::VolumeStats;
use ublk_core::IoOp;

use super::metrics::{render, ApiCounters};
use crate::manager::VolumeMetrics;
use glidefs_ublk::io_stats::IoRecorder;

fn volume(name: &str, stats: Option<VolumeStats>) -> VolumeMetrics {
    let r = IoRecorder::default();
    r.record(IoOp::Write, 4096, 4096, Duration::from_micros(30));
    r.record(IoOp::Write, 4096, 4096, Duration::from_millis(2));
    r.record(IoOp::Read, 8192, 8192, Duration::from_micros(70));
    VolumeMetrics {
        name: name.into(),
        io: r.snapshot(),
        recovering: stats.is_none(),
        stats,
        block_size: 4096,
        fenced: false,
        flush: Arc::default(),
    }
}

fn open_stats() -> VolumeStats {
    let mut s = VolumeStats::default();
    s.cache.dirty = 3;
    s.cache.clean = 5;
    s.manifest_generation = 7;
    s.blocks_fetched = 11;
    s
}

#[test]
fn histogram_is_cumulative_and_errors_are_by_code() {
    let vols = vec![volume("v1", None)];
    let api = ApiCounters::default();
    api.error("not_found");
    api.error("not_found");
    let text = render(&vols, &api);
    let has = |line: &str| assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    has(r#"glidefs_volume_io_latency_seconds_bucket{volume="v1",op="write",le="0.000032"} 1"#);
    has(r#"glidefs_volume_io_latency_seconds_bucket{volume="v1",op="write",le="0.004096"} 2"#);
    has(r#"glidefs_volume_io_latency_seconds_count{volume="v1",op="write"} 2"#);
    has(r#"glidefs_volume_io_bytes_total{volume="v1",op="write"} 8192"#);
    has(r#"glidefs_volume_up{volume="v1"} 0"#);
    has(r#"glidefs_volume_recovering{volume="v1"} 1"#);
    has(r#"glidefs_api_errors_total{code="not_found"} 2"#);
    // A volume that is not open has no engine figures.
    assert!(!text.contains("glidefs_volume_dirty_bytes{"), "{text}");
}

#[test]
fn open_volume_figures_come_from_the_engine_and_the_device() {
    let v = volume("v2", Some(open_stats()));
    v.flush.count.store(2, Ordering::Relaxed);
    v.flush.duration_us.store(1_500_000, Ordering::Relaxed);
    let text = render(&[v], &ApiCounters::default());
    for line in [
        r#"glidefs_volume_up{volume="v2"} 1"#,
        r#"glidefs_volume_dirty_bytes{volume="v2"} 12288"#,
        r#"glidefs_volume_cache_bytes{volume="v2"} 32768"#,
        r#"glidefs_volume_manifest_generation{volume="v2"} 7"#,
        r#"glidefs_volume_blocks_fetched_total{volume="v2"} 11"#,
        r#"glidefs_volume_read_cache_hits_total{volume="v2"} 1"#,
        r#"glidefs_volume_flushes_total{volume="v2"} 2"#,
        r#"glidefs_volume_flush_duration_seconds_total{volume="v2"} 1.5"#,
        r#"glidefs_api_connections{listener="tcp"} 0"#,
    ] {
        assert!(text.lines().any(|l| l == line), "no `{line}` in\n{text}");
    }
}

#[test]
fn output_is_valid_text_exposition() {
    // One open volume, one recovering, a name that needs escaping, errors by code.
    let vols = vec![
        volume("a", Some(open_stats())),
        volume("b", None),
        volume("q\"b\\s\nn", Some(VolumeStats::default())),
    ];
    let api = ApiCounters::default();
    api.error("not_found");
    api.error("internal");
    let text = render(&vols, &api);
    let families = check_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    // Every family is there (update when adding one): empty output would pass vacuously.
    assert_eq!(families.len(), 39, "{families:?}");
    assert_eq!(
        families["glidefs_volume_throttled_seconds_total"],
        "counter"
    );
    assert_eq!(families["glidefs_volume_stored_bytes"], "gauge");
    assert_eq!(families["glidefs_volume_compacted_bytes_total"], "counter");
    assert_eq!(families["glidefs_volume_io_latency_seconds"], "histogram");
    assert_eq!(families["glidefs_volume_up"], "gauge");
    assert_eq!(families["glidefs_volume_flushes_total"], "counter");
}

/// Checks `text` as Prometheus text exposition format 0.0.4 and returns each family's type:
/// every sample belongs to a family whose `# HELP` and `# TYPE` precede it, each family
/// appears once (its lines together), names and labels are well-formed, values are numbers,
/// counters end in `_total`, histogram buckets carry `le` and end at `+Inf`.
fn check_exposition(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut types = BTreeMap::new();
    let mut helped = BTreeSet::new();
    let mut done = BTreeSet::new();
    let mut current: Option<String> = None;
    let mut last_le = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let err = |what: &str| format!("line {}: {what}: `{line}`", n + 1);
        let family = if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap_or_default();
            if !helped.insert(name.to_string()) {
                return Err(err("second HELP"));
            }
            name.to_string()
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| err("TYPE without type"))?;
            if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                return Err(err("unknown type"));
            }
            if kind == "counter" && !name.ends_with("_total") {
                return Err(err("counter name without _total"));
            }
            if types.insert(name.to_string(), kind.to_string()).is_some() {
                return Err(err("second TYPE"));
            }
            if !helped.contains(name) {
                return Err(err("TYPE before HELP"));
            }
            name.to_string()
        } else if line.starts_with('#') || line.is_empty() {
            return Err(err("stray comment or blank line"));
        } else {
            let (name, labels, value) = sample(line).ok_or_else(|| err("bad sample"))?;
            value
                .parse::<f64>()
                .map_err(|_| err("value is not a number"))?;
            let family = family_of(name, &types).ok_or_else(|| err("sample before its TYPE"))?;
            if types[&family] == "histogram" && name.ends_with("_bucket") {
                let le = labels.get("le").ok_or_else(|| err("bucket without le"))?;
                le.parse::<f64>().map_err(|_| err("le is not a number"))?;
                let series: Vec<_> = labels.iter().filter(|(k, _)| *k != "le").collect();
                last_le.insert(format!("{family}{series:?}"), le.clone());
            }
            family
        };
        if current.as_ref() != Some(&family) {
            if let Some(prev) = current.replace(family.clone()) {
                done.insert(prev);
            }
            if done.contains(&family) {
                return Err(err("family repeated"));
            }
        }
    }
    match last_le.iter().find(|(_, le)| *le != "+Inf") {
        Some((series, le)) => Err(format!("histogram {series} ends at le={le}, not +Inf")),
        None => Ok(types),
    }
}

/// The family a sample name belongs to, given the types seen so far.
fn family_of(name: &str, types: &BTreeMap<String, String>) -> Option<String> {
    if types.contains_key(name) {
        return Some(name.to_string());
    }
    ["_bucket", "_sum", "_count"]
        .iter()
        .filter_map(|s| name.strip_suffix(s))
        .find(|base| types.get(*base).is_some_and(|t| t == "histogram"))
        .map(str::to_string)
}

fn is_name(s: &str, colon: bool) -> bool {
    let ok = |c: char| c.is_ascii_alphabetic() || c == '_' || (colon && c == ':');
    let mut chars = s.chars();
    chars.next().is_some_and(ok) && chars.all(|c| ok(c) || c.is_ascii_digit())
}

/// Splits `name{l="v",...} value` (labels optional, no timestamp) into its parts.
fn sample(line: &str) -> Option<(&str, BTreeMap<String, String>, &str)> {
    let end = line.find(['{', ' '])?;
    let name = &line[..end];
    let mut labels = BTreeMap::new();
    let mut rest = &line[end..];
    if let Some(mut body) = rest.strip_prefix('{') {
        loop {
            let (key, after) = body.split_once("=\"")?;
            let mut value = String::new();
            let mut chars = after.char_indices();
            let close = loop {
                match chars.next()? {
                    (i, '"') => break i,
                    (_, '\\') => value.push(match chars.next()?.1 {
                        'n' => '\n',
                        c @ ('\\' | '"') => c,
                        _ => return None,
                    }),
                    (_, c) => value.push(c),
                }
            };
            if !is_name(key, false) || labels.insert(key.to_string(), value).is_some() {
                return None;
            }
            body = &after[close + 1..];
            if let Some(r) = body.strip_prefix('}') {
                rest = r;
                break;
            }
            body = body.strip_prefix(',')?;
        }
    }
    let value = rest.strip_prefix(' ')?;
    (is_name(name, true) && !value.is_empty() && !value.contains(' '))
        .then_some((name, labels, value))
}

#[test]
fn the_checker_catches_what_it_claims_to() {
    let head = "# HELP x_total X.\n# TYPE x_total counter\n";
    assert!(check_exposition(&format!("{head}x_total{{a=\"1\"}} 2\n")).is_ok());
    for bad in [
        "x_total 1\n".to_string(),                // no HELP/TYPE
        format!("{head}x_total{{a=\"1}} 2\n"),    // unclosed label
        format!("{head}x_total{{1a=\"1\"}} 2\n"), // bad label name
        format!("{head}x_total two\n"),           // not a number
        format!("{head}x_total 1\n# HELP y Y.\n# TYPE y gauge\ny 1\nx_total 2\n"), // repeated
        "# HELP x X.\n# TYPE x counter\nx 1\n".to_string(), // counter without _total
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\n".to_string(), // no +Inf
    ] {
        assert!(check_exposition(&bad).is_err(), "accepted:\n{bad}");
    }
}
