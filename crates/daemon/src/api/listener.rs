//! The API's accept loops: HTTP/1.1 (hyper) on the unix socket and on the TCP listener, the
//! latter behind TLS when configured.
//!
//! Contract, per listener ([`Limits`], from the `[api]` config):
//! - at most `max_connections` connections at once; one more is closed as soon as it is
//!   accepted (no TLS handshake, no HTTP answer) and counted as refused. Each listener has its
//!   own budget, so a flood of TCP peers never locks the local unix socket out;
//! - header-read timeout: once the first byte of a request (or of the TLS handshake) has
//!   arrived, its head must be complete within `header_read_timeout`; a TLS handshake must
//!   also end within it of the connection being accepted;
//! - idle timeout: a connection with no request in progress is closed after `idle_timeout`
//!   without a byte from the peer (kept-alive connections included);
//! - a request in progress (its handler running, e.g. a flush that takes minutes) is never cut
//!   by either timeout. Timed-out connections are dropped without an answer and counted.
//!
//! Shutdown: once `stop` turns true the loop stops accepting, every connection is asked to
//! close after its request in progress (hyper's graceful shutdown: an idle one closes at once)
//! and the loop returns when all of them have ended.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use axum::Router;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;

use crate::api::metrics::ConnCounters;
use glidefs_model::log::chain;

/// Connection limits of one listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// From a request's first byte to the end of its head (and for a TLS handshake).
    pub header_read_timeout: Duration,
    /// A connection without a request in progress that receives nothing this long is closed.
    pub idle_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// A bound listener.
pub(crate) enum Listener {
    /// The local socket (no TLS, no token).
    Unix(UnixListener),
    /// The TCP listener, with TLS when configured.
    Tcp {
        listener: TcpListener,
        tls: Option<TlsAcceptor>,
    },
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listener::Unix(l) => write!(f, "Unix({:?})", l.local_addr().ok()),
            Listener::Tcp { listener, tls } => write!(
                f,
                "Tcp({:?}, tls: {})",
                listener.local_addr().ok(),
                tls.is_some()
            ),
        }
    }
}

/// An accepted connection, before TLS.
enum Accepted {
    Unix(tokio::net::UnixStream),
    Tcp(tokio::net::TcpStream),
}

impl Listener {
    async fn accept(&self) -> std::io::Result<Accepted> {
        match self {
            Listener::Unix(l) => l.accept().await.map(|(s, _)| Accepted::Unix(s)),
            Listener::Tcp { listener, .. } => listener.accept().await.map(|(s, _)| {
                // Small request/response exchanges: do not wait for the peer's delayed ACK.
                let _ = s.set_nodelay(true);
                Accepted::Tcp(s)
            }),
        }
    }

