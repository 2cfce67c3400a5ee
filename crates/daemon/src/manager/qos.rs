//! A volume's QoS limits: checked ([`check`]) at create and at every change, kept in its
//! `state.json` entry, and changed live ([`VolumeManager::set_qos`]).
//!
//! The limits themselves (token buckets on the device's READ and WRITE requests) are the
//! ublk target's (`glidefs_ublk::qos`); the manager only checks them, records them and hands
//! them to the volume's device: at attach (`ExportSpec::qos`) and, when they change, through
//! `Export::set_qos`, which takes effect from the device's next request.
//!
//! A change, under the admin lock (serialised with create, remove, resize, shutdown):
//! 1. check the limits (bursts left out are filled in with their defaults);
//! 2. the volume must be open here: a volume still recovering (or failed) is refused with
//!    the error that says why, as a resize is (its entry is replaced in step 3, which would
//!    orphan a re-open attempt running on the old entry);
//! 3. record them in `state.json` (the entry is replaced by one with the new spec; a failed
//!    write puts the old entry back and changes nothing);
//! 4. hand them to the device when the volume has one.

use glidefs_model::api::{QosLimit, QosLimits};

use crate::manager::error::ManagerError;
use crate::manager::spec::VolumeSpec;
use crate::manager::VolumeManager;

/// The largest rate: 2^40 tokens per second (about 1.1 TB/s, or 10^12 requests/s).
pub(crate) const MAX_RATE: u64 = 1 << 40;
/// The largest burst, in seconds at the rate.
pub(crate) const MAX_BURST_SECS: u64 = 3_600;

/// `limits` checked, with every burst filled in: each rate in `1..=MAX_RATE`, each burst in
/// `1..=rate * MAX_BURST_SECS`.
pub(crate) fn check(limits: &QosLimits) -> Result<QosLimits, ManagerError> {
    let one = |field: &'static str, l: Option<QosLimit>| -> Result<_, ManagerError> {
        let Some(l) = l else { return Ok(None) };
        let bad = |reason: String| ManagerError::InvalidQos { field, reason };
        if l.rate == 0 || l.rate > MAX_RATE {
            return Err(bad(format!(
                "rate {} must be in 1..={MAX_RATE} per second (leave the limit out for none)",
                l.rate
            )));
        }
        let burst = l.burst_or_default();
        let max_burst = l.rate.saturating_mul(MAX_BURST_SECS);
        if burst == 0 || burst > max_burst {
            return Err(bad(format!(
                "burst {burst} must be in 1..={max_burst} ({MAX_BURST_SECS} s at the rate {})",
                l.rate
            )));
        }
        Ok(Some(QosLimit {
            rate: l.rate,
            burst: Some(burst),
        }))
    };
    Ok(QosLimits {
        read_iops: one("read_iops", limits.read_iops)?,
        write_iops: one("write_iops", limits.write_iops)?,
        iops: one("iops", limits.iops)?,
        read_bytes: one("read_bytes", limits.read_bytes)?,
        write_bytes: one("write_bytes", limits.write_bytes)?,
        bytes: one("bytes", limits.bytes)?,
    })
}

impl VolumeManager {
    /// Replaces the QoS limits of volume `name` (all of them: a bucket left out is no
    /// limit); the limits in force after the call. See the module docs.
    pub async fn set_qos(&self, name: &str, limits: &QosLimits) -> Result<QosLimits, ManagerError> {
        let limits = check(limits)?;
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let entry = self.entry(name)?;
        let open = entry.open()?;
        let old_spec = entry.spec.clone();
        if old_spec.qos != limits {
            let changed = self.replace_spec(
                &entry,
                VolumeSpec {
                    qos: limits,
                    ..old_spec.clone()
                },
            );
            if let Err(e) = self.persist().await {
                self.replace_spec(&changed, old_spec);
                return Err(e);
            }
        }
        // Also when state.json had them already: the device gets them in any case.
        if let Some(dev) = open.device.lock().as_ref() {
            dev.set_qos(&limits);
        }
        drop(admin);
        tracing::info!(volume = %name, qos = ?limits, "QoS limits set");
        Ok(limits)
    }

    /// The QoS limits recorded for volume `name` (bursts filled in; empty: none).
    pub fn qos(&self, name: &str) -> Result<QosLimits, ManagerError> {
        Ok(self.entry(name)?.spec.qos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(rate: u64, burst: Option<u64>) -> Option<QosLimit> {
        Some(QosLimit { rate, burst })
    }

    #[test]
    fn limits_are_checked_and_bursts_filled_in() {
        let ok = check(&QosLimits {
            write_bytes: limit(50 << 20, None),
            read_iops: limit(1_000, Some(5_000)),
            ..QosLimits::default()
        })
        .unwrap();
        assert_eq!(ok.write_bytes, limit(50 << 20, Some(5 << 20)));
        assert_eq!(ok.read_iops, limit(1_000, Some(5_000)));
        assert_eq!(ok.iops, None);
        assert_eq!(check(&QosLimits::default()).unwrap(), QosLimits::default());
        for (bad, field, says) in [
            (
                QosLimits {
                    iops: limit(0, None),
                    ..QosLimits::default()
                },
                "iops",
                "rate 0",
            ),
            (
                QosLimits {
                    bytes: limit(MAX_RATE + 1, None),
                    ..QosLimits::default()
                },
                "bytes",
                "rate 1099511627777",
            ),
            (
                QosLimits {
                    read_bytes: limit(100, Some(0)),
                    ..QosLimits::default()
                },
                "read_bytes",
                "burst 0",
            ),
            (
                QosLimits {
                    write_iops: limit(10, Some(36_001)),
                    ..QosLimits::default()
                },
                "write_iops",
                "burst 36001 must be in 1..=36000",
            ),
        ] {
            let e = check(&bad).unwrap_err();
            assert_eq!(e.code(), "invalid_qos");
            let m = e.to_string();
            assert!(m.contains(field) && m.contains(says), "{m}");
        }
    }
}
