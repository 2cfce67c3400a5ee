//! glidefs' HTTP API client, the layer above the shared model (`glidefs-model`): over the
//! unix socket, TCP or TLS (HTTP/1.1, one connection per request), used by the CLI, the CSI
//! glue, the tests and a daemon that takes over from another (`glidefs serve --takeover`).
//! `--url` parsing and the TLS configuration (trust roots) are in [`endpoint`].
//!
//! Imports: `glidefs-model` (the API's documents) and nothing else of glidefs.
//!
//! Contract: a non-2xx response with an API error body becomes [`ClientError::Api`] carrying the
//! status, the stable code and the message; anything else that goes wrong names the endpoint
//! (and a failed TLS handshake the host and rustls' reason, e.g. an unknown issuer).

pub mod endpoint;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use serde::de::DeserializeOwned;
use tokio::io::{AsyncRead, AsyncWrite};

pub use crate::endpoint::Endpoint;
use glidefs_model::api::{
    CompactResult, CreateSnapshot, CreateVolume, ErrorBody, FlushReport, QosLimits, RecordWarmSet,
    RemoveReport, SnapshotDoc, SnapshotList, VolumeInfo, VolumeList, WarmSetInfo,
};

/// Client errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error(
        "cannot connect to the glidefs API at {endpoint}: {source} (is `glidefs serve` running?)"
    )]
    Connect {
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS handshake with {host} ({endpoint}) failed: {source}{hint}")]
    Tls {
        endpoint: String,
        host: String,
        /// What the reason most likely means, or empty.
        hint: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("HTTP exchange with {endpoint} failed: {message}")]
    Http { endpoint: String, message: String },
    #[error("{message} ({code}, HTTP {status})")]
    Api {
        status: u16,
        code: String,
        message: String,
    },
    #[error("unexpected response from {endpoint} (HTTP {status}): {message}")]
    Decode {
        endpoint: String,
        status: u16,
        message: String,
    },
}

/// A response as received.
#[derive(Debug, Clone)]
pub struct RawResponse {
    pub status: u16,
    pub content_type: Option<String>,
    pub body: Bytes,
}

/// An API client.
#[derive(Debug, Clone)]
pub struct Client {
    endpoint: Endpoint,
}

impl Client {
    /// A client of `endpoint`.
    pub fn new(endpoint: Endpoint) -> Self {
        Self { endpoint }
    }

    fn http_err(&self, message: impl std::fmt::Display) -> ClientError {
        ClientError::Http {
            endpoint: self.endpoint.to_string(),
            message: message.to_string(),
        }
    }

