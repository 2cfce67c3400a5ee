//! What glidefs takes from the process environment, read once.
//!
//! Contract: the binary calls [`Environment::from_vars`] with `std::env::vars_os()` once, at
//! start; nothing else in the workspace reads the environment (library crates take values).
//! [`crate::config::Config::locate`] folds the settings into the [`Config`] they override, so
//! every input the daemon acts on is in one place.
//!
//! | variable                     | effect                                                    |
//! | ---------------------------- | --------------------------------------------------------- |
//! | `GLIDEFS_CONFIG`             | the config file when `--config` is absent                 |
//! | `GLIDEFS_LOG`                | overrides `log.filter`                                    |
//! | `GLIDEFS_LOG_FORMAT`         | `text` or `json`, overrides `log.format`                  |
//! | `GLIDEFS_FORCE_USER_COPY`    | anything but `0` sets `ublk.transport = "user-copy"`      |
//! | `GLIDEFS_S3_ENDPOINT`        | overrides `store.s3_endpoint`                             |
//! | `GLIDEFS_S3_UNSIGNED_PAYLOAD`| `auto`, `on` or `off`: overrides `store.s3_unsigned_payload` |
//! | `GLIDEFS_S3_CHECKSUM`        | `auto`, `crc64nvme` or `off`: overrides `store.s3_checksum` |
//! | `GLIDEFS_BATCH_IO`           | `auto`, `on` or `off`: overrides `ublk.batch_io`           |
//! | `AWS_*`                      | S3 client settings (credentials, region, `AWS_TIMEOUT`; not `AWS_UNSIGNED_PAYLOAD` nor `AWS_CHECKSUM_ALGORITHM`: the two above decide those) |
//! | `UBLK_CORE_FAULT_RING_AFTER` | test hook: queue rings fail after N requests              |
//! | `GLIDEFS_KEY_*`              | volume encryption keys (`encryption_key_env` names one)   |
//!
//! An empty value counts as unset (a CI matrix or a unit file may pass `""`); a value that is
//! not UTF-8 is skipped. [`Config::locate`] rejects a `GLIDEFS_S3_UNSIGNED_PAYLOAD`,
//! `GLIDEFS_S3_CHECKSUM` or `GLIDEFS_BATCH_IO` that is not one of its names.
//!
//! [`Config`]: crate::config::Config

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

/// Environment variable naming the config file when `--config` is absent.
pub const CONFIG_ENV: &str = "GLIDEFS_CONFIG";
/// Environment variable with `tracing` filter directives.
pub const LOG_ENV: &str = "GLIDEFS_LOG";
/// Environment variable choosing `text` or `json` log lines.
pub const LOG_FORMAT_ENV: &str = "GLIDEFS_LOG_FORMAT";
/// Environment variable that forces USER_COPY on a zero-copy capable kernel.
pub const FORCE_USER_COPY_ENV: &str = "GLIDEFS_FORCE_USER_COPY";
/// Environment variable naming a custom S3 endpoint (MinIO, Ceph, a test server, ...).
pub const S3_ENDPOINT_ENV: &str = "GLIDEFS_S3_ENDPOINT";
/// Environment variable choosing whether S3 PUT bodies are left out of the signature.
pub const S3_UNSIGNED_PAYLOAD_ENV: &str = "GLIDEFS_S3_UNSIGNED_PAYLOAD";
/// Environment variable choosing the checksum header of S3 PUTs.
pub const S3_CHECKSUM_ENV: &str = "GLIDEFS_S3_CHECKSUM";
/// Environment variable choosing whether new devices use `UBLK_F_BATCH_IO`.
pub const BATCH_IO_ENV: &str = "GLIDEFS_BATCH_IO";
/// Prefix of the environment variables that may hold volume encryption keys.
pub const KEY_ENV_PREFIX: &str = "GLIDEFS_KEY_";
/// Test hook: queue loops fail their ring after this many requests.
pub const FAULT_RING_AFTER_ENV: &str = "UBLK_CORE_FAULT_RING_AFTER";

/// The settings the environment carries (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Environment {
    /// `GLIDEFS_CONFIG`.
    pub config: Option<PathBuf>,
    /// `GLIDEFS_LOG`.
    pub log_filter: Option<String>,
    /// `GLIDEFS_LOG_FORMAT`, as given (the config decides what it accepts).
    pub log_format: Option<String>,
    /// `GLIDEFS_FORCE_USER_COPY` set to anything but `0`.
    pub force_user_copy: bool,
    /// `GLIDEFS_S3_ENDPOINT`.
    pub s3_endpoint: Option<String>,
    /// `GLIDEFS_S3_UNSIGNED_PAYLOAD`, as given (the config decides what it accepts).
    pub s3_unsigned_payload: Option<String>,
    /// `GLIDEFS_S3_CHECKSUM`, as given (the config decides what it accepts).
    pub s3_checksum: Option<String>,
    /// `GLIDEFS_BATCH_IO`, as given (the config decides what it accepts).
    pub batch_io: Option<String>,
    /// Every `AWS_*` variable, in the order given.
    pub aws: Vec<(String, String)>,
    /// `UBLK_CORE_FAULT_RING_AFTER`, when it is a number.
    pub fault_ring_after: Option<u64>,
    /// Every `GLIDEFS_KEY_*` variable (volume encryption keys).
    pub keys: KeyVars,
}

