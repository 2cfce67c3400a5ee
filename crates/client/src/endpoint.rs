//! Where the client reaches the API ([`Endpoint`]): the daemon's unix socket, or a TCP
//! listener named by `--url`, with TLS for `https://` (rustls with the aws-lc-rs provider, as
//! the daemon's listener).
//!
//! Contract:
//! - `http://HOST:PORT` is plaintext (the daemon allows that only on loopback);
//!   `https://HOST:PORT` is TLS 1.2/1.3, ALPN `http/1.1`, no client certificate. HOST is a DNS
//!   name, an IPv4 address or a bracketed IPv6 address; PORT is required; a path (other than
//!   one trailing `/`), query or user part is refused. Anything else is [`UrlError::BadUrl`].
//! - The daemon's certificate must chain to a certificate of the CA file (`--ca` /
//!   `GLIDEFS_CA`, PEM; every CERTIFICATE block in it is trusted) or, without one, to the
//!   system's CA certificates (`rustls-native-certs`: `SSL_CERT_FILE` / `SSL_CERT_DIR`, else
//!   the distribution's bundle), and must be valid for HOST (a DNS or IP-address SAN). There is
//!   no way to skip verification.
//! - A CA file with an `http://` URL is refused ([`UrlError::CaWithoutTls`]): whoever gave it
//!   expected TLS.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

/// Where the API listens.
#[derive(Clone)]
pub enum Endpoint {
    /// A unix socket path.
    Unix(PathBuf),
    /// `host:port` in plaintext, with the bearer token to send.
    Tcp { addr: String, token: Option<String> },
    /// `host:port` over TLS, verified as `tls` says, with the bearer token to send.
    Tls {
        addr: String,
        token: Option<String>,
        tls: TlsTarget,
    },
}

impl Endpoint {
    /// The bearer token sent on every request, if any.
    pub(crate) fn token(&self) -> Option<&str> {
        match self {
            Endpoint::Tcp { token, .. } | Endpoint::Tls { token, .. } => token.as_deref(),
            Endpoint::Unix(_) => None,
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp { addr, .. } => write!(f, "http://{addr}"),
            Endpoint::Tls { addr, .. } => write!(f, "https://{addr}"),
        }
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// Why `--url` (with `--ca`) does not make an endpoint; each names the URL or the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    #[error("--url `{url}`: {why}; expected https://HOST:PORT (or http://HOST:PORT for a loopback listener)")]
    BadUrl { url: String, why: &'static str },
    #[error("--url `{url}` is plaintext but a CA file `{ca}` was given (--ca or GLIDEFS_CA): use https://")]
    CaWithoutTls { url: String, ca: PathBuf },
    #[error("cannot read the CA file `{path}` (--ca or GLIDEFS_CA): {source}")]
    CaRead {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the CA file `{path}` (--ca or GLIDEFS_CA): {message}")]
    CaPem { path: PathBuf, message: String },
    #[error("--url `{url}`: no --ca FILE given and no system CA certificates found ({detail}); pass the CA that signed the daemon's api.tls_cert with --ca FILE")]
    NoRoots { url: String, detail: String },
    #[error("--url `{url}`: cannot set up TLS: {message}")]
    Config { url: String, message: String },
}

/// What an `https://` endpoint verifies: the host the certificate must name and the rustls
/// client configuration (trust roots, protocol versions, ALPN).
#[derive(Clone)]
pub struct TlsTarget {
    /// HOST as given in the URL (without IPv6 brackets), for messages.
    pub host: String,
    /// HOST as rustls checks it against the certificate.
    pub server_name: ServerName<'static>,
    /// The client configuration.
    pub config: Arc<rustls::ClientConfig>,
}

impl std::fmt::Debug for TlsTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsTarget")
            .field("host", &self.host)
            .finish_non_exhaustive()
    }
}

/// The endpoint `url` names: [`Endpoint::Tcp`] for `http://`, [`Endpoint::Tls`] for
/// `https://` (trusting `ca`, else the system's CA certificates); `token` is sent as bearer.
pub fn endpoint_from_url(
    url: &str,
    token: Option<String>,
    ca: Option<&Path>,
) -> Result<Endpoint, UrlError> {
    let parsed = parse(url)?;
    if !parsed.tls {
        if let Some(ca) = ca {
            return Err(UrlError::CaWithoutTls {
                url: url.to_string(),
                ca: ca.to_path_buf(),
            });
        }
        return Ok(Endpoint::Tcp {
            addr: parsed.addr,
            token,
        });
    }
    let server_name = ServerName::try_from(parsed.host.clone()).map_err(|_| UrlError::BadUrl {
        url: url.to_string(),
        why: "HOST is neither a DNS name nor an IP address",
    })?;
    let roots = match ca {
        Some(path) => ca_roots(path)?,
        None => system_roots(url)?,
    };
    let config_err = |e: rustls::Error| UrlError::Config {
        url: url.to_string(),
        message: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(config_err)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Endpoint::Tls {
        addr: parsed.addr,
        token,
        tls: TlsTarget {
            host: parsed.host,
            server_name,
            config: Arc::new(config),
        },
    })
}

/// What a failed handshake most likely means, as a clause for the error message ("" when the
/// reason says it all).
pub(crate) fn handshake_hint(err: &std::io::Error) -> &'static str {
    use rustls::{CertificateError, Error, InvalidMessage};
    match err.get_ref().and_then(|e| e.downcast_ref::<Error>()) {
        Some(Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        )) => {
            " (the daemon's certificate is not signed by a CA this client trusts: give the CA \
             that signed api.tls_cert with --ca FILE)"
        }
        Some(Error::InvalidMessage(InvalidMessage::InvalidContentType)) => {
            " (is the listener plaintext? then use http://, on loopback only)"
        }
        _ => "",
    }
}

