//! A volume's parameters: validated from a create request, persisted in `state.json`.
//!
//! Validation order (the first failure is reported): name, prefix, block_size, size, queues,
//! queue_depth, encryption key source, durability, QoS limits.
//!
//! Encryption at rest: a spec records where the volume's key is (`KeySource`: a file path or
//! the name of a `GLIDEFS_KEY_*` environment variable the daemon started with), never the
//! key; [`load_key`] reads it at create and at every open (restart, re-open), so the file
//! must stay readable (or the variable set for every start) for the daemon to open the
//! volume. A key file is read like the API's secrets (`api::secret`): a regular file of at
//! most [`MAX_KEY_FILE_BYTES`], mode 0600 or stricter, opened without blocking; async code
//! reads it on the blocking pool ([`load_key_async`]). A path that is none of this, or holds
//! no key, is refused without telling its length or content. `size` may be absent only with `attach_existing` (the stored manifest's size is
//! then used, see `manager::create`, after [`check_stored_geometry`] held it to the same
//! limits).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use glidefs_volume::VolumeKey;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use zeroize::Zeroize;

use crate::config::{limits, valid_block_size, VolumeDefaults};
use crate::environment::{KeyVars, KEY_ENV_PREFIX};
use crate::manager::error::{Detail, ManagerError};
use crate::secret::read_secret;
use glidefs_model::api::{CreateVolume, Durability, QosLimits};
use glidefs_model::size::parse_size;

/// Longest volume name (the object store's limit).
pub(crate) const MAX_NAME_LEN: usize = 128;
/// Longest object-store prefix.
pub(crate) const MAX_PREFIX_LEN: usize = 256;

/// Everything needed to (re)open a volume and its device; one entry of `state.json`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VolumeSpec {
    pub name: String,
    pub size: u64,
    pub block_size: u32,
    pub queues: u16,
    pub queue_depth: u16,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub read_only: bool,
    /// Kernel id of the volume's ublk device (`N` of `/dev/ublkbN`) when it last had one: a
    /// restarted daemon takes that device over (crash recovery) or asks for the same id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_id: Option<u32>,
    /// A read-only attachment of a snapshot: the volume and snapshot it shows (`name` is
    /// only the device's name then; the store objects are the origin's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotRef>,
    /// Where the volume's encryption key is (never the key itself); absent: not encrypted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption_key: Option<KeySource>,
    /// What the device's FLUSH waits for (`local` is left out of `state.json`).
    #[serde(default, skip_serializing_if = "Durability::is_local")]
    pub durability: Durability,
    /// The device's QoS limits, checked, bursts filled in (none: left out of `state.json`).
    #[serde(default, skip_serializing_if = "QosLimits::is_empty")]
    pub qos: QosLimits,
}

/// `VOL@SNAP`: snapshot SNAP of volume VOL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnapshotRef {
    pub volume: String,
    pub snapshot: String,
}

impl SnapshotRef {
    /// Parses `VOL@SNAP` (both valid names).
    pub(crate) fn parse(value: &str) -> Result<Self, ManagerError> {
        let bad = |reason: &str| ManagerError::InvalidSnapshot {
            value: value.to_string(),
            reason: reason.to_string(),
        };
        let (volume, snapshot) = value
            .split_once('@')
            .ok_or_else(|| bad("expected VOLUME@SNAPSHOT"))?;
        if !valid_name(volume) || !valid_name(snapshot) {
            return Err(bad(
                "volume and snapshot names are 1..=128 characters of [A-Za-z0-9._-], not `.`/`..`",
            ));
        }
        Ok(Self {
            volume: volume.to_string(),
            snapshot: snapshot.to_string(),
        })
    }
}

impl std::fmt::Display for SnapshotRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.volume, self.snapshot)
    }
}

/// Where a volume's encryption key is read from (64 hexadecimal characters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum KeySource {
    /// A file (absolute path) the daemon reads.
    File(PathBuf),
    /// A `GLIDEFS_KEY_*` environment variable of the daemon.
    Env(String),
}

/// The largest key file read: 64 hexadecimal characters and whitespace fit many times over.
pub(crate) const MAX_KEY_FILE_BYTES: u64 = 4096;

