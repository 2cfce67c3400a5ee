//! Opening an object store from a URL.
//!
//! | URL                          | store                                                        |
//! | ---------------------------- | ------------------------------------------------------------ |
//! | `file:///abs/dir` or `/abs/dir` | `LocalFileSystem` rooted at the directory (created if missing), fsync on |
//! | `memory://`                  | a fresh `InMemory` store (tests, demos)                      |
//! | `s3://bucket[/prefix]`       | `AmazonS3` configured from [`S3Options`] (credentials, region, request timeout: 5 min unless the options set `AWS_TIMEOUT`; no client retries, see below; how PUT bodies are protected, see below); [`S3Options::endpoint`] points it at a custom endpoint (path-style; plain `http://` allowed), `prefix` scopes every key |
//!
//! The crate reads no environment: the caller gathers the settings (glidefs's binary passes
//! its `AWS_*` variables and `GLIDEFS_S3_ENDPOINT` in [`S3Options`]).
//!
//! One retry layer: the S3 client's own retries are off ([`without_client_retries`]), so every
//! call of the crate is one HTTP request per attempt of its `with_retry` loop (`1 +
//! StoreConfig::max_retries` attempts for a transient error, backoff from
//! `retry_base_delay` doubling to `retry_max_delay`), and the `attempts` an error reports is the
//! number of requests sent. object_store's default (10 retries in a 3-minute budget) inside
//! that loop made a persistent 503 take up to 11 times as many requests, and minutes.
//!
//! PUT bodies ([`put_integrity`], issue 26 "CPU per byte"): SigV4 by default hashes every body
//! with SHA-256 into the signature (`x-amz-content-sha256`), on top of the CRCs our pack frames
//! carry. [`UnsignedPayload::Auto`] sends `UNSIGNED-PAYLOAD` instead where TLS already
//! protects the body in transit (an `https://` endpoint, AWS itself) and keeps the hash over
//! plain `http://`, where it is the only transport check a server makes. [`S3Checksum::Auto`]
//! adds `x-amz-checksum-crc64nvme` (a CRC of the body the server verifies before it stores
//! the object, `BadDigest` otherwise) for AWS itself, which verifies it; other servers may not
//! know the header, so they get it only when asked ([`S3Checksum::Crc64nvme`]). Both are
//! settled here only: `AWS_UNSIGNED_PAYLOAD` and `AWS_CHECKSUM_ALGORITHM` in
//! [`S3Options::settings`] are ignored.

use std::str::FromStr;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey, Checksum};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};
use serde::{Deserialize, Serialize};

use crate::error::ObjStoreError;

/// How S3 clients are configured (ignored by `file://` and `memory://` stores).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// A custom endpoint (MinIO, Ceph, a test server, ...): path-style requests, plain
    /// `http://` allowed. `None`: AWS.
    pub endpoint: Option<String>,
    /// Client settings as `AWS_*` names or object_store's config keys (`AWS_ACCESS_KEY_ID`,
    /// `aws_region`, `AWS_TIMEOUT`, ...), applied in order; names object_store does not know
    /// are ignored, as `AmazonS3Builder::from_env` ignores them, and so are its unsigned
    /// payload and checksum keys (the two fields below decide those).
    pub settings: Vec<(String, String)>,
    /// Whether PUT bodies are left out of the SigV4 signature (see the module docs).
    pub unsigned_payload: UnsignedPayload,
    /// Which checksum header PUTs carry for the server to verify (see the module docs).
    pub checksum: S3Checksum,
}

/// Whether S3 PUT bodies are hashed (SHA-256) into their SigV4 signature.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnsignedPayload {
    /// Unsigned over `https://` and to AWS (TLS protects the body in transit), signed over
    /// plain `http://`.
    #[default]
    Auto,
    /// Never hashed: `x-amz-content-sha256: UNSIGNED-PAYLOAD`. Over plain `http://` a body
    /// damaged in transit is then stored unless the server verifies a checksum header
    /// ([`S3Checksum::Crc64nvme`]); the pack CRCs still catch it, but only when it is read.
    On,
    /// Always hashed (object_store's default): one SHA-256 pass over every body.
    Off,
}

/// The checksum header S3 PUTs carry for the server to verify before it stores the object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum S3Checksum {
    /// `crc64nvme` for AWS itself (no custom endpoint), none for custom endpoints (a server
    /// that does not know the header may reject every PUT, or ignore it).
    #[default]
    Auto,
    /// `x-amz-checksum-crc64nvme`: a SIMD CRC of the body, far cheaper than SHA-256. AWS S3
    /// verifies it (`BadDigest` on a mismatch); so do recent MinIO and the test server.
    Crc64nvme,
    /// No checksum header.
    Off,
}

/// A value of [`UnsignedPayload`] or [`S3Checksum`] that is not one of its names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not one of {expected}")]
pub struct ParseChoiceError {
    value: String,
    expected: String,
}

