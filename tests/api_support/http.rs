//! HTTP on the wire for the API tests: requests written byte for byte (bad content types,
//! chunked bodies, wrong tokens) and the answer read back until the server closes.

use std::path::Path;
use std::time::Duration;

use glidefs::client::RawResponse;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// A response read off the wire by [`raw_http`].
pub struct Wire {
    pub status: u16,
    /// Status line and headers.
    pub head: String,
    pub body: Vec<u8>,
}

impl Wire {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim().eq_ignore_ascii_case(name).then(|| v.trim())
        })
    }

    pub fn response(&self) -> RawResponse {
        RawResponse {
            status: self.status,
            content_type: self.header("content-type").map(str::to_string),
            body: self.body.clone().into(),
        }
    }
}

/// An HTTP/1.1 request as bytes, exactly as given (no content type unless in `headers`);
/// `content-length` is added for a body or a POST.
pub fn http_request(method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n");
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        head.push_str(&format!("content-length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut out = head.into_bytes();
    out.extend_from_slice(body);
    out
}

/// Writes `request` as is and reads the answer until the server closes the connection.
pub async fn raw_http<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, request: &[u8]) -> Wire {
    let exchange = async {
        // The server may answer (413, 401) before it read everything; the answer still comes.
        let _ = stream.write_all(request).await;
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out).await;
        out
    };
    let out = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .expect("no answer within 30 s");
    let split = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP answer: {:?}", String::from_utf8_lossy(&out)));
    let head = String::from_utf8_lossy(&out[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    Wire {
        status,
        head,
        body: out[split + 4..].to_vec(),
    }
}

pub async fn unix_http(socket: &Path, request: &[u8]) -> Wire {
    raw_http(
        tokio::net::UnixStream::connect(socket).await.unwrap(),
        request,
    )
    .await
}
