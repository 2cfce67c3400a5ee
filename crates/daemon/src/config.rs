//! The daemon's configuration: one TOML file, every key optional.
//!
//! Contract: [`Config::default()`] is a working configuration (`glidefs serve` with no file);
//! [`Config::load`] reads a file, rejects unknown keys (the error names the key) and validates
//! every value (the error names the key and the value). The annotated reference of every key is
//! `glidefs/glidefs.example.toml`; the doc comments below say the same.
//!
//! The file is found at `--config FILE`, else `$GLIDEFS_CONFIG`, else nothing (defaults).
//! [`Config::locate`] then applies the environment's overrides ([`Environment`]), so the
//! `Config` it returns is every input the daemon acts on.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use glidefs_objstore::{S3Checksum, S3Options, UnsignedPayload};
// `[ublk]` is the block devices' own section: defined with them, named here as ever.
pub use glidefs_ublk::config::{BatchIoChoice, TransportChoice, UblkSection};

use crate::environment::{Environment, BATCH_IO_ENV, S3_CHECKSUM_ENV, S3_UNSIGNED_PAYLOAD_ENV};
use glidefs_model::size::ByteSize;

/// Config loading and validation errors; each names the file, key or value at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("cannot read config file `{path}`: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("config file `{path}`: {message}")]
    Parse { path: String, message: String },
    #[error("config key `{key}` = {value}: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Directory of the daemon's local state: volume caches under `volumes/<name>/`, the volume
    /// list in `state.json`. Default `/var/lib/glidefs`.
    pub data_dir: PathBuf,
    /// Object store.
    pub store: StoreSection,
    /// HTTP API listeners.
    pub api: ApiSection,
    /// Defaults of new volumes and of their background flusher.
    pub volume_defaults: VolumeDefaults,
    /// Logging.
    pub log: LogSection,
    /// Garbage collection (`glidefs gc`, and the daemon's own passes).
    pub gc: GcSection,
    /// Compaction and scheduled GC of the volumes the daemon owns.
    pub space: SpaceSection,
    /// ublk devices.
    pub ublk: UblkSection,
}

/// `[store]`: where volumes live durably.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreSection {
    /// Object store URL: `file:///dir`, `memory://` (tests), `s3://bucket[/prefix]` (credentials,
    /// region and request timeout from the standard `AWS_*` environment). Default (unset):
    /// `file://<data_dir>/store`.
    pub url: Option<String>,
    /// Custom S3 endpoint (MinIO, Ceph, ...): path-style requests, `http://` allowed;
    /// `$GLIDEFS_S3_ENDPOINT` overrides. Default (unset): AWS.
    pub s3_endpoint: Option<String>,
    /// Whether S3 PUT bodies are left out of the SigV4 signature (no SHA-256 pass over each
    /// pack): `auto` (unsigned over `https://` and to AWS, where TLS protects the body;
    /// signed over plain `http://`), `on`, `off`; `$GLIDEFS_S3_UNSIGNED_PAYLOAD` overrides.
    /// Default `auto`.
    pub s3_unsigned_payload: UnsignedPayload,
    /// Checksum header of S3 PUTs, verified by the server before it stores the object:
    /// `auto` (`crc64nvme` for AWS itself, none for custom endpoints), `crc64nvme`, `off`;
    /// `$GLIDEFS_S3_CHECKSUM` overrides. Default `auto`.
    pub s3_checksum: S3Checksum,
    /// S3 client settings from the `AWS_*` environment (never from the file: credentials stay
    /// out of config files).
    #[serde(skip)]
    pub s3_settings: Vec<(String, String)>,
    /// Volume encryption keys from the `GLIDEFS_KEY_*` environment (never from the file).
    #[serde(skip)]
    pub encryption_keys: crate::environment::KeyVars,
    /// Pack uploads in flight per volume flush. Default 4.
    pub upload_concurrency: usize,
    /// Retries of a transient object-store error (50 ms doubling up to 8 s between attempts).
    /// Default 10: about 15-30 s of outage or throttling before a cold read fails with EIO.
    pub max_retries: u32,
}

