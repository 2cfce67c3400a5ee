//! An S3-compatible HTTP server, in the test process ([`S3Server`]) or as a process of its own
//! (the `glidefs-s3-server` binary, for scripts; both serve through [`S3Listener`]).
//!
//! `s3s-fs` serves the S3 protocol from a directory (a bucket is a sub-directory), wrapped in
//! [`AtomicFs`] so conditional writes are atomic like on real S3, `s3s` checks SigV4 signatures
//! against one static key pair ([`ACCESS_KEY`], [`SECRET_KEY`]; any region), and `hyper-util`
//! serves each accepted TCP connection on the current tokio runtime. [`S3Server`] binds
//! `127.0.0.1:0` over a temporary directory, so parallel tests never collide on a port.
//!
//! Faults ([`S3Listener::serve_with_faults`]): every request is classified as an [`Op`]
//! (HEAD: `Head`; GET of the bucket: `List`; GET: `Get`; PUT with `x-amz-copy-source`:
//! `Copy`; multipart requests: `PutMultipart`; PUT: `Put`; DELETE and bulk delete: `Delete`)
//! with its decoded path and query as the path, and a [`FaultPlan`] decides its fault:
//! - [`Fault::LostAck`]: the request is served (the object written, deleted, read), then the
//!   connection is dropped without a reply: the client sees the connection close;
//! - [`Fault::Outage`] (the plan's outage switch): the connection is dropped before the
//!   request is served;
//! - [`Fault::Transient`], [`Fault::Timeout`] (after its stall): `503 SlowDown`, not served;
//! - [`Fault::Permanent`]: `403 AccessDenied`, not served;
//! - [`Fault::Stall`], [`Fault::Hold`]: served after the delay;
//! - [`Fault::FailAfterBytes`], [`Fault::FlipBit`], [`Fault::EmptyList`]: not supported over
//!   HTTP, served normally.
//!
//! Lifetime: the accept loop and every connection task live in one tokio task owned by
//! [`S3Listener`]. Dropping it aborts that task (which drops, and so aborts, the connection
//! tasks); dropping an [`S3Server`] does that and then removes its directory. Clients built
//! from it fail with connection errors after that, they never hang.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use futures::future::BoxFuture;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder as ConnBuilder;
use object_store::aws::AmazonS3Builder;
use object_store::ObjectStore;
use s3s::auth::SimpleAuth;
use s3s::service::{S3Service, S3ServiceBuilder};
use s3s::{Body, HttpError, HttpResponse};
use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};

use crate::fault::{Fault, FaultPlan, Op};
use crate::s3_atomic::AtomicFs;

/// Access key id every server accepts.
pub const ACCESS_KEY: &str = "glidefs-test-key";
/// Secret access key every server accepts.
pub const SECRET_KEY: &str = "glidefs-test-secret";
/// Region handed to clients (the server ignores it; SigV4 signs with it).
pub const REGION: &str = "us-east-1";

/// Why the test server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3ServerError {
    /// The temporary directory or the bucket directory could not be created.
    #[error("s3 test server: cannot prepare directory `{path}`: {source}")]
    Dir {
        /// The directory that failed.
        path: String,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// `s3s-fs` refused the root directory.
    #[error("s3 test server: s3s-fs rejected root `{path}`: {detail}")]
    Backend {
        /// The root directory handed to s3s-fs.
        path: String,
        /// What s3s-fs reported.
        detail: String,
    },
    /// Binding or inspecting the listening socket failed.
    #[error("s3 test server: cannot listen on {addr}: {source}")]
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying I/O error.
        source: std::io::Error,
    },
    /// The object_store client could not be configured for this server.
    #[error("s3 test server: cannot build S3 client for endpoint `{endpoint}`: {source}")]
    Client {
        /// The server's endpoint URL.
        endpoint: String,
        /// The builder error.
        source: object_store::Error,
    },
}

