//! QoS limits on the command line: the flags of `volume create` and `volume qos`
//! ([`QosArgs`]), and their text.
//!
//! Each flag is one token bucket: `RATE` or `RATE:BURST`, requests per second for the
//! `*-iops` flags, bytes per second with K/M/G/T suffixes for the `*-bps` flags (`50M:200M`:
//! 50 MiB/s, bursts of up to 200 MiB). A burst left out is the daemon's default (a tenth of
//! a second at the rate).

use clap::Args;
use glidefs_model::api::{QosLimit, QosLimits};
use glidefs_model::size::{format_size, parse_size};

/// The QoS flags (see the module docs).
#[derive(Debug, Clone, Default, Args)]
pub struct QosArgs {
    /// Limit READ requests per second: RATE[:BURST].
    #[arg(long, value_name = "RATE[:BURST]", value_parser = parse_iops_limit)]
    pub read_iops: Option<QosLimit>,
    /// Limit WRITE requests per second: RATE[:BURST].
    #[arg(long, value_name = "RATE[:BURST]", value_parser = parse_iops_limit)]
    pub write_iops: Option<QosLimit>,
    /// Limit READ and WRITE requests per second together: RATE[:BURST].
    #[arg(long, value_name = "RATE[:BURST]", value_parser = parse_iops_limit)]
    pub iops: Option<QosLimit>,
    /// Limit bytes read per second: SIZE[:BURST] (e.g. 100M:200M).
    #[arg(long, value_name = "SIZE[:BURST]", value_parser = parse_bytes_limit)]
    pub read_bps: Option<QosLimit>,
    /// Limit bytes written per second: SIZE[:BURST].
    #[arg(long, value_name = "SIZE[:BURST]", value_parser = parse_bytes_limit)]
    pub write_bps: Option<QosLimit>,
    /// Limit bytes read and written per second together: SIZE[:BURST].
    #[arg(long, value_name = "SIZE[:BURST]", value_parser = parse_bytes_limit)]
    pub bps: Option<QosLimit>,
}

impl QosArgs {
    /// The limits the flags give (empty: none given).
    pub fn limits(&self) -> QosLimits {
        QosLimits {
            read_iops: self.read_iops,
            write_iops: self.write_iops,
            iops: self.iops,
            read_bytes: self.read_bps,
            write_bytes: self.write_bps,
            bytes: self.bps,
        }
    }
}

/// `RATE[:BURST]`, each parsed by `one`.
fn parse_limit(value: &str, one: fn(&str) -> Result<u64, String>) -> Result<QosLimit, String> {
    let (rate, burst) = match value.split_once(':') {
        Some((r, b)) => (r, Some(b)),
        None => (value, None),
    };
    let rate = one(rate)?;
    if rate == 0 {
        return Err("the rate must be at least 1 (leave the flag out for no limit)".into());
    }
    let burst = burst.map(one).transpose()?;
    if burst == Some(0) {
        return Err("the burst must be at least 1".into());
    }
    Ok(QosLimit { rate, burst })
}

fn parse_iops_limit(value: &str) -> Result<QosLimit, String> {
    parse_limit(value, |s| {
        s.parse::<u64>()
            .map_err(|_| format!("`{s}` is not a whole number of requests"))
    })
}

fn parse_bytes_limit(value: &str) -> Result<QosLimit, String> {
    parse_limit(value, |s| parse_size(s).map_err(|e| e.to_string()))
}

/// The limits, one line each (`none` without any).
pub fn qos_text(limits: &QosLimits) -> String {
    if limits.is_empty() {
        return "qos:                 none\n".to_string();
    }
    let mut s = String::new();
    for (name, limit) in limits.named() {
        let Some(l) = limit else { continue };
        let burst = l.burst_or_default();
        let line = if name.ends_with("bytes") {
            format!("{}/s, burst {}", format_size(l.rate), format_size(burst))
        } else {
            format!("{}/s, burst {burst}", l.rate)
        };
        s.push_str(&format!("qos {name:<16} {line}\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::args::{Cli, Command, VolumeCommand};
    use clap::Parser;

    #[test]
    fn flags_parse_rates_and_bursts() {
        let cli = Cli::try_parse_from([
            "glidefs",
            "volume",
            "qos",
            "db",
            "--write-bps",
            "50M:200M",
            "--read-iops",
            "1000",
        ])
        .unwrap();
        let Command::Volume(v) = cli.command else {
            panic!("not a volume command");
        };
        let VolumeCommand::Qos {
            name,
            limits,
            clear,
        } = v.command
        else {
            panic!("{:?}", v.command);
        };
        assert_eq!(name, "db");
        assert!(!clear);
        let l = limits.limits();
        assert_eq!(
            l.write_bytes,
            Some(QosLimit {
                rate: 50 << 20,
                burst: Some(200 << 20)
            })
        );
        assert_eq!(
            l.read_iops,
            Some(QosLimit {
                rate: 1000,
                burst: None
            })
        );
        assert_eq!(l.bytes, None);
        for bad in [
            &["glidefs", "volume", "qos", "db", "--iops", "0"][..],
            &["glidefs", "volume", "qos", "db", "--iops", "10:0"][..],
            &["glidefs", "volume", "qos", "db", "--iops", "1k"][..],
            &["glidefs", "volume", "qos", "db", "--bps", "5Q"][..],
            &["glidefs", "volume", "qos", "db", "--clear", "--bps", "5M"][..],
        ] {
            assert!(Cli::try_parse_from(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn text_names_each_limit_with_its_burst() {
        let t = qos_text(&QosLimits {
            write_bytes: Some(QosLimit {
                rate: 50 << 20,
                burst: None,
            }),
            iops: Some(QosLimit {
                rate: 500,
                burst: Some(900),
            }),
            ..QosLimits::default()
        });
        assert!(t.contains("iops") && t.contains("500/s, burst 900"), "{t}");
        assert!(
            t.contains("write_bytes") && t.contains("50M/s, burst 5M"),
            "{t}"
        );
        assert_eq!(
            qos_text(&QosLimits::default()),
            "qos:                 none\n"
        );
    }
}
