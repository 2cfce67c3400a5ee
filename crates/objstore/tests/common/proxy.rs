//! A TCP proxy in front of an S3 server that records every byte clients send and can damage
//! the body of pack PUTs in transit (one byte flipped), as a bad NIC or middlebox would.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The bytes each client connection sent, in the order the connections were accepted.
pub type Sent = Arc<Mutex<Vec<Arc<Mutex<Vec<u8>>>>>>;

/// Where a damaged PUT body is hit: this many bytes after the request head.
const FLIP_AT: usize = 100;

pub struct Proxy {
    /// `http://host:port` of the proxy.
    pub endpoint: String,
    /// What clients sent (as forwarded: damaged bytes as damaged).
    pub sent: Sent,
    /// Pack PUT bodies still to damage (the next ones go through damaged, then clean).
    pub damage: Arc<AtomicUsize>,
    /// Pack PUT bodies damaged so far.
    pub damaged: Arc<AtomicUsize>,
}

impl Proxy {
    /// Starts a proxy to `upstream` that damages nothing until `damage` is raised.
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let proxy = Proxy {
            endpoint,
            sent: Sent::default(),
            damage: Arc::default(),
            damaged: Arc::default(),
        };
        let (conns, damage, damaged) = (
            proxy.sent.clone(),
            proxy.damage.clone(),
            proxy.damaged.clone(),
        );
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let log = Arc::new(Mutex::new(Vec::new()));
                conns.lock().push(log.clone());
                let (damage, damaged) = (damage.clone(), damaged.clone());
                tokio::spawn(relay(client, upstream, log, damage, damaged));
            }
        });
        proxy
    }
}

async fn relay(
    mut client: TcpStream,
    upstream: SocketAddr,
    log: Arc<Mutex<Vec<u8>>>,
    damage: Arc<AtomicUsize>,
    damaged: Arc<AtomicUsize>,
) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut c_read, mut c_write) = client.split();
    let (mut s_read, mut s_write) = tokio::io::split(server);
    let up = async {
        let mut buf = vec![0u8; 64 << 10];
        // Stream offsets: where the next unparsed request head starts, and the byte to flip.
        let (mut next_head, mut flip_at) = (0usize, None::<usize>);
        loop {
            let n = c_read.read(&mut buf).await?;
            if n == 0 {
                return s_write.shutdown().await;
            }
            let start = {
                let mut l = log.lock();
                let start = l.len();
                l.extend_from_slice(&buf[..n]);
                // Parse every complete head so far: decide whether its body gets damaged.
                while next_head <= l.len() {
                    let Some(end) = l[next_head..].windows(4).position(|w| w == b"\r\n\r\n") else {
                        break;
                    };
                    let head_end = next_head + end + 4;
                    let head =
                        String::from_utf8_lossy(&l[next_head..head_end]).to_ascii_lowercase();
                    let body: usize = head
                        .lines()
                        .find_map(|h| h.strip_prefix("content-length:"))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0);
                    let pack_put = head.starts_with("put ")
                        && head.lines().next().is_some_and(|r| r.contains(".pack"));
                    if pack_put
                        && body > FLIP_AT
                        && damage
                            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| d.checked_sub(1))
                            .is_ok()
                    {
                        flip_at = Some(head_end + FLIP_AT);
                    }
                    next_head = head_end + body;
                }
                start
            };
            if let Some(at) = flip_at.filter(|&at| (start..start + n).contains(&at)) {
                buf[at - start] ^= 0x5A;
                log.lock()[at] ^= 0x5A;
                damaged.fetch_add(1, Ordering::AcqRel);
                flip_at = None;
            }
            s_write.write_all(&buf[..n]).await?;
        }
    };
    let down = tokio::io::copy(&mut s_read, &mut c_write);
    let _: (std::io::Result<()>, std::io::Result<u64>) = tokio::join!(up, down);
}

/// The request heads (lower-cased) of every PUT the proxy saw.
pub fn put_heads(sent: &Sent) -> Vec<String> {
    let mut heads = Vec::new();
    for conn in sent.lock().iter() {
        let bytes = conn.lock();
        let mut rest = &bytes[..];
        while let Some(end) = rest.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&rest[..end + 4]).to_ascii_lowercase();
            let body: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            rest = &rest[(end + 4 + body).min(rest.len())..];
            if head.starts_with("put ") {
                heads.push(head);
            }
        }
    }
    heads
}

/// The value of header `name` (lower-case) in `head`.
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}