    fn tls(&self) -> Option<TlsAcceptor> {
        match self {
            Listener::Unix(_) => None,
            Listener::Tcp { tls, .. } => tls.clone(),
        }
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

/// Serves `app` on `listener` until `stop` turns true and every connection has ended (see the
/// module docs).
pub(crate) async fn serve(
    listener: Listener,
    app: Router,
    limits: Limits,
    counters: Arc<ConnCounters>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let tls = listener.tls();
    let mut connections = JoinSet::new();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            Some(_) = connections.join_next() => continue,
            () = stopped(&mut stop) => break,
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning. A
                // connection that died in the backlog (ECONNABORTED) is not worth a pause.
                if e.kind() != std::io::ErrorKind::ConnectionAborted {
                    tracing::warn!(error = %chain(&e), "API accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            counters.refused();
            tracing::debug!(
                max = limits.max_connections,
                "API connection refused: listener at its connection limit"
            );
            drop(stream);
            continue;
        };
        connections.spawn(connection(
            stream,
            tls.clone(),
            app.clone(),
            limits,
            counters.clone(),
            stop.clone(),
            permit,
        ));
    }
    while connections.join_next().await.is_some() {}
    Ok(())
}

/// Serves one accepted connection (TLS handshake first when `tls` is set).
async fn connection(
    stream: Accepted,
    tls: Option<TlsAcceptor>,
    app: Router,
    limits: Limits,
    counters: Arc<ConnCounters>,
    stop: watch::Receiver<bool>,
    permit: OwnedSemaphorePermit,
) {
    let _open = counters.opened(permit);
    let activity = Arc::new(Activity::new());
    match stream {
        Accepted::Unix(s) => {
            let io = Tracked::new(s, activity.clone());
            http(io, activity, app, limits, &counters, stop).await;
        }
        Accepted::Tcp(s) => {
            let io = Tracked::new(s, activity.clone());
            match tls {
                None => http(io, activity, app, limits, &counters, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(limits.header_read_timeout, acceptor.accept(io))
                        .await
                    {
                        Ok(Ok(io)) => http(io, activity, app, limits, &counters, stop).await,
                        Ok(Err(e)) => tracing::debug!(error = %chain(&e), "TLS handshake failed"),
                        Err(_) => {
                            counters.timed_out();
                            tracing::debug!("TLS handshake timed out");
                        }
                    }
                }
            }
        }
    }
}

/// HTTP/1.1 on `io` until the peer closes, a timeout of [`Limits`] expires or shutdown.
async fn http<I>(
    io: I,
    activity: Arc<Activity>,
    app: Router,
    limits: Limits,
    counters: &ConnCounters,
    mut stop: watch::Receiver<bool>,
) where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = {
        let activity = activity.clone();
        hyper::service::service_fn(move |req: Request<Incoming>| {
            let mut app = app.clone();
            let request = activity.request();
            async move {
                let resp: Result<Response, Infallible> =
                    tower_service::Service::call(&mut app, req).await;
                drop(request);
                resp
            }
        })
    };
    let mut builder = hyper::server::conn::http1::Builder::new();
    // The timeouts are ours (the watchdog below): hyper's would also cut idle keep-alive
    // connections after the header timeout.
    builder.header_read_timeout(None);
    let conn = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let mut draining = false;
    loop {
        let deadline = activity.deadline(&limits);
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!(error = %chain(&e), "API connection ended with an error");
                }
                return;
            }
            () = activity.changed.notified() => {}
            () = tokio::time::sleep_until(deadline.unwrap_or_else(|| Instant::now() + limits.idle_timeout)) => {
                if activity.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    counters.timed_out();
                    tracing::debug!("API connection closed: header-read or idle timeout");
                    return;
                }
            }
            () = stopped(&mut stop), if !draining => {
                draining = true;
                conn.as_mut().graceful_shutdown();
            }
        }
    }
}

/// What a connection's watchdog needs to know: is a request in progress, since when has it
/// been idle, when did the head of the next request start to arrive.
#[derive(Debug)]
struct Activity {
    state: Mutex<ActivityState>,
    /// Notified when a request starts or ends or a head starts to arrive.
    changed: Notify,
}

#[derive(Debug)]
struct ActivityState {
    in_flight: usize,
    idle_since: Instant,
    head_started: Option<Instant>,
}

impl Activity {
    fn new() -> Self {
        Self {
            state: Mutex::new(ActivityState {
                in_flight: 0,
                idle_since: Instant::now(),
                head_started: None,
            }),
            changed: Notify::new(),
        }
    }

    /// When the connection must be closed unless something happens first; `None` while a
    /// request is in progress.
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        let s = self.state.lock();
        if s.in_flight > 0 {
            return None;
        }
        Some(match s.head_started {
            Some(t) => t + limits.header_read_timeout,
            None => s.idle_since + limits.idle_timeout,
        })
    }

    /// Bytes arrived from the peer.
    fn read(&self) {
        let mut s = self.state.lock();
        if s.in_flight == 0 && s.head_started.is_none() {
            s.head_started = Some(Instant::now());
            drop(s);
            self.changed.notify_one();
        }
    }

    /// A request head was parsed: its handler runs until the guard is dropped.
    fn request(self: &Arc<Self>) -> InFlight {
        let mut s = self.state.lock();
        s.in_flight += 1;
        s.head_started = None;
        drop(s);
        self.changed.notify_one();
        InFlight(self.clone())
    }
}

/// A request in progress on a connection (see [`Activity::request`]).
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.0.state.lock();
        s.in_flight -= 1;
        if s.in_flight == 0 {
            s.idle_since = Instant::now();
            s.head_started = None;
        }
        drop(s);
        self.0.changed.notify_one();
    }
}

/// A transport that reports the bytes it receives to the connection's [`Activity`].
struct Tracked<T> {
    inner: T,
    activity: Arc<Activity>,
}

impl<T> Tracked<T> {
    fn new(inner: T, activity: Arc<Activity>) -> Self {
        Self { inner, activity }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Tracked<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read();
        }
        r
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Tracked<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}