/// The choice `s` names among `choices` (any case; surrounding spaces ignored).
fn parse_choice<T: Copy>(s: &str, choices: &[(&str, T)]) -> Result<T, ParseChoiceError> {
    let name = s.trim().to_ascii_lowercase();
    choices
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, choice)| *choice)
        .ok_or_else(|| ParseChoiceError {
            value: s.to_string(),
            expected: choices
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", "),
        })
}

impl FromStr for UnsignedPayload {
    type Err = ParseChoiceError;

    /// `auto`, `on` or `off`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        parse_choice(
            s,
            &[("auto", Self::Auto), ("on", Self::On), ("off", Self::Off)],
        )
    }
}

impl FromStr for S3Checksum {
    type Err = ParseChoiceError;

    /// `auto`, `crc64nvme` or `off`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let choices = [
            ("auto", Self::Auto),
            ("crc64nvme", Self::Crc64nvme),
            ("off", Self::Off),
        ];
        parse_choice(s, &choices)
    }
}

/// What an S3 client sends with each PUT body ([`put_integrity`] decides it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutIntegrity {
    /// `UNSIGNED-PAYLOAD` instead of the body's SHA-256 in the signature.
    pub unsigned_payload: bool,
    /// The checksum header, if any.
    pub checksum: Option<Checksum>,
}

/// The PUT protection of a client whose endpoint is `endpoint` (`None`: AWS itself, always
/// `https://`), as `unsigned` and `checksum` ask (see the module docs).
pub fn put_integrity(
    endpoint: Option<&str>,
    unsigned: UnsignedPayload,
    checksum: S3Checksum,
) -> PutIntegrity {
    let tls = endpoint.is_none_or(|e| {
        e.trim_start()
            .get(..8)
            .is_some_and(|scheme| scheme.eq_ignore_ascii_case("https://"))
    });
    PutIntegrity {
        unsigned_payload: match unsigned {
            UnsignedPayload::Auto => tls,
            UnsignedPayload::On => true,
            UnsignedPayload::Off => false,
        },
        checksum: match checksum {
            S3Checksum::Auto if endpoint.is_none() => Some(Checksum::CRC64NVME),
            S3Checksum::Auto | S3Checksum::Off => None,
            S3Checksum::Crc64nvme => Some(Checksum::CRC64NVME),
        },
    }
}

impl S3Options {
    /// The value of setting `name` (matched without regard to case), the last one wins.
    fn setting(&self, name: &str) -> Option<&str> {
        self.settings
            .iter()
            .rev()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Request timeout of S3 clients unless `AWS_TIMEOUT` sets one. object_store's own default
/// (30 s) bounds a whole PUT, body included: a 16 MiB pack over a link slower than ~0.5 MiB/s
/// per upload could never finish, and every retry sent it whole again (a flush that stalls
/// for good). 5 minutes lets a pack through at ~56 KiB/s; connecting keeps its 5 s limit.
pub const S3_DEFAULT_TIMEOUT: &str = "300s";

/// Opens the store a URL names; see the module docs for the forms accepted.
pub fn open_store(url: &str, s3: &S3Options) -> Result<Arc<dyn ObjectStore>, ObjStoreError> {
    let bad = |reason: String| ObjStoreError::BadUrl {
        url: url.to_string(),
        reason,
    };
    if url.starts_with('/') {
        return open_dir(url, url);
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad(
            "expected file:///dir, memory:// or s3://bucket[/prefix]".to_string(),
        ));
    };
    match scheme {
        "memory" => {
            if !rest.is_empty() {
                return Err(bad("memory:// takes no path".to_string()));
            }
            Ok(Arc::new(InMemory::new()))
        }
        "file" => {
            if !rest.starts_with('/') {
                return Err(bad(
                    "file URLs need an absolute path: file:///abs/dir".to_string()
                ));
            }
            open_dir(url, rest)
        }
        "s3" => {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("missing bucket name: s3://bucket[/prefix]".to_string()));
            }
            let (builder, integrity) = s3_builder(bucket, s3);
            let s3 = builder
                .build()
                .map_err(|e| bad(format!("S3 configuration: {e}")))?;
            tracing::info!(
                url,
                unsigned_payload = integrity.unsigned_payload,
                checksum = ?integrity.checksum,
                "S3 client: PUT body protection"
            );
            let prefix = prefix.trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, prefix)))
            }
        }
        other => Err(bad(format!(
            "unsupported scheme `{other}` (use file, memory or s3)"
        ))),
    }
}

