//! QoS limits through CSI: parameters `qos.*` in a StorageClass (set at create) or in a
//! VolumeAttributesClass (`mutable_parameters`: set at create, changed by
//! ControllerModifyVolume), recorded in the store, handed to the node that stages the volume
//! and pushed to the node that holds it when they change.
//!
//! | parameter | the daemon's limit (`glidefs/API.md`, QoS) | value |
//! |---|---|---|
//! | `qos.readIops` / `qos.writeIops` / `qos.iops` | `read_iops` / `write_iops` / `iops` | `RATE[:BURST]`, requests per second |
//! | `qos.readBytesPerSec` / `qos.writeBytesPerSec` / `qos.bytesPerSec` | `read_bytes` / `write_bytes` / `bytes` | `RATE[:BURST]`, bytes per second (`100M:200M`) |
//!
//! In mutable parameters a value `none` removes that limit; a key left out keeps its limit
//! (the CSI rule: only the keys given change the volume). Only `qos.*` keys are mutable.
//!
//! Where the limits live: a log of versions in the store (`csi/qos/<volume>/<seq>.json`,
//! [`crate::records::QosRecord`]; the newest is in force). ControllerPublish puts the newest
//! in the publish context ([`QOS_CONTEXT`]), and NodeStage opens the volume with it, so a
//! volume that moves to another node keeps its limits.
//!
//! ControllerModifyVolume (`crate::modify`), in order:
//! 1. parse the given keys (any other key: `INVALID_ARGUMENT`); the new limits are the
//!    newest version's with those applied, checked like the daemon checks them;
//! 2. record them as the next version (create-only: a version another caller wrote
//!    meanwhile makes this call `ABORTED`, and the CO retries it on the new newest);
//! 3. read the attachment: published nowhere, done (the next ControllerPublish writes its
//!    attachment before it reads the newest version, so it reads this one); published to a
//!    node whose daemon serves the volume, push the limits to that daemon (`PUT qos`, live);
//!    published to a node whose daemon does not serve it yet, `UNAVAILABLE`: its NodeStage
//!    may have read a publish context from before step 2, and the CO's retry pushes the
//!    limits once the daemon serves the volume.

use std::collections::HashMap;

use glidefs_model::api::{QosLimit, QosLimits};
use tonic::Status;

use glidefs_model::size::parse_size;

/// The publish-context key of the limits in force (JSON of [`QosLimits`]; absent: none).
pub const QOS_CONTEXT: &str = "glidefs.io/qos";

/// The bucket of [`QosLimits`] a parameter sets.
type Bucket = fn(&mut QosLimits) -> &mut Option<QosLimit>;

/// The parameter keys, each with the bucket it sets and whether its values are bytes.
const KEYS: [(&str, Bucket, bool); 6] = [
    ("qos.readIops", |l| &mut l.read_iops, false),
    ("qos.writeIops", |l| &mut l.write_iops, false),
    ("qos.iops", |l| &mut l.iops, false),
    ("qos.readBytesPerSec", |l| &mut l.read_bytes, true),
    ("qos.writeBytesPerSec", |l| &mut l.write_bytes, true),
    ("qos.bytesPerSec", |l| &mut l.bytes, true),
];

/// Whether `key` is one of the QoS parameters.
pub fn is_qos_key(key: &str) -> bool {
    KEYS.iter().any(|(k, _, _)| *k == key)
}

/// Sets (or with `none`, where `removable`, removes) the bucket of parameter `key` in
/// `limits`. The limit itself is checked by [`checked`].
pub fn set(limits: &mut QosLimits, key: &str, value: &str, removable: bool) -> Result<(), Status> {
    let Some((_, bucket, bytes)) = KEYS.iter().find(|(k, _, _)| *k == key) else {
        return Err(Status::invalid_argument(format!(
            "unknown QoS parameter {key:?} (known: {})",
            KEYS.map(|(k, _, _)| k).join(", ")
        )));
    };
    if removable && value == "none" {
        *bucket(limits) = None;
        return Ok(());
    }
    let bad = || {
        Status::invalid_argument(format!(
            "parameter {key}={value:?}: must be RATE or RATE:BURST ({}{})",
            if *bytes {
                "bytes per second, K/M/G/T suffixes"
            } else {
                "requests per second"
            },
            if removable { ", or none" } else { "" }
        ))
    };
    let number = |s: &str| {
        if *bytes {
            parse_size(s).ok()
        } else {
            s.trim().parse::<u64>().ok()
        }
    };
    let (rate, burst) = match value.split_once(':') {
        Some((r, b)) => (number(r).ok_or_else(bad)?, Some(number(b).ok_or_else(bad)?)),
        None => (number(value).ok_or_else(bad)?, None),
    };
    *bucket(limits) = Some(QosLimit { rate, burst });
    Ok(())
}