/// The S3 protocol served on a TCP address from the buckets under a directory. Dropping it
/// stops serving; the directory stays.
#[derive(Debug)]
pub struct S3Listener {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl S3Listener {
    /// Serves the buckets under `root` on `addr` (port 0: any free port), creating
    /// `root/<bucket>` if missing. Must run inside a tokio runtime, which serves it.
    pub async fn serve(root: &Path, bucket: &str, addr: SocketAddr) -> Result<Self, S3ServerError> {
        Self::serve_with_faults(root, bucket, addr, None).await
    }

    /// [`S3Listener::serve`], with every request's fault decided by `faults` (see the module
    /// docs; `None`: no faults).
    pub async fn serve_with_faults(
        root: &Path,
        bucket: &str,
        addr: SocketAddr,
        faults: Option<Arc<FaultPlan>>,
    ) -> Result<Self, S3ServerError> {
        let bucket_dir = root.join(bucket);
        std::fs::create_dir_all(&bucket_dir).map_err(|source| S3ServerError::Dir {
            path: bucket_dir.display().to_string(),
            source,
        })?;
        let fs = s3s_fs::FileSystem::new(root).map_err(|e| S3ServerError::Backend {
            path: root.display().to_string(),
            detail: format!("{e:?}"),
        })?;
        let service = {
            let mut builder = S3ServiceBuilder::new(AtomicFs::new(fs, root));
            builder.set_auth(SimpleAuth::from_single(ACCESS_KEY, SECRET_KEY));
            FaultyService {
                inner: builder.build(),
                faults,
            }
        };

        let listen = |source| S3ServerError::Listen { addr, source };
        let listener = TcpListener::bind(addr).await.map_err(listen)?;
        let addr = listener.local_addr().map_err(listen)?;
        let task = tokio::spawn(async move {
            let http = ConnBuilder::new(TokioExecutor::new());
            // Owned by this task: aborting the task drops the set, which aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                let socket = match listener.accept().await {
                    Ok((socket, _)) => socket,
                    Err(e) => {
                        tracing::warn!(error = %e, "s3 test server: accept failed");
                        continue;
                    }
                };
                // Small responses (headers, a short last chunk) must not wait for the
                // client's delayed ACK (Nagle): that cost each ranged GET ~40 ms.
                if let Err(e) = socket.set_nodelay(true) {
                    tracing::warn!(error = %e, "s3 test server: cannot set TCP_NODELAY");
                }
                let conn = http
                    .serve_connection(TokioIo::new(socket), service.clone())
                    .into_owned();
                connections.spawn(async move {
                    let _ = conn.await;
                });
                // Reap finished connections so the set does not grow without bound.
                while connections.try_join_next().is_some() {}
            }
        });
        Ok(Self { addr, task })
    }

    /// The socket address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for S3Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The S3 service behind a [`FaultPlan`] (see the module docs).
#[derive(Clone)]
struct FaultyService {
    inner: S3Service,
    faults: Option<Arc<FaultPlan>>,
}

/// The op and the decoded path + query a fault rule matches a request by.
fn classify_request(req: &Request<Incoming>) -> (Op, String) {
    let path = req.uri().path();
    let query = req.uri().query().unwrap_or("");
    let has = |name: &str| {
        query
            .split('&')
            .any(|kv| kv.split('=').next() == Some(name))
    };
    // Path-style: `/bucket` or `/bucket/` is the bucket itself (a listing for a GET).
    let bucket_only = path.trim_matches('/').find('/').is_none();
    let op = match *req.method() {
        Method::HEAD => Op::Head,
        Method::GET if bucket_only => Op::List,
        Method::GET => Op::Get,
        Method::PUT if req.headers().contains_key("x-amz-copy-source") => Op::Copy,
        Method::PUT if has("uploadId") => Op::PutMultipart,
        Method::PUT => Op::Put,
        Method::POST if has("delete") => Op::Delete,
        Method::POST => Op::PutMultipart,
        Method::DELETE if has("uploadId") => Op::PutMultipart,
        _ => Op::Delete,
    };
    (op, percent_decode(&format!("{path}?{query}")))
}

/// Decodes `%XX` escapes (invalid ones are kept as they are).
fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// An S3 error reply.
fn s3_error(status: StatusCode, code: &str, message: &str) -> HttpResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    );
    let mut resp = HttpResponse::new(Body::from(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/xml"),
    );
    resp
}