/// The client of `bucket` that `s3` configures, and the PUT protection it was given.
fn s3_builder(bucket: &str, s3: &S3Options) -> (AmazonS3Builder, PutIntegrity) {
    let mut builder = without_client_retries(with_timeout(
        with_settings(AmazonS3Builder::new(), &s3.settings).with_bucket_name(bucket),
        s3.setting("AWS_TIMEOUT").filter(|v| !v.is_empty()),
    ));
    if let Some(endpoint) = s3.endpoint.as_deref().filter(|e| !e.is_empty()) {
        builder = builder
            .with_endpoint(endpoint)
            .with_allow_http(endpoint.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    // The endpoint in effect: `endpoint`, else an `AWS_ENDPOINT` setting, else AWS.
    let endpoint = builder
        .get_config_value(&AmazonS3ConfigKey::Endpoint)
        .filter(|e| !e.is_empty());
    let integrity = put_integrity(endpoint.as_deref(), s3.unsigned_payload, s3.checksum);
    builder = builder.with_unsigned_payload(integrity.unsigned_payload);
    if let Some(checksum) = integrity.checksum {
        builder = builder.with_checksum_algorithm(checksum);
    }
    (builder, integrity)
}

/// Applies `settings` the way `AmazonS3Builder::from_env` applies the environment: each name
/// object_store knows (case-insensitive) sets its key, others are skipped, and so are the
/// unsigned payload and checksum keys ([`put_integrity`] decides those).
fn with_settings(builder: AmazonS3Builder, settings: &[(String, String)]) -> AmazonS3Builder {
    settings.iter().fold(builder, |b, (name, value)| {
        match name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            Ok(AmazonS3ConfigKey::UnsignedPayload | AmazonS3ConfigKey::Checksum) | Err(_) => b,
            Ok(key) => b.with_config(key, value),
        }
    })
}

/// Sets the request timeout: `timeout` (the `AWS_TIMEOUT` setting, non-empty) when given, else
/// [`S3_DEFAULT_TIMEOUT`] (the builder cannot tell: it reports object_store's 30 s default as
/// if it were set).
fn with_timeout(builder: AmazonS3Builder, timeout: Option<&str>) -> AmazonS3Builder {
    let key = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
    builder.with_config(key, timeout.unwrap_or(S3_DEFAULT_TIMEOUT))
}

/// Turns object_store's own request retries off: the crate's `with_retry` is the one retry
/// layer (see the module docs).
fn without_client_retries(builder: AmazonS3Builder) -> AmazonS3Builder {
    builder.with_retry(RetryConfig {
        max_retries: 0,
        ..RetryConfig::default()
    })
}

fn open_dir(url: &str, dir: &str) -> Result<Arc<dyn ObjectStore>, ObjStoreError> {
    let bad = |reason: String| ObjStoreError::BadUrl {
        url: url.to_string(),
        reason,
    };
    std::fs::create_dir_all(dir).map_err(|e| bad(format!("cannot create `{dir}`: {e}")))?;
    let fs = LocalFileSystem::new_with_prefix(dir)
        .map_err(|e| bad(format!("cannot use `{dir}`: {e}")))?
        .with_fsync(true);
    Ok(Arc::new(fs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn bad_urls_are_explained() {
        for (url, needle) in [
            ("ftp://x", "unsupported scheme `ftp`"),
            ("file://relative/dir", "absolute path"),
            ("s3://", "missing bucket"),
            ("memory://x", "takes no path"),
            ("just-a-name", "expected file:///dir"),
        ] {
            let err = open_store(url, &S3Options::default()).expect_err(url);
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
            let msg = err.to_string();
            assert!(msg.contains(needle) && msg.contains(url), "{url}: {msg}");
        }
    }

    #[test]
    fn s3_requests_get_a_long_timeout_unless_the_settings_have_one() {
        let timeout = AmazonS3ConfigKey::Client(ClientConfigKey::Timeout);
        let default = with_timeout(AmazonS3Builder::new(), None);
        assert_eq!(
            default.get_config_value(&timeout).as_deref(),
            Some(S3_DEFAULT_TIMEOUT)
        );
        let set = with_timeout(AmazonS3Builder::new(), Some("7s"));
        assert_eq!(set.get_config_value(&timeout).as_deref(), Some("7s"));
    }

    #[test]
    fn settings_take_aws_names_and_config_keys_and_skip_unknown_ones() {
        let settings: Vec<(String, String)> = [
            ("AWS_REGION", "eu-west-3"),
            ("aws_access_key_id", "key"),
            ("AWS_NOT_A_SETTING", "x"),
            ("AWS_TIMEOUT", "9s"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let b = with_settings(AmazonS3Builder::new(), &settings);
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::Region).as_deref(),
            Some("eu-west-3")
        );
        assert_eq!(
            b.get_config_value(&AmazonS3ConfigKey::AccessKeyId)
                .as_deref(),
            Some("key")
        );
        let opts = S3Options {
            endpoint: None,
            settings,
            ..S3Options::default()
        };
        assert_eq!(opts.setting("aws_timeout"), Some("9s"));
    }

    #[test]
    fn auto_leaves_bodies_unsigned_over_tls_only_and_adds_crc64nvme_for_aws_only() {
        use S3Checksum as C;
        use UnsignedPayload as U;
        let crc = Some(Checksum::CRC64NVME);
        // Given each endpoint and choice, when the protection is decided, then:
        for (endpoint, unsigned, checksum, want_unsigned, want_checksum) in [
            // auto: https (and AWS itself) -> unsigned; plain http -> signed
            (
                Some("https://minio.example:9000"),
                U::Auto,
                C::Auto,
                true,
                None,
            ),
            (Some("HTTPS://minio.example"), U::Auto, C::Auto, true, None),
            (Some("http://127.0.0.1:9000"), U::Auto, C::Auto, false, None),
            (None, U::Auto, C::Auto, true, crc),
            // forced either way, whatever the scheme
            (Some("http://127.0.0.1:9000"), U::On, C::Auto, true, None),
            (Some("https://minio.example"), U::Off, C::Auto, false, None),
            (None, U::Off, C::Auto, false, crc),
            // the checksum asked for, or turned off
            (
                Some("http://127.0.0.1:9000"),
                U::On,
                C::Crc64nvme,
                true,
                crc,
            ),
            (None, U::Auto, C::Off, true, None),
        ] {
            let got = put_integrity(endpoint, unsigned, checksum);
            let want = PutIntegrity {
                unsigned_payload: want_unsigned,
                checksum: want_checksum,
            };
            assert_eq!(got, want, "{endpoint:?} {unsigned:?} {checksum:?}");
        }
    }

    #[test]
    fn the_builder_gets_the_protection_decided_and_aws_settings_cannot_override_it() {
        let config = |b: &AmazonS3Builder, key| b.get_config_value(&key);
        let settings: Vec<(String, String)> = [
            ("AWS_UNSIGNED_PAYLOAD", "true"),
            ("AWS_CHECKSUM_ALGORITHM", "sha256"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let http = S3Options {
            endpoint: Some("http://127.0.0.1:9000".into()),
            settings: settings.clone(),
            ..S3Options::default()
        };
        let (b, integrity) = s3_builder("bucket", &http);
        assert!(!integrity.unsigned_payload, "auto signs over plain http");
        assert_eq!(
            config(&b, AmazonS3ConfigKey::UnsignedPayload).as_deref(),
            Some("false")
        );
        assert_eq!(config(&b, AmazonS3ConfigKey::Checksum), None);

        // An https endpoint from the AWS_ENDPOINT setting counts as the endpoint.
        let mut https = S3Options {
            endpoint: None,
            settings,
            ..S3Options::default()
        };
        https
            .settings
            .push(("AWS_ENDPOINT".into(), "https://s3.example".into()));
        let (b, integrity) = s3_builder("bucket", &https);
        assert!(integrity.unsigned_payload && integrity.checksum.is_none());
        assert_eq!(
            config(&b, AmazonS3ConfigKey::UnsignedPayload).as_deref(),
            Some("true")
        );

        // AWS itself: unsigned, with the CRC64NVME header.
        let (b, _) = s3_builder("bucket", &S3Options::default());
        assert_eq!(
            config(&b, AmazonS3ConfigKey::Checksum).as_deref(),
            Some("crc64nvme")
        );
        assert_eq!(
            config(&b, AmazonS3ConfigKey::UnsignedPayload).as_deref(),
            Some("true")
        );
    }

    #[test]
    fn choices_parse_from_their_names_and_reject_others() {
        assert_eq!(" ON ".parse::<UnsignedPayload>(), Ok(UnsignedPayload::On));
        assert_eq!("auto".parse::<UnsignedPayload>(), Ok(UnsignedPayload::Auto));
        assert_eq!("off".parse::<UnsignedPayload>(), Ok(UnsignedPayload::Off));
        assert_eq!("CRC64NVME".parse::<S3Checksum>(), Ok(S3Checksum::Crc64nvme));
        let err = "yes".parse::<UnsignedPayload>().unwrap_err().to_string();
        assert!(
            err.contains("`yes`") && err.contains("auto, on, off"),
            "{err}"
        );
        let err = "sha256".parse::<S3Checksum>().unwrap_err().to_string();
        assert!(err.contains("`sha256`"), "{err}");
    }

    #[test]
    fn memory_file_and_s3_urls_open() {
        let none = S3Options::default();
        open_store("memory://", &none).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("store");
        open_store(&format!("file://{}", sub.display()), &none).unwrap();
        assert!(sub.is_dir(), "file store directory is created");
        open_store(sub.to_str().unwrap(), &none).unwrap();
        // Building an S3 client performs no request.
        open_store("s3://bucket/some/prefix", &none).unwrap();
    }
}