/// A parsed `--url`.
struct Parsed {
    tls: bool,
    /// `HOST:PORT` as given (brackets kept), to connect to and for the Host header.
    addr: String,
    /// HOST without brackets.
    host: String,
}

fn parse(url: &str) -> Result<Parsed, UrlError> {
    let bad = |why| UrlError::BadUrl {
        url: url.to_string(),
        why,
    };
    let scheme = |s: &str| {
        url.get(..s.len())
            .filter(|p| p.eq_ignore_ascii_case(s))
            .map(|_| &url[s.len()..])
    };
    let (tls, rest) = match (scheme("https://"), scheme("http://")) {
        (Some(rest), _) => (true, rest),
        (None, Some(rest)) => (false, rest),
        (None, None) => return Err(bad("the scheme must be https:// or http://")),
    };
    let addr = rest.strip_suffix('/').unwrap_or(rest);
    if addr.contains(['/', '?', '#', '@']) {
        return Err(bad("a path, query or user part is not allowed"));
    }
    let (host, port) = match addr.strip_prefix('[') {
        Some(r) => r
            .split_once("]:")
            .ok_or_else(|| bad("an IPv6 address must be written [ADDR]:PORT"))?,
        None => match addr.rsplit_once(':') {
            None => return Err(bad("the :PORT is missing")),
            Some((h, _)) if h.contains(':') => {
                return Err(bad("an IPv6 address must be written [ADDR]:PORT"))
            }
            Some(hp) => hp,
        },
    };
    if host.is_empty() {
        return Err(bad("the HOST is missing"));
    }
    if port.parse::<u16>().is_err() {
        return Err(bad("PORT is not a number in 0..=65535"));
    }
    Ok(Parsed {
        tls,
        addr: addr.to_string(),
        host: host.to_string(),
    })
}

/// Every certificate of the PEM file `path`.
fn ca_roots(path: &Path) -> Result<rustls::RootCertStore, UrlError> {
    let pem_err = |message: String| UrlError::CaPem {
        path: path.to_path_buf(),
        message,
    };
    let pem = std::fs::read(path).map_err(|source| UrlError::CaRead {
        path: path.to_path_buf(),
        source,
    })?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_err(format!("not PEM: {e}")))?;
    if certs.is_empty() {
        return Err(pem_err("no CERTIFICATE block".to_string()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert)
            .map_err(|e| pem_err(format!("not a usable CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// The system's CA certificates; an error when there are none to trust.
fn system_roots(url: &str) -> Result<rustls::RootCertStore, UrlError> {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = rustls::RootCertStore::empty();
    let (added, _unparsable) = roots.add_parsable_certificates(found.certs);
    if added == 0 {
        let detail = if found.errors.is_empty() {
            "none installed".to_string()
        } else {
            found
                .errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        };
        return Err(UrlError::NoRoots {
            url: url.to_string(),
            detail,
        });
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_say_why_not() {
        for (url, tls, addr, host) in [
            (
                "http://127.0.0.1:7070",
                false,
                "127.0.0.1:7070",
                "127.0.0.1",
            ),
            (
                "http://127.0.0.1:7070/",
                false,
                "127.0.0.1:7070",
                "127.0.0.1",
            ),
            (
                "https://glidefs-host:7070",
                true,
                "glidefs-host:7070",
                "glidefs-host",
            ),
            ("HTTPS://[::1]:7070/", true, "[::1]:7070", "::1"),
        ] {
            let p = parse(url).unwrap_or_else(|e| panic!("{url}: {e}"));
            assert_eq!((p.tls, p.addr.as_str(), p.host.as_str()), (tls, addr, host));
        }
        for (url, why) in [
            ("ftp://h:1", "scheme"),
            ("127.0.0.1:7070", "scheme"),
            ("https://h", ":PORT is missing"),
            ("https://h:port", "PORT is not a number"),
            ("https://h:70000", "PORT is not a number"),
            ("https://:7070", "HOST is missing"),
            ("https://h:7070/v1", "path"),
            ("https://u@h:7070", "user"),
            ("https://::1:7070", "IPv6"),
            ("https://[::1]", "IPv6"),
        ] {
            let e = parse(url).err().unwrap_or_else(|| panic!("{url} parsed"));
            let text = e.to_string();
            assert!(text.contains(url) && text.contains(why), "{url}: {text}");
        }
    }

    #[test]
    fn a_ca_file_is_named_when_it_is_unusable() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let e = endpoint_from_url("https://h:1", None, Some(&missing)).unwrap_err();
        assert!(matches!(e, UrlError::CaRead { .. }), "{e}");
        assert!(
            e.to_string().contains(&missing.display().to_string()),
            "{e}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let e = endpoint_from_url("https://h:1", None, Some(&empty)).unwrap_err();
        let text = e.to_string();
        assert!(text.contains(&empty.display().to_string()) && text.contains("CERTIFICATE"));
        let e = endpoint_from_url("http://h:1", None, Some(&empty)).unwrap_err();
        assert!(matches!(e, UrlError::CaWithoutTls { .. }), "{e}");
    }
}
