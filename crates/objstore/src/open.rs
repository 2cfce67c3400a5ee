//! Opening an object store from a URL.
//!
//! | URL                          | store                                                        |
//! | ---------------------------- | ------------------------------------------------------------ |
//! | `file:///abs/dir` or `/abs/dir` | `LocalFileSystem` rooted at the directory (created if missing), fsync on |
//! | `memory://`                  | a fresh `InMemory` store (tests, demos)                      |
//! | `s3://bucket[/prefix]`       | `AmazonS3` configured from [`S3Options`] (credentials, region, request timeout: 5 min unless the options set `AWS_TIMEOUT`; no client retries, see below); [`S3Options::endpoint`] points it at a custom endpoint (path-style; plain `http://` allowed), `prefix` scopes every key |
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

use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::prefix::PrefixStore;
use object_store::{ClientConfigKey, ObjectStore, RetryConfig};

use crate::error::ObjStoreError;

/// How S3 clients are configured (ignored by `file://` and `memory://` stores).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// A custom endpoint (MinIO, Ceph, a test server, ...): path-style requests, plain
    /// `http://` allowed. `None`: AWS.
    pub endpoint: Option<String>,
    /// Client settings as `AWS_*` names or object_store's config keys (`AWS_ACCESS_KEY_ID`,
    /// `aws_region`, `AWS_TIMEOUT`, ...), applied in order; names object_store does not know
    /// are ignored, as `AmazonS3Builder::from_env` ignores them.
    pub settings: Vec<(String, String)>,
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
            let s3 = builder
                .build()
                .map_err(|e| bad(format!("S3 configuration: {e}")))?;
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

/// Applies `settings` the way `AmazonS3Builder::from_env` applies the environment: each name
/// object_store knows (case-insensitive) sets its key, others are skipped.
fn with_settings(builder: AmazonS3Builder, settings: &[(String, String)]) -> AmazonS3Builder {
    settings.iter().fold(builder, |b, (name, value)| {
        match name.to_ascii_lowercase().parse::<AmazonS3ConfigKey>() {
            Ok(key) => b.with_config(key, value),
            Err(_) => b,
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
        };
        assert_eq!(opts.setting("aws_timeout"), Some("9s"));
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
