//! StorageClass parameters and capacity ranges: parsed and checked before anything is
//! written, every refusal `INVALID_ARGUMENT` (or `OUT_OF_RANGE`) naming the value.
//!
//! | parameter | values | default |
//! |---|---|---|
//! | `blockSize` | a power of two in 4K..=16M (`4K`, `131072`) | 128K (glidefs' default) |
//! | `durability` | `local` (a FLUSH is durable on the node's disk) or `store` (durable in the object store) | `local` |
//! | `encryptionKeyFile` | absolute path of the volume key (64 hex characters), present on every node and on the controller | not encrypted |
//! | `qos.*` | QoS limits (`crate::qos`); also mutable, in a VolumeAttributesClass | none |
//!
//! Keys under `csi.storage.k8s.io/` are the sidecars' own and are ignored; any other key is
//! refused, so a typo does not silently give a volume other properties than asked.

use std::collections::{BTreeMap, HashMap};

use tonic::Status;

use crate::pb;
use crate::qos;
use glidefs_model::api::QosLimits;

/// 1 GiB: the size of a volume whose request names no capacity.
pub const DEFAULT_CAPACITY: u64 = 1 << 30;

/// The block size of a volume whose parameters name none (the daemon's own default; always
/// sent, so that the size the driver rounds to is the block size the volume gets).
pub const DEFAULT_BLOCK_SIZE: u32 = 128 << 10;

/// The parameters of a volume, as parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Params {
    pub block_size: u32,
    pub durability: Option<String>,
    pub encryption_key_file: Option<String>,
    /// QoS limits (`qos.*`), unchecked: [`crate::qos::checked`] (with the mutable ones).
    pub qos: QosLimits,
    /// The parameters as given (sidecar keys left out), kept in the volume record.
    pub raw: BTreeMap<String, String>,
}

/// Parses a size: bytes, or a number with `K`, `M`, `G` (powers of 1024, an optional `i`
/// and `B`: `128K`, `128KiB`).
pub fn parse_size(text: &str) -> Option<u64> {
    let t = text.trim();
    let digits = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits);
    let n: u64 = num.parse().ok()?;
    let shift = match unit.trim_end_matches('B').trim_end_matches('i') {
        "" => 0,
        "K" | "k" => 10,
        "M" => 20,
        "G" => 30,
        _ => return None,
    };
    n.checked_mul(1 << shift)
}

impl Params {
    pub fn parse(given: &HashMap<String, String>) -> Result<Self, Status> {
        let mut p = Params {
            block_size: DEFAULT_BLOCK_SIZE,
            ..Params::default()
        };
        for (k, v) in given {
            if k.starts_with("csi.storage.k8s.io/") {
                continue;
            }
            p.raw.insert(k.clone(), v.clone());
            match k.as_str() {
                "blockSize" => {
                    let bs = parse_size(v)
                        .filter(|b| b.is_power_of_two() && (4096..=16 << 20).contains(b))
                        .and_then(|b| u32::try_from(b).ok())
                        .ok_or_else(|| {
                            Status::invalid_argument(format!(
                                "parameter blockSize={v:?}: must be a power of two from 4K to 16M"
                            ))
                        })?;
                    p.block_size = bs;
                }
                "durability" => match v.as_str() {
                    "local" | "store" => p.durability = Some(v.clone()),
                    _ => {
                        return Err(Status::invalid_argument(format!(
                            "parameter durability={v:?}: must be `local` or `store`"
                        )))
                    }
                },
                "encryptionKeyFile" => {
                    if !v.starts_with('/') {
                        return Err(Status::invalid_argument(format!(
                            "parameter encryptionKeyFile={v:?}: must be an absolute path"
                        )));
                    }
                    p.encryption_key_file = Some(v.clone());
                }
                k if qos::is_qos_key(k) => qos::set(&mut p.qos, k, v, false)?,
                _ => {
                    return Err(Status::invalid_argument(format!(
                        "unknown parameter {k:?} (known: blockSize, durability, encryptionKeyFile, qos.*)"
                    )))
                }
            }
        }
        Ok(p)
    }