/// `[api]`: where the HTTP API listens.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ApiSection {
    /// Unix socket path (mode 0660, parent directory created). Default `/run/glidefs/api.sock`.
    pub socket: PathBuf,
    /// Optional TCP listener, e.g. `"127.0.0.1:7070"`. Requires `token_file`; an address that
    /// is not loopback also requires TLS (`tls_cert` and `tls_key`). Default: none.
    pub tcp: Option<SocketAddr>,
    /// File holding the bearer token every TCP request must present
    /// (`Authorization: Bearer <token>`); surrounding whitespace is ignored. It must not be
    /// open to group or others (mode 0600 or stricter). Default: none.
    pub token_file: Option<PathBuf>,
    /// PEM certificate chain (leaf first) of the TCP listener: with `tls_key` it serves HTTPS
    /// only. Default: none (plain HTTP, allowed on loopback only).
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `tls_cert`; mode 0600 or stricter.
    /// Default: none.
    pub tls_key: Option<PathBuf>,
    /// Largest request body accepted, in bytes (larger: 413). Default 64K.
    pub max_body_bytes: ByteSize,
    /// Seconds a peer has, from the first byte of a request (or of the TLS handshake), to send
    /// the whole request head; slower connections are dropped (1..=3600). Default 10.
    pub header_read_timeout_secs: u64,
    /// Seconds a connection with no request in progress may stay silent before it is closed
    /// (1..=86400). Default 60.
    pub idle_timeout_secs: u64,
    /// Connections each listener serves at once (the unix socket and the TCP listener count
    /// separately); more are closed as soon as they are accepted (1..=65536). Default 64.
    pub max_connections: usize,
}

/// `[volume_defaults]`: what a create request does not say.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct VolumeDefaults {
    /// Block size of new volumes: a power of two in 4K..=16M. Default 128K.
    pub block_size: ByteSize,
    /// ublk hardware queues per device (1..=64). Default 1.
    pub queues: u16,
    /// Requests in flight per queue (1..=4096). Default 64.
    pub queue_depth: u16,
    /// Largest single I/O the device accepts (4K..=16M). Default 1M.
    pub max_io_bytes: ByteSize,
    /// Dirty bytes of a volume that start a background flush to the object store. Default 64M.
    pub flush_threshold_bytes: ByteSize,
    /// Seconds after which dirty data is flushed to the store even below the threshold
    /// (>= 1). Default 30.
    pub flush_interval_secs: u64,
    /// Local disk budget per volume: after a flush, clean blocks are evicted until the cache
    /// fits (dirty blocks are never evicted). 0 = unlimited. Default 0.
    pub disk_budget: ByteSize,
    /// Bytes a volume's attach fetches at most from its warm set (the blocks it read first
    /// when the set was recorded; a clone gets its origin's) ahead of the guest. 0 = no warm
    /// at attach. Default 256M.
    pub warm_budget: ByteSize,
    /// Ranged GETs one warm keeps in flight (1..=64): the rest of the store's connections
    /// stay free for the guest's own cold reads. Default 8.
    pub warm_parallel: u16,
}

/// `[log]`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct LogSection {
    /// `text` or `json`; `$GLIDEFS_LOG_FORMAT` overrides. Default `text`.
    pub format: LogFormat,
    /// `tracing` filter directives (`info`, `glidefs=debug,info`); `$GLIDEFS_LOG` overrides.
    /// Default `info`.
    pub filter: String,
}

/// Log line format.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// `[gc]`: `glidefs gc`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct GcSection {
    /// Unreferenced packs and old manifests younger than this many seconds survive. Packs a
    /// flush may still publish (stored after the newest manifest) survive whatever this is.
    /// At least `MIN_GC_GRACE` (600) unless `allow_short_grace`. Default 3600.
    pub grace_secs: u64,
    /// Newest manifests kept per volume (>= 1). Default 2.
    pub keep_manifests: usize,
    /// Accept a `grace_secs` below 600 (benchmarks and soaks on a throwaway store). Packs a
    /// flush may still publish stay protected by the store-time rule; the grace is then the
    /// only margin against a store whose timestamps misbehave, and writers re-check their
    /// uploads after half the grace. Default false.
    pub allow_short_grace: bool,
}