    /// Sends one request; `headers` are added as given (the bearer token of a TCP endpoint is
    /// added unless `headers` has an Authorization already).
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<RawResponse, ClientError> {
        let connect_err = |source| ClientError::Connect {
            endpoint: self.endpoint.to_string(),
            source,
        };
        match &self.endpoint {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                self.exchange(s, method, path, headers, body).await
            }
            Endpoint::Tcp { addr, .. } => {
                let s = tokio::net::TcpStream::connect(addr.as_str())
                    .await
                    .map_err(connect_err)?;
                self.exchange(s, method, path, headers, body).await
            }
            Endpoint::Tls { addr, tls, .. } => {
                let s = tokio::net::TcpStream::connect(addr.as_str())
                    .await
                    .map_err(connect_err)?;
                let s = tokio_rustls::TlsConnector::from(tls.config.clone())
                    .connect(tls.server_name.clone(), s)
                    .await
                    .map_err(|source| ClientError::Tls {
                        endpoint: self.endpoint.to_string(),
                        host: tls.host.clone(),
                        hint: crate::endpoint::handshake_hint(&source),
                        source,
                    })?;
                self.exchange(s, method, path, headers, body).await
            }
        }
    }

    async fn exchange<S: AsyncRead + AsyncWrite + Unpin + Send + 'static>(
        &self,
        stream: S,
        method: Method,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> Result<RawResponse, ClientError> {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| self.http_err(e))?;
        let conn = tokio::spawn(conn);
        let host = match &self.endpoint {
            Endpoint::Tcp { addr, .. } | Endpoint::Tls { addr, .. } => addr.clone(),
            Endpoint::Unix(_) => "localhost".to_string(),
        };
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, host);
        if body.is_some() {
            req = req.header(CONTENT_TYPE, "application/json");
        }
        let has_auth = headers
            .iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("authorization"));
        if let (Some(t), false) = (self.endpoint.token(), has_auth) {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.http_err(e))?;
        let resp = sender.send_request(req).await.map_err(|e| {
            // A TLS listener answers plain HTTP with an alert record, a reset or nothing.
            if matches!(self.endpoint, Endpoint::Tcp { .. }) {
                self.http_err(format!("{e} (is the listener TLS? then use https://)"))
            } else {
                self.http_err(e)
            }
        })?;
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| self.http_err(e))?
            .to_bytes();
        conn.abort();
        Ok(RawResponse {
            status,
            content_type,
            body,
        })
    }

    /// Sends a request and decodes a 2xx JSON answer as `T`; an error body as `ClientError::Api`.
    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<T, ClientError> {
        let r = self.raw(method, path, &[], body).await?;
        let decode_err = |message: String| ClientError::Decode {
            endpoint: self.endpoint.to_string(),
            status: r.status,
            message,
        };
        if !(200..300).contains(&r.status) {
            return match serde_json::from_slice::<ErrorBody>(&r.body) {
                Ok(e) => Err(ClientError::Api {
                    status: r.status,
                    code: e.error.code,
                    message: e.error.message,
                }),
                Err(_) => Err(decode_err(String::from_utf8_lossy(&r.body).into_owned())),
            };
        }
        serde_json::from_slice(&r.body).map_err(|e| decode_err(e.to_string()))
    }

    /// `POST /v1/handoff`: the daemon detaches its devices and exits; returns its pid.
    pub async fn handoff(&self) -> Result<u32, ClientError> {
        #[derive(serde::Deserialize)]
        struct Started {
            pid: u32,
        }
        let s: Started = self.call(Method::POST, "/v1/handoff", None).await?;
        Ok(s.pid)
    }

    /// `POST /v1/volumes`.
    pub async fn create(&self, req: &CreateVolume) -> Result<VolumeInfo, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| self.http_err(e))?;
        self.call(Method::POST, "/v1/volumes", Some(body)).await
    }

    /// `GET /v1/volumes`.
    pub async fn list(&self) -> Result<VolumeList, ClientError> {
        self.call(Method::GET, "/v1/volumes", None).await
    }

    /// `GET /v1/volumes/{name}`.
    pub async fn show(&self, name: &str) -> Result<VolumeInfo, ClientError> {
        self.call(Method::GET, &format!("/v1/volumes/{}", encode(name)), None)
            .await
    }

    /// `POST /v1/volumes/{name}/flush`.
    pub async fn flush(&self, name: &str) -> Result<FlushReport, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/flush", encode(name)),
            None,
        )
        .await
    }

    /// `POST /v1/volumes/{name}/compact?gc=..`.
    pub async fn compact(&self, name: &str, gc: bool) -> Result<CompactResult, ClientError> {
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/compact?gc={gc}", encode(name)),
            None,
        )
        .await
    }

    /// `POST /v1/volumes/{name}/resize` with the new size in bytes.
    pub async fn resize(
        &self,
        name: &str,
        size: u64,
    ) -> Result<glidefs_model::api::ResizeReport, ClientError> {
        let req = glidefs_model::api::ResizeVolume {
            size: serde_json::Value::from(size),
        };
        let body = serde_json::to_vec(&req).map_err(|e| self.http_err(e))?;
        self.call(
            Method::POST,
            &format!("/v1/volumes/{}/resize", encode(name)),
            Some(body),
        )
        .await
    }

    /// `GET /v1/volumes/{name}/qos`: the volume's QoS limits (empty: none).
    pub async fn qos(&self, name: &str) -> Result<QosLimits, ClientError> {
        self.call(
            Method::GET,
            &format!("/v1/volumes/{}/qos", encode(name)),
            None,
        )
        .await
    }

    /// `PUT /v1/volumes/{name}/qos`: replaces the volume's QoS limits, live; the limits in
    /// force after the call (bursts filled in).
    pub async fn set_qos(&self, name: &str, limits: &QosLimits) -> Result<QosLimits, ClientError> {
        let body = serde_json::to_vec(limits).map_err(|e| self.http_err(e))?;
        self.call(
            Method::PUT,
            &format!("/v1/volumes/{}/qos", encode(name)),
            Some(body),
        )
        .await
    }

    fn warmset_path(name: &str) -> String {
        format!("/v1/volumes/{}/warmset", encode(name))
    }

    /// `GET /v1/volumes/{name}/warmset`: the volume's warm-set state.
    pub async fn warm_set(&self, name: &str) -> Result<WarmSetInfo, ClientError> {
        self.call(Method::GET, &Self::warmset_path(name), None)
            .await
    }

    /// `POST /v1/volumes/{name}/warmset/record`: starts recording the volume's warm set.
    pub async fn record_warm_set(
        &self,
        name: &str,
        req: &RecordWarmSet,
    ) -> Result<WarmSetInfo, ClientError> {
        let body = serde_json::to_vec(req).map_err(|e| self.http_err(e))?;
        let path = format!("{}/record", Self::warmset_path(name));
        self.call(Method::POST, &path, Some(body)).await
    }

    /// `DELETE /v1/volumes/{name}/warmset`: drops the volume's warm set.
    pub async fn drop_warm_set(&self, name: &str) -> Result<WarmSetInfo, ClientError> {
        self.call(Method::DELETE, &Self::warmset_path(name), None)
            .await
    }

    /// `DELETE /v1/volumes/{name}?purge=..&force=..`.
    pub async fn remove(
        &self,
        name: &str,
        purge: bool,
        force: bool,
    ) -> Result<RemoveReport, ClientError> {
        let path = format!("/v1/volumes/{}?purge={purge}&force={force}", encode(name));
        self.call(Method::DELETE, &path, None).await
    }

    fn snapshots_path(volume: &str) -> String {
        format!("/v1/volumes/{}/snapshots", encode(volume))
    }

    /// `POST /v1/volumes/{volume}/snapshots`.
    pub async fn snapshot_create(
        &self,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotDoc, ClientError> {
        let body = serde_json::to_vec(&CreateSnapshot {
            name: name.to_string(),
        })
        .map_err(|e| self.http_err(e))?;
        self.call(Method::POST, &Self::snapshots_path(volume), Some(body))
            .await
    }

    /// `GET /v1/volumes/{volume}/snapshots`.
    pub async fn snapshot_list(&self, volume: &str) -> Result<SnapshotList, ClientError> {
        self.call(Method::GET, &Self::snapshots_path(volume), None)
            .await
    }

    /// `GET|DELETE /v1/volumes/{volume}/snapshots/{name}`.
    pub async fn snapshot_one(
        &self,
        method: Method,
        volume: &str,
        name: &str,
    ) -> Result<SnapshotDoc, ClientError> {
        let path = format!("{}/{}", Self::snapshots_path(volume), encode(name));
        self.call(method, &path, None).await
    }
}

/// Percent-encodes a path segment (names are normally plain; anything odd is escaped so the
/// server sees it and answers `invalid_name`).
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}