/// Reads the key of volume `name` from `source` (`None`: not encrypted): a file (see the
/// module docs), or one of `vars` (the `GLIDEFS_KEY_*` variables the daemon started with).
/// Errors name the source, never the key (`invalid_encryption_key`). Reads a file: in async
/// code use [`load_key_async`].
pub(crate) fn load_key(
    name: &str,
    source: Option<&KeySource>,
    vars: &KeyVars,
) -> Result<Option<Arc<VolumeKey>>, ManagerError> {
    let loaded = match source {
        None => return Ok(None),
        Some(KeySource::File(path)) => key_from_file(path),
        Some(KeySource::Env(var)) => match vars.get(var) {
            Some(text) => {
                VolumeKey::parse_hex(text.as_bytes(), &format!("environment variable `{var}`"))
                    .map_err(|e| Detail::caused("load the key", e))
            }
            None => Err(Detail::new(format!(
                "environment variable `{var}` was not set (or empty) when the daemon started"
            ))),
        },
    };
    loaded
        .map(|k| Some(Arc::new(k)))
        .map_err(|detail| ManagerError::InvalidEncryptionKey {
            name: name.to_string(),
            detail,
        })
}

/// The key in file `path`; an error tells what is wrong with the file, not its length or
/// content (the parser's detail would tell the length).
fn key_from_file(path: &Path) -> Result<VolumeKey, Detail> {
    let mut text = read_secret("encryption_key_file", path, MAX_KEY_FILE_BYTES)
        .map_err(|e| Detail::caused("load the key", e))?;
    let key = VolumeKey::parse_hex(&text, "").map_err(|_| {
        Detail::new(format!(
            "encryption_key_file `{}` does not hold a key (64 hexadecimal characters)",
            path.display()
        ))
    });
    text.zeroize();
    key
}

/// [`load_key`] with a key file read on the blocking pool, never on an async worker.
pub(crate) async fn load_key_async(
    name: &str,
    source: Option<&KeySource>,
    vars: &KeyVars,
) -> Result<Option<Arc<VolumeKey>>, ManagerError> {
    let Some(KeySource::File(path)) = source else {
        return load_key(name, source, vars);
    };
    let (name, source) = (name.to_string(), KeySource::File(path.clone()));
    super::blocking::blocking(move || load_key(&name, Some(&source), &KeyVars::default())).await
}

/// The key source of a create request: at most one of the two fields; a file path must be
/// absolute (the daemon, not the client, reads it), a variable name non-empty without `=`.
fn key_source(req: &CreateVolume) -> Result<Option<KeySource>, ManagerError> {
    let bad = |what: String| ManagerError::InvalidEncryptionKey {
        name: req.name.clone(),
        detail: Detail::new(what),
    };
    match (&req.encryption_key_file, &req.encryption_key_env) {
        (None, None) => Ok(None),
        (Some(_), Some(_)) => Err(bad(
            "give encryption_key_file or encryption_key_env, not both".to_string(),
        )),
        (Some(path), None) => {
            let p = PathBuf::from(path);
            if !p.is_absolute() {
                return Err(bad(format!(
                    "encryption_key_file `{}` must be an absolute path (the daemon reads it)",
                    path.escape_debug()
                )));
            }
            Ok(Some(KeySource::File(p)))
        }
        (None, Some(var)) => {
            let rest = var.strip_prefix(KEY_ENV_PREFIX).unwrap_or_default();
            if rest.is_empty() || var.contains(['=', '\0']) {
                return Err(bad(format!(
                    "encryption_key_env `{}` must name a {KEY_ENV_PREFIX}* variable (the daemon \
                     reads only those, from its environment at start)",
                    var.escape_debug()
                )));
            }
            Ok(Some(KeySource::Env(var.clone())))
        }
    }
}

/// A create request after validation; `size`/`block_size` are `None` when the request left
/// them to the stored manifest (`attach_existing`) or, for block_size, the defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidCreate {
    pub name: String,
    pub size: Option<u64>,
    pub block_size: Option<u32>,
    pub queues: u16,
    pub queue_depth: u16,
    pub prefix: Option<String>,
    pub read_only: bool,
    pub attach_existing: bool,
    pub takeover: bool,
    /// `from`: a snapshot to attach read-only (`read_only`) or to clone.
    pub from: Option<SnapshotRef>,
    pub encryption_key: Option<KeySource>,
    pub durability: Durability,
    /// Checked, bursts filled in ([`check_qos`]).
    pub qos: QosLimits,
}

/// QoS `limits` checked, with every burst filled in ([`QosLimits::checked`]); a limit out of
/// range is `invalid_qos`, naming the bucket.
pub(crate) fn check_qos(limits: &QosLimits) -> Result<QosLimits, ManagerError> {
    limits.checked().map_err(|e| ManagerError::InvalidQos {
        field: e.field,
        reason: e.reason,
    })
}