/// `limits` checked as the daemon checks them (bursts filled in); `INVALID_ARGUMENT` naming
/// the bucket otherwise.
pub fn checked(limits: &QosLimits) -> Result<QosLimits, Status> {
    limits
        .checked()
        .map_err(|e| Status::invalid_argument(e.to_string()))
}

/// `base` with the mutable parameters `given` applied (sidecar keys ignored; a key that is
/// not `qos.*` is `INVALID_ARGUMENT`: nothing else of a volume is mutable), checked.
pub fn apply_mutable(
    given: &HashMap<String, String>,
    base: QosLimits,
) -> Result<QosLimits, Status> {
    let mut limits = base;
    for (k, v) in given {
        if k.starts_with("csi.storage.k8s.io/") {
            continue;
        }
        if !is_qos_key(k) {
            return Err(Status::invalid_argument(format!(
                "mutable parameter {k:?} cannot be changed: only qos.* parameters are mutable"
            )));
        }
        set(&mut limits, k, v, true)?;
    }
    checked(&limits)
}

/// The limits a publish context carries ([`QOS_CONTEXT`]; none when absent).
pub fn from_context(ctx: &HashMap<String, String>) -> Result<QosLimits, Status> {
    match ctx.get(QOS_CONTEXT) {
        None => Ok(QosLimits::default()),
        Some(text) => serde_json::from_str(text).map_err(|e| {
            Status::invalid_argument(format!("publish context {QOS_CONTEXT}={text:?}: {e}"))
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn parameters_set_and_remove_limits_and_bad_ones_are_named() {
        let l = apply_mutable(
            &given(&[
                ("qos.writeBytesPerSec", "100M:200M"),
                ("qos.readIops", "500"),
                ("csi.storage.k8s.io/pvc/name", "x"),
            ]),
            QosLimits::default(),
        )
        .unwrap();
        assert_eq!(
            l.write_bytes,
            Some(QosLimit {
                rate: 100 << 20,
                burst: Some(200 << 20)
            })
        );
        assert_eq!(
            l.read_iops,
            Some(QosLimit {
                rate: 500,
                burst: Some(50)
            })
        );
        // Only the keys given change; `none` removes.
        let l2 = apply_mutable(&given(&[("qos.readIops", "none")]), l).unwrap();
        assert_eq!((l2.read_iops, l2.write_bytes), (None, l.write_bytes));
        for (k, v, says) in [
            ("qos.iops", "fast", "RATE or RATE:BURST"),
            ("qos.iops", "0", "rate 0"),
            ("qos.bytesPerSec", "10Q", "bytes per second"),
            ("qos.iops", "10:0", "burst 0"),
            ("blockSize", "4K", "only qos.*"),
            ("qos.latency", "1", "only qos.*"),
        ] {
            let e = apply_mutable(&given(&[(k, v)]), QosLimits::default()).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
            assert!(e.message().contains(says), "{k}={v}: {e}");
        }
        let mut l3 = QosLimits::default();
        let e = set(&mut l3, "qos.iops", "none", false).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn the_publish_context_carries_the_limits() {
        let l = QosLimits {
            iops: Some(QosLimit {
                rate: 10,
                burst: Some(1),
            }),
            ..QosLimits::default()
        };
        let ctx = HashMap::from([(QOS_CONTEXT.to_string(), serde_json::to_string(&l).unwrap())]);
        assert_eq!(from_context(&ctx).unwrap(), l);
        assert_eq!(from_context(&HashMap::new()).unwrap(), QosLimits::default());
        let bad = HashMap::from([(QOS_CONTEXT.to_string(), "{".to_string())]);
        assert_eq!(
            from_context(&bad).unwrap_err().code(),
            tonic::Code::InvalidArgument
        );
    }
}