/// Makes hyper drop the connection without a reply.
fn dropped(op: Op, path: &str, fault: Fault) -> HttpError {
    let payload = crate::fault::InjectedFault {
        op,
        path: path.to_string(),
        fault,
    };
    HttpError::new(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        payload,
    )))
}

impl hyper::service::Service<Request<Incoming>> for FaultyService {
    type Response = HttpResponse;
    type Error = HttpError;
    type Future = BoxFuture<'static, Result<HttpResponse, HttpError>>;

    fn call(&self, req: Request<Incoming>) -> Self::Future {
        let Some(plan) = self.faults.clone() else {
            return hyper::service::Service::call(&self.inner, req);
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            let (op, path) = classify_request(&req);
            let fault = plan.decide(op, &path);
            plan.delay(fault).await;
            match fault {
                Some(f @ Fault::Outage) => return Err(dropped(op, &path, f)),
                Some(Fault::Permanent) => {
                    return Ok(s3_error(
                        StatusCode::FORBIDDEN,
                        "AccessDenied",
                        "injected permanent fault",
                    ))
                }
                Some(f) if f.fails_early() => {
                    return Ok(s3_error(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "SlowDown",
                        "injected transient fault",
                    ))
                }
                _ => {}
            }
            let resp = hyper::service::Service::call(&inner, req).await?;
            if fault == Some(Fault::LostAck) {
                // Served; the reply is lost on the way back.
                return Err(dropped(op, &path, Fault::LostAck));
            }
            Ok(resp)
        })
    }
}

/// A running in-process S3 server with one bucket in a temporary directory. Dropping it stops
/// the server, then removes the directory.
#[derive(Debug)]
pub struct S3Server {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// The bucket that exists when `start` returns.
    pub bucket: String,
    /// Access key id the server accepts.
    pub access_key: String,
    /// Secret access key the server accepts.
    pub secret: String,
    /// Region to hand to clients (the server ignores it, SigV4 signs with it).
    pub region: String,
    // Declared before `dir`: serving stops before the directory is removed.
    listener: S3Listener,
    /// The directory behind the server; the bucket is `dir/<bucket>`.
    pub dir: TempDir,
}

impl S3Server {
    /// Starts a server with bucket `glidefs-test` on an ephemeral port of 127.0.0.1.
    pub async fn start() -> Result<Self, S3ServerError> {
        Self::start_with_bucket("glidefs-test").await
    }

    /// Starts a server whose single bucket is `bucket` (must be a valid S3 bucket name).
    pub async fn start_with_bucket(bucket: &str) -> Result<Self, S3ServerError> {
        Self::start_with_faults(bucket, None).await
    }

    /// Starts a server whose single bucket is `bucket`, every request's fault decided by
    /// `faults` (see the module docs).
    pub async fn start_with_faults(
        bucket: &str,
        faults: Option<Arc<FaultPlan>>,
    ) -> Result<Self, S3ServerError> {
        let dir = tempfile::Builder::new()
            .prefix("glidefs-s3-")
            .tempdir()
            .map_err(|source| S3ServerError::Dir {
                path: std::env::temp_dir().display().to_string(),
                source,
            })?;
        let any_port = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = S3Listener::serve_with_faults(dir.path(), bucket, any_port, faults).await?;
        Ok(Self {
            endpoint: listener.endpoint(),
            bucket: bucket.to_string(),
            access_key: ACCESS_KEY.to_string(),
            secret: SECRET_KEY.to_string(),
            region: REGION.to_string(),
            listener,
            dir,
        })
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.listener.addr()
    }

    /// An `AmazonS3Builder` preconfigured for this server (endpoint, credentials, plain HTTP,
    /// path-style requests); add options before `build()`.
    pub fn s3_builder(&self) -> AmazonS3Builder {
        AmazonS3Builder::new()
            .with_endpoint(&self.endpoint)
            .with_bucket_name(&self.bucket)
            .with_access_key_id(&self.access_key)
            .with_secret_access_key(&self.secret)
            .with_region(&self.region)
            .with_allow_http(true)
            .with_virtual_hosted_style_request(false)
    }

