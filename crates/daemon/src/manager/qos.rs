//! A volume's QoS limits: checked (`spec::check_qos`) at create and at every change, kept in its
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

use glidefs_model::api::QosLimits;

use crate::manager::error::ManagerError;
use crate::manager::spec::{check_qos, VolumeSpec};
use crate::manager::VolumeManager;

impl VolumeManager {
    /// Replaces the QoS limits of volume `name` (all of them: a bucket left out is no
    /// limit); the limits in force after the call. See the module docs.
    pub async fn set_qos(&self, name: &str, limits: &QosLimits) -> Result<QosLimits, ManagerError> {
        let limits = check_qos(limits)?;
        let admin = self.admin.lock().await;
        if *admin {
            return Err(ManagerError::ShuttingDown);
        }
        let entry = self.entry(name)?;
        let open = entry.open()?;
        self.record_spec(
            &entry,
            VolumeSpec {
                qos: limits,
                ..entry.spec.clone()
            },
        )
        .await?;
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
    use glidefs_model::api::QosLimit;

    const MAX_RATE: u64 = QosLimit::MAX_RATE;

    fn limit(rate: u64, burst: Option<u64>) -> Option<QosLimit> {
        Some(QosLimit { rate, burst })
    }

    #[test]
    fn limits_are_checked_and_bursts_filled_in() {
        let ok = check_qos(&QosLimits {
            write_bytes: limit(50 << 20, None),
            read_iops: limit(1_000, Some(5_000)),
            ..QosLimits::default()
        })
        .unwrap();
        assert_eq!(ok.write_bytes, limit(50 << 20, Some(5 << 20)));
        assert_eq!(ok.read_iops, limit(1_000, Some(5_000)));
        assert_eq!(ok.iops, None);
        assert_eq!(
            check_qos(&QosLimits::default()).unwrap(),
            QosLimits::default()
        );
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
            let e = check_qos(&bad).unwrap_err();
            assert_eq!(e.code(), "invalid_qos");
            let m = e.to_string();
            assert!(m.contains(field) && m.contains(says), "{m}");
        }
    }
}