/// Whether `name` is a valid volume name (same rule as the object store's).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A key prefix: `/`-separated segments of `[A-Za-z0-9._-]`, none `.`, `..` or `volumes`. A
/// `volumes` segment could put a volume's objects under another volume's
/// (`volumes/x/volumes/y/...` with prefix `volumes/x`), where a purge or the undo of a failed
/// create of `x`, which delete everything under `volumes/x/`, would take them.
fn valid_prefix(p: &str) -> bool {
    !p.is_empty()
        && p.len() <= MAX_PREFIX_LEN
        && p.split('/').all(|seg| {
            !seg.is_empty()
                && seg != "."
                && seg != ".."
                && seg != "volumes"
                && seg
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        })
}

/// A JSON number or size string as bytes; `None` with the reason when it is neither.
pub(crate) fn json_bytes(v: &Value) -> Result<u64, String> {
    match v {
        Value::Number(n) => n
            .as_u64()
            .ok_or_else(|| "must be a non-negative integer".to_string()),
        Value::String(s) => parse_size(s).map_err(|e| e.to_string()),
        _ => Err("must be an integer or a size string like \"10G\"".to_string()),
    }
}

fn json_count(
    v: Option<&Value>,
    default: u16,
    max: u64,
    field: &'static str,
) -> Result<u16, ManagerError> {
    let Some(v) = v else { return Ok(default) };
    let bad = |reason: String| ManagerError::InvalidQueues {
        field,
        value: v.to_string(),
        reason,
    };
    let n = v
        .as_u64()
        .ok_or_else(|| bad("must be a positive integer".to_string()))?;
    if n == 0 || n > max {
        return Err(bad(format!("must be in 1..={max}")));
    }
    u16::try_from(n).map_err(|_| bad(format!("must be in 1..={max}")))
}

impl ValidCreate {
    /// Validates a request against the limits, filling queues from `defaults`.
    pub(crate) fn from_request(
        req: &CreateVolume,
        defaults: &VolumeDefaults,
    ) -> Result<Self, ManagerError> {
        if !valid_name(&req.name) {
            return Err(ManagerError::InvalidName {
                name: req.name.escape_debug().to_string(),
            });
        }
        let prefix = match req.prefix.as_deref().map(|p| p.trim_matches('/')) {
            None => None,
            Some(p) if valid_prefix(p) => Some(p.to_string()),
            Some(_) => {
                return Err(ManagerError::InvalidPrefix {
                    value: req
                        .prefix
                        .clone()
                        .unwrap_or_default()
                        .escape_debug()
                        .to_string(),
                })
            }
        };
        let block_size = match &req.block_size {
            None => None,
            Some(v) => {
                let bad = || ManagerError::InvalidBlockSize {
                    value: v.to_string(),
                };
                let b = json_bytes(v).map_err(|_| bad())?;
                if !valid_block_size(b) {
                    return Err(bad());
                }
                Some(u32::try_from(b).map_err(|_| bad())?)
            }
        };
        let size = match &req.size {
            None if req.attach_existing || req.from.is_some() => None,
            None => {
                return Err(ManagerError::InvalidSize {
                    value: "(missing)".to_string(),
                    reason: "size is required (or attach_existing to use the stored size)"
                        .to_string(),
                })
            }
            Some(v) => {
                let bad = |reason: String| ManagerError::InvalidSize {
                    value: v.to_string(),
                    reason,
                };
                let s = json_bytes(v).map_err(bad)?;
                let bs = u64::from(block_size.unwrap_or(defaults.block_size.0 as u32));
                if s == 0 {
                    return Err(bad("must be greater than 0".to_string()));
                }
                if s > limits::MAX_VOLUME_SIZE {
                    return Err(bad("must be at most 256T".to_string()));
                }
                if !s.is_multiple_of(bs) {
                    return Err(bad(format!("must be a multiple of the block size {bs}")));
                }
                Some(s)
            }
        };
        Ok(Self {
            name: req.name.clone(),
            size,
            block_size,
            queues: json_count(
                req.queues.as_ref(),
                defaults.queues,
                limits::MAX_QUEUES,
                "queues",
            )?,
            queue_depth: json_count(
                req.queue_depth.as_ref(),
                defaults.queue_depth,
                limits::MAX_QUEUE_DEPTH,
                "queue_depth",
            )?,
            prefix,
            read_only: req.read_only,
            attach_existing: req.attach_existing,
            takeover: req.takeover,
            from: match &req.from {
                Some(f) if req.attach_existing => {
                    return Err(ManagerError::InvalidSnapshot {
                        value: f.clone(),
                        reason: "`from` creates a volume (or attaches a snapshot); it does not go with attach_existing".into(),
                    })
                }
                Some(f) => Some(SnapshotRef::parse(f)?),
                None => None,
            },
            encryption_key: key_source(req)?,
            durability: match req.durability.as_deref() {
                None => Durability::Local,
                Some(d) => Durability::parse(d).ok_or_else(|| ManagerError::InvalidDurability {
                    value: d.escape_debug().to_string(),
                })?,
            },
            qos: check_qos(&req.qos.unwrap_or_default())?,
        })
    }
}

