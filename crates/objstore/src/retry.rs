//! Retrying object store calls: transient errors only, exponential backoff with jitter.
//!
//! Attempt `n` (1-based) that fails transiently is followed by a sleep of
//! `min(base * 2^(n-1), max) * (0.5..1.0 jitter)` and another attempt, up to `1 + max_retries`
//! attempts in all. Any other error, or the last transient one, is returned as
//! [`ObjStoreError::Store`] with the attempt count. The closure gets the attempt number so a
//! caller can tell a first try from a retry (needed where an earlier attempt may have succeeded
//! without the reply arriving).
//!
//! This is the only retry layer: the S3 clients [`open_store`](crate::open_store) builds do
//! not retry on their own, so one attempt is one request and `attempts` counts requests
//! (test: tests/open_store_retries.rs). A store built elsewhere should turn its client's
//! retries off too, or every attempt here multiplies into its retries.

use std::future::Future;
use std::time::Duration;

use crate::config::StoreConfig;
use crate::error::{classify, ErrorKind, ObjStoreError};

pub(crate) async fn with_retry<T, F, Fut>(
    cfg: &StoreConfig,
    op: &'static str,
    path: &str,
    mut call: F,
) -> Result<T, ObjStoreError>
where
    F: FnMut(u32) -> Fut,
    Fut: Future<Output = object_store::Result<T>>,
{
    let mut attempt = 1u32;
    loop {
        match call(attempt).await {
            Ok(v) => return Ok(v),
            Err(e) if classify(&e) == ErrorKind::Transient && attempt <= cfg.max_retries => {
                let delay = backoff(cfg, attempt);
                tracing::debug!(op, path, attempt, ?delay, error = %e, "transient object store error, retrying");
                tokio::time::sleep(delay).await;
                attempt += 1;
            }
            Err(source) => {
                return Err(ObjStoreError::Store {
                    op,
                    path: path.to_string(),
                    attempts: attempt,
                    source,
                })
            }
        }
    }
}

fn backoff(cfg: &StoreConfig, attempt: u32) -> Duration {
    let exp = cfg
        .retry_base_delay
        .saturating_mul(1u32 << (attempt - 1).min(20));
    let capped = exp.min(cfg.retry_max_delay);
    capped.mul_f64(0.5 + rand::random::<f64>() * 0.5)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn cfg() -> StoreConfig {
        StoreConfig {
            max_retries: 3,
            retry_base_delay: Duration::from_millis(1),
            ..StoreConfig::default()
        }
    }

    fn transient() -> object_store::Error {
        object_store::Error::Generic {
            store: "t",
            source: Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)),
        }
    }

    #[tokio::test]
    async fn transient_errors_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let v = with_retry(&cfg(), "put", "p", |attempt| {
            calls.fetch_add(1, Ordering::SeqCst);
            async move {
                if attempt < 3 {
                    Err(transient())
                } else {
                    Ok(attempt)
                }
            }
        })
        .await
        .unwrap();
        assert_eq!(v, 3);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn retries_are_bounded_and_permanent_errors_are_not_retried() {
        let err = with_retry(&cfg(), "put", "p", |_| async { Err::<(), _>(transient()) })
            .await
            .unwrap_err();
        assert!(
            matches!(err, ObjStoreError::Store { attempts: 4, .. }),
            "{err}"
        );
        assert_eq!(err.kind(), ErrorKind::Transient);

        let calls = AtomicU32::new(0);
        let err = with_retry(&cfg(), "get", "p", |_| {
            calls.fetch_add(1, Ordering::SeqCst);
            async {
                Err::<(), _>(object_store::Error::NotFound {
                    path: "p".into(),
                    source: "gone".into(),
                })
            }
        })
        .await
        .unwrap_err();
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert_eq!(err.kind(), ErrorKind::NotFound);
        assert!(err.to_string().contains("get failed: path=`p` attempts=1"));
    }

    #[test]
    fn backoff_grows_and_is_capped() {
        let cfg = StoreConfig {
            retry_base_delay: Duration::from_millis(100),
            retry_max_delay: Duration::from_millis(300),
            ..StoreConfig::default()
        };
        assert!(backoff(&cfg, 1) <= Duration::from_millis(100));
        assert!(backoff(&cfg, 2) >= Duration::from_millis(100));
        assert!(backoff(&cfg, 10) <= Duration::from_millis(300));
    }
}