/// The `GLIDEFS_KEY_*` variables the daemon started with, by name: where a volume created
/// with `encryption_key_env` finds its key, at create and at every later start. `Debug`
/// shows the names only, never the values.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct KeyVars(BTreeMap<String, String>);

impl std::fmt::Debug for KeyVars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl KeyVars {
    /// The value of variable `name`, if the daemon started with it (and it is not empty).
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Sets variable `name` (tests, and `Environment::from_vars`).
    pub fn insert(&mut self, name: impl Into<String>, value: impl Into<String>) {
        self.0.insert(name.into(), value.into());
    }
}

impl Environment {
    /// Gathers the settings from `vars` (the binary passes `std::env::vars_os()`).
    pub fn from_vars(vars: impl IntoIterator<Item = (OsString, OsString)>) -> Self {
        let mut env = Environment::default();
        for (name, value) in vars {
            let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
                continue;
            };
            if value.is_empty() {
                continue;
            }
            let value = value.to_string();
            match name {
                CONFIG_ENV => env.config = Some(PathBuf::from(value)),
                LOG_ENV => env.log_filter = Some(value),
                LOG_FORMAT_ENV => env.log_format = Some(value),
                FORCE_USER_COPY_ENV => env.force_user_copy = value != "0",
                S3_ENDPOINT_ENV => env.s3_endpoint = Some(value),
                S3_UNSIGNED_PAYLOAD_ENV => env.s3_unsigned_payload = Some(value),
                S3_CHECKSUM_ENV => env.s3_checksum = Some(value),
                BATCH_IO_ENV => env.batch_io = Some(value),
                FAULT_RING_AFTER_ENV => env.fault_ring_after = value.trim().parse().ok(),
                n if n.starts_with("AWS_") => env.aws.push((n.to_string(), value)),
                n if n.starts_with(KEY_ENV_PREFIX) => env.keys.insert(n, value),
                _ => {}
            }
        }
        env
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, &str)]) -> Environment {
        Environment::from_vars(vars.iter().map(|(k, v)| (k.into(), v.into())))
    }

    #[test]
    fn force_user_copy_is_any_value_but_empty_or_zero() {
        for (value, forced) in [("1", true), ("yes", true), ("0", false), ("", false)] {
            let e = env(&[(FORCE_USER_COPY_ENV, value)]);
            assert_eq!(e.force_user_copy, forced, "{FORCE_USER_COPY_ENV}={value:?}");
        }
        assert!(!env(&[]).force_user_copy);
    }

    #[test]
    fn every_variable_lands_in_its_field_and_empty_values_count_as_unset() {
        let e = env(&[
            (CONFIG_ENV, "/etc/g.toml"),
            (LOG_ENV, "debug"),
            (LOG_FORMAT_ENV, "json"),
            (S3_ENDPOINT_ENV, "http://127.0.0.1:9000"),
            (S3_UNSIGNED_PAYLOAD_ENV, "on"),
            (S3_CHECKSUM_ENV, "crc64nvme"),
            ("AWS_REGION", "eu-west-3"),
            ("AWS_SECRET_ACCESS_KEY", ""),
            ("AWS_TIMEOUT", "9s"),
            (FAULT_RING_AFTER_ENV, " 1500 "),
            ("HOME", "/root"),
            ("GLIDEFS_KEY_VOL1", "00ff"),
            ("GLIDEFS_KEY_EMPTY", ""),
        ]);
        assert_eq!(e.keys.get("GLIDEFS_KEY_VOL1"), Some("00ff"));
        assert_eq!(e.keys.get("GLIDEFS_KEY_EMPTY"), None);
        assert_eq!(e.keys.get("HOME"), None);
        assert!(!format!("{e:?}").contains("00ff"), "Debug hides key values");
        assert_eq!(e.config, Some(PathBuf::from("/etc/g.toml")));
        assert_eq!(e.log_filter.as_deref(), Some("debug"));
        assert_eq!(e.log_format.as_deref(), Some("json"));
        assert_eq!(e.s3_endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(e.s3_unsigned_payload.as_deref(), Some("on"));
        assert_eq!(e.s3_checksum.as_deref(), Some("crc64nvme"));
        assert_eq!(
            e.aws,
            vec![
                ("AWS_REGION".to_string(), "eu-west-3".to_string()),
                ("AWS_TIMEOUT".to_string(), "9s".to_string()),
            ]
        );
        assert_eq!(e.fault_ring_after, Some(1500));
        assert_eq!(env(&[(S3_ENDPOINT_ENV, "")]).s3_endpoint, None);
    }

    #[test]
    fn values_that_are_not_utf8_are_skipped() {
        use std::os::unix::ffi::OsStringExt;
        let bad = OsString::from_vec(vec![0xff, 0xfe]);
        let e = Environment::from_vars([(OsString::from(LOG_ENV), bad)]);
        assert_eq!(e, Environment::default());
    }
}