    /// The `AWS_*` settings a client of this server needs (credentials, region), as
    /// glidefs's `S3Options::settings` takes them; the endpoint goes separately.
    pub fn aws_settings(&self) -> Vec<(String, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID".into(), self.access_key.clone()),
            ("AWS_SECRET_ACCESS_KEY".into(), self.secret.clone()),
            ("AWS_REGION".into(), self.region.clone()),
        ]
    }

    /// An object store client talking to this server's bucket.
    pub fn object_store(&self) -> Result<Arc<dyn ObjectStore>, S3ServerError> {
        let store = self
            .s3_builder()
            .build()
            .map_err(|source| S3ServerError::Client {
                endpoint: self.endpoint.clone(),
                source,
            })?;
        Ok(Arc::new(store))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::{StreamExt, TryStreamExt};
    use object_store::path::Path;
    use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload};

    #[tokio::test]
    async fn put_get_list_delete_and_conditional_create() {
        let server = S3Server::start().await.expect("server starts");
        let store = server.object_store().expect("client builds");

        let a = Path::from("dir/a");
        let b = Path::from("dir/b");
        store
            .put(&a, PutPayload::from_static(b"alpha"))
            .await
            .expect("put a");
        store
            .put(&b, PutPayload::from(Bytes::from(vec![7u8; 100_000])))
            .await
            .expect("put b");

        let got = store.get(&a).await.expect("get a").bytes().await.unwrap();
        assert_eq!(&got[..], b"alpha");
        let range = store.get_range(&b, 10..20).await.expect("ranged get");
        assert_eq!(&range[..], &[7u8; 10]);

        let mut listed: Vec<String> = store
            .list(Some(&Path::from("dir")))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .expect("list");
        listed.sort();
        assert_eq!(listed, vec!["dir/a".to_string(), "dir/b".to_string()]);

        store.delete(&a).await.expect("delete a");
        let err = store.get(&a).await.expect_err("a is gone");
        assert!(matches!(err, object_store::Error::NotFound { .. }), "{err}");

        // The file on disk is what the server serves.
        assert!(server
            .dir
            .path()
            .join(&server.bucket)
            .join("dir/b")
            .exists());

        let c = Path::from("cond/c");
        let create = PutOptions::from(PutMode::Create);
        store
            .put_opts(&c, PutPayload::from_static(b"first"), create.clone())
            .await
            .expect("first create wins");
        let err = store
            .put_opts(&c, PutPayload::from_static(b"second"), create)
            .await
            .expect_err("second create must fail");
        assert!(
            matches!(
                err,
                object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
            ),
            "unexpected error: {err}"
        );
        let got = store.get(&c).await.unwrap().bytes().await.unwrap();
        assert_eq!(&got[..], b"first", "the losing create must not overwrite");
    }

    /// GET bodies come in `s3_get::CHUNK` pieces: whole objects, ranges that start and end
    /// inside a chunk or across chunk boundaries, suffix ranges and an overwritten object all
    /// read back byte for byte, with the headers `s3s-fs` gives.
    #[tokio::test]
    async fn gets_of_large_objects_and_ranges_read_back_exactly() {
        use crate::s3_get::CHUNK;
        use object_store::{GetOptions, GetRange};
        let server = S3Server::start().await.expect("server starts");
        let store = server.object_store().expect("client builds");
        let p = Path::from("packs/big");
        let old = crate::noise(1, (2 * CHUNK + 4321) as usize);
        let put = store
            .put(&p, PutPayload::from(Bytes::from(old.clone())))
            .await
            .expect("put");

        let got = store.get(&p).await.expect("get");
        assert_eq!(got.meta.e_tag, put.e_tag, "the ETag of the PUT");
        assert!(got.bytes().await.unwrap()[..] == old[..], "whole object");
        let c = CHUNK as usize;
        for r in [0..1, 5..c, c - 3..c + 3, 17..2 * c + 4000, 2 * c..old.len()] {
            let got = store.get_range(&p, r.start as u64..r.end as u64).await;
            assert!(got.expect("ranged get")[..] == old[r.clone()], "{r:?}");
        }
        let suffix = GetOptions {
            range: Some(GetRange::Suffix(c as u64 + 10)),
            ..Default::default()
        };
        let got = store.get_opts(&p, suffix).await.expect("suffix get");
        let tail = &old[old.len() - c - 10..];
        assert!(got.bytes().await.unwrap()[..] == tail[..], "suffix range");

        // Overwritten (a new file renamed into place): the new bytes, never the old file's.
        let new = crate::noise(2, c + 99);
        store
            .put(&p, PutPayload::from(Bytes::from(new.clone())))
            .await
            .expect("overwrite");
        let got = store.get(&p).await.expect("get").bytes().await.unwrap();
        assert!(got[..] == new[..], "the overwrite");
    }

    /// Real S3 decides conditional creates atomically; so must the test server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_conditional_creates_have_exactly_one_winner() {
        let server = S3Server::start().await.expect("server starts");
        let store = server.object_store().expect("client builds");
        for round in 0..20 {
            let path = Path::from(format!("race/{round}"));
            let attempts = (0..8u8).map(|writer| {
                let store = Arc::clone(&store);
                let path = path.clone();
                tokio::spawn(async move {
                    let body = PutPayload::from(Bytes::from(vec![writer; 64 * 1024]));
                    let opts = PutOptions::from(PutMode::Create);
                    store.put_opts(&path, body, opts).await.map(|_| writer)
                })
            });
            let results: Vec<_> = futures::future::join_all(attempts)
                .await
                .into_iter()
                .map(|joined| joined.expect("task"))
                .collect();
            let winners: Vec<u8> = results
                .iter()
                .filter_map(|r| r.as_ref().ok().copied())
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            let stored = store.get(&path).await.unwrap().bytes().await.unwrap();
            assert!(
                stored.iter().all(|&b| b == winners[0]),
                "round {round}: stored object is not the winner's"
            );
        }
    }

    /// Real S3 lists consistently while objects are deleted (glidefs gc deletes manifests while
    /// a writer lists them to publish); s3s-fs alone fails such a listing with a 500.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn listing_while_objects_are_deleted_never_fails() {
        let server = S3Server::start().await.expect("server starts");
        let store = Arc::new(
            server
                .s3_builder()
                .with_retry(object_store::RetryConfig {
                    max_retries: 0,
                    ..Default::default()
                })
                .build()
                .expect("client builds"),
        );
        let keys: Vec<Path> = (0..150).map(|i| Path::from(format!("m/{i:05}"))).collect();
        for k in &keys {
            store
                .put(k, PutPayload::from_static(b"x"))
                .await
                .expect("put");
        }
        let deleter = {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                for k in &keys {
                    store.delete(k).await.expect("delete");
                }
            })
        };
        let mut listings = 0;
        while !deleter.is_finished() {
            let listed: Result<Vec<_>, _> = store.list(Some(&Path::from("m"))).try_collect().await;
            if let Err(e) = listed {
                panic!("listing {listings} failed while objects were deleted: {e}");
            }
            listings += 1;
        }
        deleter.await.expect("deleter");
        assert!(listings > 0);
    }

    /// s3s-fs leaves files beside the buckets for every object; a delete must remove them, or
    /// a long-running server keeps one per object ever written.
    #[tokio::test]
    async fn deleting_objects_leaves_no_side_files() {
        let server = S3Server::start().await.expect("server starts");
        let store = server.object_store().expect("client builds");
        let side_files = || {
            std::fs::read_dir(server.dir.path())
                .expect("server dir")
                .filter_map(|e| e.ok())
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .count()
        };
        let before = side_files();
        let keys: Vec<Path> = ["a", "dir/b", "dir/sub/c-d_e.f", "x/0000000000000000042"]
            .into_iter()
            .map(Path::from)
            .collect();
        for k in &keys {
            store
                .put(k, PutPayload::from_static(b"v"))
                .await
                .expect("put");
        }
        assert!(
            side_files() > before,
            "s3s-fs writes side files (else this test checks nothing)"
        );
        store.delete(&keys[0]).await.expect("delete");
        let rest: Vec<_> = keys[1..].iter().cloned().map(Ok).collect();
        let rest = futures::stream::iter(rest).boxed();
        let deleted: Vec<Path> = store
            .delete_stream(rest)
            .try_collect()
            .await
            .expect("bulk delete");
        assert_eq!(deleted.len(), keys.len() - 1);
        assert_eq!(side_files(), before, "side files left behind");
    }

    #[tokio::test]
    async fn dropping_the_server_stops_it() {
        let server = S3Server::start().await.expect("server starts");
        let addr = server.addr();
        drop(server);
        // The abort takes effect when the runtime next polls the task; allow it up to a second.
        let mut refused = false;
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(addr).await.is_err() {
                refused = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(refused, "listener still accepting after drop");
    }

    /// Faults at the HTTP level: a lost reply means served-then-dropped, an outage means
    /// dropped-before-served, transient and permanent faults are 503 and 403 replies.
    #[tokio::test]
    async fn http_faults_lose_replies_after_serving_and_refuse_during_outages() {
        use crate::fault::{FaultPlan, FaultRule};
        let plan = Arc::new(FaultPlan::new(1));
        let server = S3Server::start_with_faults("glidefs-test", Some(plan.clone()))
            .await
            .expect("server starts");
        let no_retry = Arc::new(
            server
                .s3_builder()
                .with_retry(object_store::RetryConfig {
                    max_retries: 0,
                    ..Default::default()
                })
                .build()
                .expect("client builds"),
        );
        let raw = server.object_store().expect("client builds");
        let on_disk = |k: &str| server.dir.path().join(&server.bucket).join(k).exists();

        plan.inject(
            FaultRule::new(Fault::LostAck)
                .ops(&[Op::Put])
                .path_contains("lost/")
                .times(1),
        );
        let a = Path::from("lost/a");
        no_retry
            .put(&a, PutPayload::from_static(b"a"))
            .await
            .expect_err("the reply was lost");
        assert!(on_disk("lost/a"), "but the put was served");
        // With the client's retries a lost reply of a create is a conflict on the retry.
        plan.inject(FaultRule::new(Fault::LostAck).ops(&[Op::Put]).times(1));
        let b = Path::from("lost/b");
        let create = PutOptions::from(PutMode::Create);
        let err = raw
            .put_opts(&b, PutPayload::from_static(b"b"), create)
            .await
            .expect_err("the retried create finds its own object");
        assert!(
            matches!(
                err,
                object_store::Error::AlreadyExists { .. }
                    | object_store::Error::Precondition { .. }
            ),
            "{err}"
        );
        assert_eq!(plan.calls(Op::Put), 3);

        plan.set_outage(true);
        no_retry
            .put(&Path::from("down/c"), PutPayload::from_static(b"c"))
            .await
            .expect_err("down");
        assert!(!on_disk("down/c"), "not served during the outage");
        no_retry.get(&a).await.expect_err("down");
        plan.set_outage(false);
        assert_eq!(&raw.get(&a).await.unwrap().bytes().await.unwrap()[..], b"a");

        plan.inject(FaultRule::new(Fault::Transient).ops(&[Op::Get]).times(1));
        let err = no_retry.get(&a).await.expect_err("503");
        assert!(err.to_string().contains("503"), "{err}");
        plan.inject(FaultRule::new(Fault::Transient).ops(&[Op::Get]).times(1));
        raw.get(&a).await.expect("the client retries a 503");
        plan.inject(FaultRule::new(Fault::Permanent).ops(&[Op::Delete]).times(1));
        raw.delete(&a).await.expect_err("403");
        assert!(on_disk("lost/a"), "a refused delete deletes nothing");
        plan.inject(FaultRule::new(Fault::LostAck).ops(&[Op::List]).times(1));
        let listed: Vec<_> = raw
            .list(Some(&Path::from("lost")))
            .try_collect()
            .await
            .expect("a listing is retried after a lost reply");
        assert_eq!(listed.len(), 2);
    }
}