/// `[space]`: what the daemon does, per open volume, so the store follows the live data.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct SpaceSection {
    /// Packs whose live share is below this percentage are rewritten (1..=100). Default 50:
    /// the store then stays under about twice the live data, and each byte freed costs at most
    /// one byte copied.
    pub compact_threshold_pct: u8,
    /// Seconds between compaction passes; 0 turns compaction off. Default 60.
    pub compact_interval_secs: u64,
    /// Most live bytes one pass copies (its rate limit), and the largest pack it writes.
    /// Default 64 MiB.
    pub compact_max_bytes: ByteSize,
    /// Seconds between GC passes (rules and grace of `[gc]`); 0 turns them off (`glidefs gc`
    /// still works). Default 600.
    pub gc_interval_secs: u64,
}

impl Default for SpaceSection {
    fn default() -> Self {
        Self {
            compact_threshold_pct: 50,
            compact_interval_secs: 60,
            compact_max_bytes: ByteSize(64 << 20),
            gc_interval_secs: 600,
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            data_dir: PathBuf::from("/var/lib/glidefs"),
            store: StoreSection::default(),
            api: ApiSection::default(),
            volume_defaults: VolumeDefaults::default(),
            log: LogSection::default(),
            gc: GcSection::default(),
            space: SpaceSection::default(),
            ublk: UblkSection::default(),
        }
    }
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            url: None,
            s3_endpoint: None,
            s3_unsigned_payload: UnsignedPayload::Auto,
            s3_checksum: S3Checksum::Auto,
            s3_settings: Vec::new(),
            encryption_keys: Default::default(),
            upload_concurrency: 4,
            max_retries: 10,
        }
    }
}

impl Default for ApiSection {
    fn default() -> Self {
        Self {
            socket: PathBuf::from("/run/glidefs/api.sock"),
            tcp: None,
            token_file: None,
            tls_cert: None,
            tls_key: None,
            max_body_bytes: ByteSize(64 << 10),
            header_read_timeout_secs: 10,
            idle_timeout_secs: 60,
            max_connections: 64,
        }
    }
}

impl Default for VolumeDefaults {
    fn default() -> Self {
        Self {
            block_size: ByteSize(128 << 10),
            queues: 1,
            queue_depth: 64,
            max_io_bytes: ByteSize(1 << 20),
            flush_threshold_bytes: ByteSize(64 << 20),
            flush_interval_secs: 30,
            disk_budget: ByteSize(0),
            warm_budget: ByteSize(256 << 20),
            warm_parallel: 8,
        }
    }
}

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            filter: "info".to_string(),
        }
    }
}

impl Default for GcSection {
    fn default() -> Self {
        Self {
            grace_secs: 3600,
            keep_manifests: 2,
            allow_short_grace: false,
        }
    }
}

/// Limits shared by config validation and API request validation.
pub mod limits {
    /// Smallest block size (the cache's page size).
    pub const MIN_BLOCK_SIZE: u64 = 4 << 10;
    /// Largest block size.
    pub const MAX_BLOCK_SIZE: u64 = 16 << 20;
    /// Most ublk queues per device.
    pub const MAX_QUEUES: u64 = 64;
    /// Deepest ublk queue (the kernel's `UBLK_MAX_QUEUE_DEPTH`).
    pub const MAX_QUEUE_DEPTH: u64 = 4096;
    /// Largest volume (256 TiB: 2 Gi blocks of 128 KiB).
    pub const MAX_VOLUME_SIZE: u64 = 256 << 40;
}

/// Whether `b` is a block size the cache accepts.
pub fn valid_block_size(b: u64) -> bool {
    b.is_power_of_two() && (limits::MIN_BLOCK_SIZE..=limits::MAX_BLOCK_SIZE).contains(&b)
}

impl ApiSection {
    /// Whether the TCP listener serves TLS (`tls_cert` and `tls_key` set).
    pub fn tls(&self) -> bool {
        self.tls_cert.is_some() && self.tls_key.is_some()
    }