    /// The volume context handed to the node plugin (what NodeStage opens the volume with).
    pub fn context(&self) -> HashMap<String, String> {
        self.raw
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// The size of a new volume for `range`: the required bytes (1 GiB when none) rounded up to
/// `block_size`, refused (`OUT_OF_RANGE`) when that passes the limit.
pub fn capacity(range: Option<&pb::CapacityRange>, block_size: u32) -> Result<u64, Status> {
    let (required, limit) = match range {
        Some(r) => (r.required_bytes, r.limit_bytes),
        None => (0, 0),
    };
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(format!(
            "capacity range: negative bytes (required {required}, limit {limit})"
        )));
    }
    let (required, limit) = (required.unsigned_abs(), limit.unsigned_abs());
    if limit > 0 && required > limit {
        return Err(Status::invalid_argument(format!(
            "capacity range: required {required} bytes is over the limit {limit}"
        )));
    }
    let want = match (required, limit) {
        (0, 0) => DEFAULT_CAPACITY,
        (0, l) => DEFAULT_CAPACITY.min(l),
        (r, _) => r,
    };
    let bs = u64::from(block_size);
    let size = want.div_ceil(bs).saturating_mul(bs);
    if limit > 0 && size > limit {
        return Err(Status::out_of_range(format!(
            "capacity range: {want} bytes rounded up to the block size {bs} is {size}, over the limit {limit}"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `size` bytes satisfies `range`.
pub fn fits(size: u64, range: Option<&pb::CapacityRange>) -> bool {
    let Some(r) = range else { return true };
    let required = u64::try_from(r.required_bytes).unwrap_or(0);
    let limit = u64::try_from(r.limit_bytes).unwrap_or(0);
    size >= required && (limit == 0 || size <= limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> pb::CapacityRange {
        pb::CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        }
    }

    #[test]
    fn sizes_parse_with_binary_units() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("128K"), Some(128 << 10));
        assert_eq!(parse_size("128KiB"), Some(128 << 10));
        assert_eq!(parse_size("1M"), Some(1 << 20));
        assert_eq!(parse_size("2G"), Some(2 << 30));
        assert_eq!(parse_size("1T"), None);
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
    }

    #[test]
    fn parameters_are_checked_and_sidecar_keys_ignored() {
        let given = HashMap::from([
            ("blockSize".to_string(), "64K".to_string()),
            ("durability".to_string(), "store".to_string()),
            ("csi.storage.k8s.io/pv/name".to_string(), "pv-1".to_string()),
        ]);
        let p = Params::parse(&given).unwrap();
        assert_eq!(p.block_size, 64 << 10);
        assert_eq!(p.durability.as_deref(), Some("store"));
        assert_eq!(p.raw.len(), 2);
        for (k, v) in [
            ("blockSize", "3000"),
            ("blockSize", "32M"),
            ("durability", "disk"),
            ("encryptionKeyFile", "key"),
            ("blocksize", "4K"),
        ] {
            let e = Params::parse(&HashMap::from([(k.to_string(), v.to_string())])).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{k}={v}");
            assert!(e.message().contains(v) || e.message().contains(k), "{e}");
        }
    }

    #[test]
    fn capacity_rounds_up_and_respects_the_limit() {
        assert_eq!(capacity(None, 4096).unwrap(), DEFAULT_CAPACITY);
        assert_eq!(capacity(Some(&range(1, 0)), 4096).unwrap(), 4096);
        assert_eq!(capacity(Some(&range(0, 8192)), 4096).unwrap(), 8192);
        assert_eq!(capacity(Some(&range(5000, 8192)), 4096).unwrap(), 8192);
        let e = capacity(Some(&range(5000, 6000)), 4096).unwrap_err();
        assert_eq!(e.code(), tonic::Code::OutOfRange);
        let e = capacity(Some(&range(9000, 8192)), 4096).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let e = capacity(Some(&range(-1, 0)), 4096).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(fits(8192, Some(&range(4096, 8192))));
        assert!(!fits(8192, Some(&range(10000, 0))));
        assert!(!fits(8192, Some(&range(0, 4096))));
    }
}