/// Checks the geometry an `attach_existing` takes from the stored manifest of volume `name`
/// against the limits of a create request: a manifest is not trusted to be sane (another
/// tool, a newer glidefs, damage).
pub(crate) fn check_stored_geometry(
    name: &str,
    size: u64,
    block_size: u32,
) -> Result<(), ManagerError> {
    if !valid_block_size(u64::from(block_size)) {
        return Err(ManagerError::InvalidBlockSize {
            value: format!(
                "{block_size} (from the manifest of volume `{name}` in the object store)"
            ),
        });
    }
    if size == 0 || size > limits::MAX_VOLUME_SIZE {
        return Err(ManagerError::InvalidSize {
            value: size.to_string(),
            reason: format!(
                "the manifest of volume `{name}` in the object store says so; a volume must be 1..=256T"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn req(v: Value) -> Result<ValidCreate, ManagerError> {
        let r: CreateVolume = serde_json::from_value(v)
            .map_err(|e| ManagerError::internal("not a CreateVolume document", e))?;
        ValidCreate::from_request(&r, &VolumeDefaults::default())
    }

    #[test]
    fn defaults_fill_queues_and_sizes_parse() {
        let v = req(json!({"name": "db-1", "size": "1G"})).unwrap();
        assert_eq!(v.size, Some(1 << 30));
        assert_eq!((v.queues, v.queue_depth, v.block_size), (1, 64, None));
        let v =
            req(json!({"name": "a", "size": 8192, "block_size": "4K", "prefix": "/t/x/"})).unwrap();
        assert_eq!(v.prefix.as_deref(), Some("t/x"));
    }

    #[test]
    fn each_bad_field_gets_its_code() {
        for (body, code) in [
            (json!({"name": "", "size": 4096}), "invalid_name"),
            (json!({"name": "a/b", "size": 4096}), "invalid_name"),
            (json!({"name": "..", "size": 4096}), "invalid_name"),
            (
                json!({"name": "x".repeat(129), "size": 4096}),
                "invalid_name",
            ),
            (json!({"name": "a"}), "invalid_size"),
            (json!({"name": "a", "size": 0}), "invalid_size"),
            (json!({"name": "a", "size": -1}), "invalid_size"),
            (json!({"name": "a", "size": 1.5}), "invalid_size"),
            (json!({"name": "a", "size": "12Q"}), "invalid_size"),
            (json!({"name": "a", "size": 1000}), "invalid_size"),
            (json!({"name": "a", "size": "1P"}), "invalid_size"),
            (
                json!({"name": "a", "size": "1T", "block_size": 3000}),
                "invalid_block_size",
            ),
            (
                json!({"name": "a", "size": "1T", "block_size": "32M"}),
                "invalid_block_size",
            ),
            (
                json!({"name": "a", "size": "1G", "queues": 0}),
                "invalid_queues",
            ),
            (
                json!({"name": "a", "size": "1G", "queues": 65}),
                "invalid_queues",
            ),
            (
                json!({"name": "a", "size": "1G", "queue_depth": 5000}),
                "invalid_queues",
            ),
            (
                json!({"name": "a", "size": "1G", "queue_depth": "x"}),
                "invalid_queues",
            ),
            (
                json!({"name": "a", "size": "1G", "prefix": "a/../b"}),
                "invalid_prefix",
            ),
            (
                json!({"name": "a", "size": "1G", "prefix": "volumes/x"}),
                "invalid_prefix",
            ),
            (
                json!({"name": "a", "size": "1G", "prefix": "t/volumes"}),
                "invalid_prefix",
            ),
            (
                json!({"name": "a", "size": "1G", "encryption_key_file": "rel/key"}),
                "invalid_encryption_key",
            ),
            (
                json!({"name": "a", "size": "1G", "encryption_key_env": ""}),
                "invalid_encryption_key",
            ),
            (
                json!({"name": "a", "size": "1G", "encryption_key_env": "HOME"}),
                "invalid_encryption_key",
            ),
            (
                json!({"name": "a", "size": "1G", "encryption_key_env": "K", "encryption_key_file": "/k"}),
                "invalid_encryption_key",
            ),
        ] {
            let err = req(body.clone()).expect_err(&body.to_string());
            assert_eq!(err.code(), code, "{body}: {err}");
        }
    }

    #[test]
    fn attach_existing_may_omit_the_size() {
        let v = req(json!({"name": "a", "attach_existing": true})).unwrap();
        assert_eq!(v.size, None);
    }
}