    /// The TCP listener's rules: a token always; TLS unless it binds loopback; TLS files only
    /// with a listener, and both of them.
    pub fn validate_tcp(&self) -> Result<(), ConfigError> {
        let invalid = |key, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                reason: reason.to_string(),
            })
        };
        let Some(addr) = self.tcp else {
            if let Some(p) = self.tls_cert.as_ref().or(self.tls_key.as_ref()) {
                return invalid(
                    if self.tls_cert.is_some() {
                        "api.tls_cert"
                    } else {
                        "api.tls_key"
                    },
                    format!("{p:?}"),
                    "TLS applies to the TCP listener: set api.tcp",
                );
            }
            return Ok(());
        };
        let shown = format!("{:?}", addr.to_string());
        if self.token_file.is_none() {
            return invalid(
                "api.tcp",
                shown,
                "a TCP listener requires api.token_file (bearer token)",
            );
        }
        match (&self.tls_cert, &self.tls_key) {
            (Some(c), None) => {
                return invalid(
                    "api.tls_cert",
                    format!("{c:?}"),
                    "TLS needs api.tls_key too",
                )
            }
            (None, Some(k)) => {
                return invalid(
                    "api.tls_key",
                    format!("{k:?}"),
                    "TLS needs api.tls_cert too",
                )
            }
            _ => {}
        }
        if !self.tls() && !addr.ip().to_canonical().is_loopback() {
            return invalid(
                "api.tcp",
                shown,
                "a TCP listener on a non-loopback address must use TLS (set api.tls_cert and \
                 api.tls_key), or bind 127.0.0.1 / [::1]: the bearer token would cross the \
                 network in clear text",
            );
        }
        Ok(())
    }
}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The file named by `explicit`, else `$GLIDEFS_CONFIG`, else the defaults; with the
    /// environment's overrides applied ([`Config::apply_env`]). An S3 override that is not
    /// one of its names is an error naming the variable.
    pub fn locate(explicit: Option<&Path>, env: &Environment) -> Result<Self, ConfigError> {
        let invalid = |key, value: &str, reason: String| ConfigError::Invalid {
            key,
            value: format!("{value:?}"),
            reason,
        };
        if let Some(v) = &env.s3_unsigned_payload {
            v.parse::<UnsignedPayload>()
                .map_err(|e| invalid(S3_UNSIGNED_PAYLOAD_ENV, v, e.to_string()))?;
        }
        if let Some(v) = &env.s3_checksum {
            v.parse::<S3Checksum>()
                .map_err(|e| invalid(S3_CHECKSUM_ENV, v, e.to_string()))?;
        }
        if let Some(v) = &env.batch_io {
            v.parse::<BatchIoChoice>()
                .map_err(|e| invalid(BATCH_IO_ENV, v, e))?;
        }
        let mut c = match explicit.map(Path::to_path_buf).or(env.config.clone()) {
            Some(p) => Self::load(&p)?,
            None => {
                let c = Self::default();
                c.validate()?;
                c
            }
        };
        c.apply_env(env);
        Ok(c)
    }

    /// Applies the environment's overrides (see [`crate::environment`]). A
    /// `$GLIDEFS_LOG_FORMAT` other than `text` or `json` is ignored (`log.format` stays), and
    /// so is an S3 override that is not one of its names ([`Config::locate`] rejects those).
    pub fn apply_env(&mut self, env: &Environment) {
        match env.log_format.as_deref() {
            Some("json") => self.log.format = LogFormat::Json,
            Some("text") => self.log.format = LogFormat::Text,
            _ => {}
        }
        if let Some(f) = &env.log_filter {
            self.log.filter = f.clone();
        }
        if env.force_user_copy {
            self.ublk.transport = TransportChoice::UserCopy;
        }
        if let Some(e) = &env.s3_endpoint {
            self.store.s3_endpoint = Some(e.clone());
        }
        if let Some(Ok(u)) = env.s3_unsigned_payload.as_deref().map(str::parse) {
            self.store.s3_unsigned_payload = u;
        }
        if let Some(Ok(c)) = env.s3_checksum.as_deref().map(str::parse) {
            self.store.s3_checksum = c;
        }
        if let Some(Ok(b)) = env.batch_io.as_deref().map(str::parse) {
            self.ublk.batch_io = b;
        }
        self.store.s3_settings = env.aws.clone();
        self.store.encryption_keys = env.keys.clone();
        self.ublk.fault_ring_after = env.fault_ring_after;
    }

    /// How S3 clients of this configuration are set up.
    pub fn s3_options(&self) -> S3Options {
        S3Options {
            endpoint: self.store.s3_endpoint.clone(),
            settings: self.store.s3_settings.clone(),
            unsigned_payload: self.store.s3_unsigned_payload,
            checksum: self.store.s3_checksum,
        }
    }

    /// Parses TOML text (`origin` names it in errors) and validates it.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: origin.to_string(),
            message: e.to_string(),
        })?;
        c.validate()?;
        Ok(c)
    }

    /// The object store URL in effect (`store.url`, else `file://<data_dir>/store`).
    pub fn store_url(&self) -> String {
        match &self.store.url {
            Some(u) => u.clone(),
            None => format!("file://{}", self.data_dir.join("store").display()),
        }
    }

    /// Directory of the volume caches.
    pub fn volumes_dir(&self) -> PathBuf {
        self.data_dir.join("volumes")
    }

    /// The daemon's persisted volume list.
    pub fn state_path(&self) -> PathBuf {
        self.data_dir.join("state.json")
    }

    /// Checks every value; the first bad one is reported with its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key, value: String, reason: &str| {
            Err(ConfigError::Invalid {
                key,
                value,
                reason: reason.to_string(),
            })
        };
        if !self.data_dir.is_absolute() {
            return invalid(
                "data_dir",
                format!("{:?}", self.data_dir),
                "must be an absolute path",
            );
        }
        if !self.api.socket.is_absolute() {
            return invalid(
                "api.socket",
                format!("{:?}", self.api.socket),
                "must be an absolute path",
            );
        }
        self.api.validate_tcp()?;
        for (key, value, why) in [
            (
                "ublk.queue_threads",
                self.ublk.queue_threads,
                "must be 0 (a thread per queue) or 1..=256",
            ),
            (
                "ublk.own_thread_queues",
                self.ublk.own_thread_queues,
                "must be 0 (every device on the pool) or 1..=256",
            ),
        ] {
            let too_many = |n: u32| {
                usize::try_from(n).map_or(true, |n| n > ublk_core::queue::pool::MAX_POOL_THREADS)
            };
            if let Some(n) = value.filter(|&n| too_many(n)) {
                return invalid(key, n.to_string(), why);
            }
        }
        if self.api.max_body_bytes.0 < 1024 {
            return invalid(
                "api.max_body_bytes",
                self.api.max_body_bytes.0.to_string(),
                "must be at least 1K",
            );
        }
        for (key, value, max) in [
            (
                "api.header_read_timeout_secs",
                self.api.header_read_timeout_secs,
                3600,
            ),
            ("api.idle_timeout_secs", self.api.idle_timeout_secs, 86400),
            (
                "api.max_connections",
                self.api.max_connections as u64,
                65536,
            ),
        ] {
            if !(1..=max).contains(&value) {
                return invalid(key, value.to_string(), &format!("must be in 1..={max}"));
            }
        }
        if let Some(url) = &self.store.url {
            if url.trim().is_empty() {
                return invalid("store.url", format!("{url:?}"), "must not be empty");
            }
        }
        if let Some(e) = &self.store.s3_endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return invalid(
                    "store.s3_endpoint",
                    format!("{e:?}"),
                    "must be an http:// or https:// URL",
                );
            }
        }
        if self.store.upload_concurrency == 0 {
            return invalid("store.upload_concurrency", "0".into(), "must be at least 1");
        }
        let d = &self.volume_defaults;
        if !valid_block_size(d.block_size.0) {
            return invalid(
                "volume_defaults.block_size",
                d.block_size.0.to_string(),
                "must be a power of two in 4K..=16M",
            );
        }
        if d.queues == 0 || u64::from(d.queues) > limits::MAX_QUEUES {
            return invalid(
                "volume_defaults.queues",
                d.queues.to_string(),
                "must be in 1..=64",
            );
        }
        if d.queue_depth == 0 || u64::from(d.queue_depth) > limits::MAX_QUEUE_DEPTH {
            return invalid(
                "volume_defaults.queue_depth",
                d.queue_depth.to_string(),
                "must be in 1..=4096",
            );
        }
        if !(4 << 10..=16 << 20).contains(&d.max_io_bytes.0)
            || !d.max_io_bytes.0.is_multiple_of(4096)
        {
            return invalid(
                "volume_defaults.max_io_bytes",
                d.max_io_bytes.0.to_string(),
                "must be a multiple of 4K in 4K..=16M",
            );
        }
        if d.flush_threshold_bytes.0 == 0 {
            return invalid(
                "volume_defaults.flush_threshold_bytes",
                "0".into(),
                "must be at least 1",
            );
        }
        if d.flush_interval_secs == 0 {
            return invalid(
                "volume_defaults.flush_interval_secs",
                "0".into(),
                "must be at least 1",
            );
        }
        if !(1..=64).contains(&d.warm_parallel) {
            return invalid(
                "volume_defaults.warm_parallel",
                d.warm_parallel.to_string(),
                "must be in 1..=64",
            );
        }
        if self.gc.keep_manifests == 0 {
            return invalid("gc.keep_manifests", "0".into(), "must be at least 1");
        }
        let s = &self.space;
        if !(1..=100).contains(&s.compact_threshold_pct) {
            return invalid(
                "space.compact_threshold_pct",
                s.compact_threshold_pct.to_string(),
                "must be in 1..=100 (turn compaction off with compact_interval_secs = 0)",
            );
        }
        if s.compact_max_bytes.0 == 0 {
            return invalid(
                "space.compact_max_bytes",
                "0".into(),
                "must be at least 1 byte (turn compaction off with compact_interval_secs = 0)",
            );
        }
        let min_grace = glidefs_objstore::MIN_GC_GRACE.as_secs();
        if self.gc.grace_secs < min_grace && !self.gc.allow_short_grace {
            return invalid(
                "gc.grace_secs",
                self.gc.grace_secs.to_string(),
                &format!(
                    "must be at least {min_grace} (packs uploaded longer ago are checked again \
                     before a publish, after half that time), or set gc.allow_short_grace"
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ublk_core::{BatchIo, TransportPreference};

    #[test]
    fn defaults_are_valid_and_documented_values() {
        let c = Config::parse("", "test").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.store_url(), "file:///var/lib/glidefs/store");
        assert_eq!(c.api.socket, PathBuf::from("/run/glidefs/api.sock"));
        assert_eq!(c.volume_defaults.block_size.0, 128 << 10);
        assert_eq!(c.volume_defaults.flush_threshold_bytes.0, 64 << 20);
    }

    #[test]
    fn the_example_file_parses_to_the_defaults_plus_its_overrides() {
        let text = include_str!("../../../glidefs/glidefs.example.toml");
        let c = Config::parse(text, "glidefs.example.toml").unwrap();
        assert_eq!(c.volume_defaults, VolumeDefaults::default());
        assert_eq!(c.api, ApiSection::default());
        assert_eq!(c.store, StoreSection::default());
        assert_eq!(c.data_dir, Config::default().data_dir);
    }

    #[test]
    fn the_environment_overrides_the_file_and_carries_what_the_file_must_not() {
        let file = "[store]\ns3_endpoint = \"http://file:9000\"\n[ublk]\ntransport = \"auto\"\n\
                    [log]\nformat = \"json\"\nfilter = \"warn\"\n";
        let mut c = Config::parse(file, "f.toml").unwrap();
        assert_eq!(c.store.s3_endpoint.as_deref(), Some("http://file:9000"));
        let untouched = c.clone();
        c.apply_env(&Environment::default());
        assert_eq!(c, untouched, "an empty environment changes nothing");
        let env = Environment {
            log_filter: Some("debug".into()),
            log_format: Some("text".into()),
            force_user_copy: true,
            s3_endpoint: Some("http://env:9000".into()),
            aws: vec![("AWS_REGION".into(), "eu-west-3".into())],
            fault_ring_after: Some(7),
            ..Environment::default()
        };
        c.apply_env(&env);
        assert_eq!(
            (c.log.format, c.log.filter.as_str()),
            (LogFormat::Text, "debug")
        );
        assert_eq!(c.ublk.transport, TransportChoice::UserCopy);
        assert_eq!(c.ublk.transport.preference(), TransportPreference::UserCopy);
        assert_eq!(c.ublk.fault_ring_after, Some(7));
        let s3 = c.s3_options();
        assert_eq!(s3.endpoint.as_deref(), Some("http://env:9000"));
        assert_eq!(s3.settings, env.aws);
        let shown = toml::to_string(&c).unwrap();
        assert!(
            !shown.contains("eu-west-3"),
            "settings from AWS_* never serialize: {shown}"
        );
        let err = Config::parse("[ublk]\ntransport = \"zero\"\n", "f.toml").unwrap_err();
        assert!(err.to_string().contains("zero"), "{err}");
        let err = Config::parse("[store]\ns3_endpoint = \"minio:9000\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("store.s3_endpoint") && err.contains("minio:9000"),
            "{err}"
        );
    }

    #[test]
    fn s3_put_protection_comes_from_the_file_and_the_environment_overrides_it() {
        assert_eq!(
            (
                Config::default().store.s3_unsigned_payload,
                Config::default().store.s3_checksum
            ),
            (UnsignedPayload::Auto, S3Checksum::Auto)
        );
        let file = "[store]\ns3_unsigned_payload = \"off\"\ns3_checksum = \"crc64nvme\"\n";
        let mut c = Config::parse(file, "f.toml").unwrap();
        let s3 = c.s3_options();
        assert_eq!(
            (s3.unsigned_payload, s3.checksum),
            (UnsignedPayload::Off, S3Checksum::Crc64nvme)
        );
        c.apply_env(&Environment {
            s3_unsigned_payload: Some("on".into()),
            s3_checksum: Some("off".into()),
            ..Environment::default()
        });
        let s3 = c.s3_options();
        assert_eq!(
            (s3.unsigned_payload, s3.checksum),
            (UnsignedPayload::On, S3Checksum::Off)
        );

        let err = Config::parse("[store]\ns3_unsigned_payload = \"yes\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("s3_unsigned_payload") && err.contains("yes"),
            "{err}"
        );
        for (env, needle) in [
            (
                Environment {
                    s3_unsigned_payload: Some("yes".into()),
                    ..Environment::default()
                },
                "GLIDEFS_S3_UNSIGNED_PAYLOAD",
            ),
            (
                Environment {
                    s3_checksum: Some("sha256".into()),
                    ..Environment::default()
                },
                "GLIDEFS_S3_CHECKSUM",
            ),
        ] {
            let err = Config::locate(None, &env).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = Config::parse("[api]\nsockett = \"/x\"\n", "f.toml").unwrap_err();
        assert!(err.to_string().contains("sockett"), "{err}");
        let err = Config::parse("colour = 1\n", "f.toml").unwrap_err();
        assert!(err.to_string().contains("colour"), "{err}");
    }

    #[test]
    fn invalid_values_are_named_with_the_value() {
        for (text, needle) in [
            ("[api]\ntcp = \"127.0.0.1:7070\"\n", "api.tcp"),
            ("[volume_defaults]\nblock_size = \"3K\"\n", "3072"),
            ("[volume_defaults]\nqueues = 0\n", "volume_defaults.queues"),
            (
                "[volume_defaults]\nflush_interval_secs = 0\n",
                "flush_interval_secs",
            ),
            ("data_dir = \"relative\"\n", "\"relative\""),
            ("[volume_defaults]\nblock_size = \"lots\"\n", "`lots`"),
            // a wrong type: the parser's message shows the line with key and value
            ("[volume_defaults]\nqueues = \"two\"\n", "queues = \"two\""),
        ] {
            let err = Config::parse(text, "f.toml").unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn queue_threads_default_to_the_cpus_and_zero_means_a_thread_per_queue() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let c = Config::default();
        assert_eq!(c.ublk.pool_threads(), Some(cpus.clamp(1, 32)));
        let c = Config::parse("[ublk]\nqueue_threads = 0\n", "f.toml").unwrap();
        assert_eq!(c.ublk.pool_threads(), None);
        let c = Config::parse("[ublk]\nqueue_threads = 3\n", "f.toml").unwrap();
        assert_eq!(c.ublk.pool_threads(), Some(3));
        let err = Config::parse("[ublk]\nqueue_threads = 300\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ublk.queue_threads") && err.contains("300"),
            "{err}"
        );
    }

    #[test]
    fn own_thread_queues_default_to_the_cpus_and_all_without_a_pool() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(
            Config::default().ublk.own_thread_queues(),
            cpus.clamp(1, 32)
        );
        let c = Config::parse("[ublk]\nown_thread_queues = 0\n", "f.toml").unwrap();
        assert_eq!(c.ublk.own_thread_queues(), 0);
        let c = Config::parse("[ublk]\nown_thread_queues = 6\n", "f.toml").unwrap();
        assert_eq!(c.ublk.own_thread_queues(), 6);
        let text = "[ublk]\nqueue_threads = 0\nown_thread_queues = 6\n";
        let c = Config::parse(text, "f.toml").unwrap();
        assert_eq!(c.ublk.own_thread_queues(), usize::MAX);
        let err = Config::parse("[ublk]\nown_thread_queues = 257\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("ublk.own_thread_queues") && err.contains("257"),
            "{err}"
        );
    }

    #[test]
    fn batch_io_is_off_by_default_set_by_the_file_and_overridden_by_the_environment() {
        assert_eq!(Config::default().ublk.batch_io, BatchIoChoice::Off);
        assert_eq!(Config::default().ublk.batch_io.option(), BatchIo::Off);
        let c = Config::parse("[ublk]\nbatch_io = \"auto\"\n", "f.toml").unwrap();
        assert_eq!(c.ublk.batch_io.option(), BatchIo::Auto);
        let err = Config::parse("[ublk]\nbatch_io = \"yes\"\n", "f.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("batch_io") || err.contains("yes"), "{err}");
        let env = Environment {
            batch_io: Some("on".into()),
            ..Environment::default()
        };
        let c = Config::locate(None, &env).unwrap();
        assert_eq!(c.ublk.batch_io.option(), BatchIo::On);
        let env = Environment {
            batch_io: Some("sometimes".into()),
            ..Environment::default()
        };
        let err = Config::locate(None, &env).unwrap_err().to_string();
        assert!(
            err.contains("GLIDEFS_BATCH_IO") && err.contains("sometimes"),
            "{err}"
        );
    }

    #[test]
    fn api_listener_limits_default_to_the_documented_values_and_are_bounded() {
        let c = Config::default();
        assert_eq!(
            (
                c.api.header_read_timeout_secs,
                c.api.idle_timeout_secs,
                c.api.max_connections
            ),
            (10, 60, 64)
        );
        for (text, needle) in [
            (
                "[api]\nheader_read_timeout_secs = 0\n",
                "api.header_read_timeout_secs",
            ),
            ("[api]\nidle_timeout_secs = 0\n", "api.idle_timeout_secs"),
            ("[api]\nmax_connections = 0\n", "api.max_connections"),
            ("[api]\nmax_connections = 70000\n", "70000"),
        ] {
            let err = Config::parse(text, "f.toml").unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn tcp_needs_tls_off_loopback_and_tls_needs_both_files_and_a_listener() {
        let tcp = |addr: &str, extra: &str| {
            format!("[api]\ntcp = \"{addr}\"\ntoken_file = \"/t\"\n{extra}")
        };
        let tls = "tls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"\n";
        for ok in [
            tcp("127.0.0.1:1", ""),
            tcp("[::1]:1", ""),
            tcp("0.0.0.0:1", tls),
            tcp("[::]:1", tls),
        ] {
            let c = Config::parse(&ok, "f.toml").unwrap();
            assert_eq!(c.api.tls(), ok.contains("tls_cert"), "{ok}");
        }
        for (text, needle) in [
            (tcp("0.0.0.0:7070", ""), "0.0.0.0:7070"),
            (tcp("10.0.0.1:7070", ""), "TLS"),
            (tcp("0.0.0.0:1", "tls_cert = \"/c.pem\"\n"), "api.tls_cert"),
            (tcp("0.0.0.0:1", "tls_key = \"/k.pem\"\n"), "api.tls_key"),
            (format!("[api]\n{tls}"), "set api.tcp"),
        ] {
            let err = Config::parse(&text, "f.toml").unwrap_err().to_string();
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn sizes_accept_suffixes() {
        let c = Config::parse(
            "[volume_defaults]\nflush_threshold_bytes = \"1M\"\nblock_size = 65536\n",
            "f",
        )
        .unwrap();
        assert_eq!(c.volume_defaults.flush_threshold_bytes.0, 1 << 20);
        assert_eq!(c.volume_defaults.block_size.0, 65536);
    }

    #[test]
    fn gc_grace_below_the_floor_is_refused() {
        for secs in [0, 599] {
            let err = Config::parse(&format!("[gc]\ngrace_secs = {secs}\n"), "f.toml")
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("gc.grace_secs") && err.contains(&format!("= {secs}")),
                "{err}"
            );
        }
        let c = Config::parse("[gc]\ngrace_secs = 600\n", "f.toml").unwrap();
        assert_eq!(c.gc.grace_secs, 600);
        let c =
            Config::parse("[gc]\ngrace_secs = 0\nallow_short_grace = true\n", "f.toml").unwrap();
        assert_eq!((c.gc.grace_secs, c.gc.allow_short_grace), (0, true));
    }
}
