//! TLS of the TCP listener (rustls with the aws-lc-rs provider): the certificate chain and
//! private key are read once, at start, from the PEM files `api.tls_cert` and `api.tls_key`
//! (a new certificate takes a restart or `systemctl reload glidefs`); the key file must be
//! private (see [`read_secret`]). TLS 1.2 and 1.3, no
//! client certificates, ALPN `http/1.1`.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::secret::{read_secret, SecretError, MAX_SECRET_BYTES};

/// Why the TLS configuration could not be loaded; each names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("cannot read {key} `{path}`: {source}")]
    Read {
        key: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Key(#[from] SecretError),
    #[error("{key} `{path}`: {what}: {source}")]
    Pem {
        key: &'static str,
        path: String,
        what: &'static str,
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    #[error("api.tls_cert `{path}`: no CERTIFICATE block")]
    NoCertificate { path: String },
    #[error(
        "api.tls_cert `{cert}` and api.tls_key `{key}` do not make a TLS configuration: {source}"
    )]
    Config {
        cert: String,
        key: String,
        #[source]
        source: rustls::Error,
    },
}

/// The acceptor of the TCP listener, from the PEM files `cert` (chain, leaf first) and `key`.
pub(crate) fn acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, TlsError> {
    let shown_cert = cert.display().to_string();
    let shown_key = key.display().to_string();
    let cert_pem = std::fs::read(cert).map_err(|source| TlsError::Read {
        key: "api.tls_cert",
        path: shown_cert.clone(),
        source,
    })?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            key: "api.tls_cert",
            path: shown_cert.clone(),
            what: "not a PEM certificate chain",
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: shown_cert });
    }
    let key_pem = read_secret("api.tls_key", key, MAX_SECRET_BYTES)?;
    let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|source| TlsError::Pem {
        key: "api.tls_key",
        path: shown_key.clone(),
        what: "no usable private key",
        source,
    })?;
    let config_err = |source: rustls::Error| TlsError::Config {
        cert: shown_cert.clone(),
        key: shown_key.clone(),
        source,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(config_err)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(config_err)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}
