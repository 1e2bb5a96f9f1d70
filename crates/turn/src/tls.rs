//! TLS for the client listener: rustls with coturn's `cert` and `pkey` (PEM), reloadable.
//!
//! A reload (SIGUSR2, coturn's, or SIGHUP) reads both files again; new connections get the new certificate,
//! connections already open keep theirs. A reload that fails (unreadable file, no key, a key
//! that does not match the certificate) is logged and the previous certificate stays.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

/// Why a certificate could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        source: std::io::Error,
    },
    /// The certificate file holds no PEM certificate.
    #[error("{0}: no PEM certificate found")]
    NoCertificate(PathBuf),
    /// The key file holds no PEM private key.
    #[error("{0}: no PEM private key found")]
    NoKey(PathBuf),
    /// rustls refused the pair.
    #[error("certificate {cert} and key {key}: {source}")]
    Rustls {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        source: rustls::Error,
    },
}

/// The current TLS server configuration, swapped on reload.
#[derive(Debug)]
pub struct Certs {
    cert: PathBuf,
    key: PathBuf,
    tls13_only: bool,
    current: RwLock<Arc<rustls::ServerConfig>>,
}

impl Certs {
    /// Loads `cert` and `key` (an error here is a start-up error).
    pub fn load(cert: &Path, key: &Path, tls13_only: bool) -> Result<Certs, TlsError> {
        let config = build(cert, key, tls13_only)?;
        Ok(Certs {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            tls13_only,
            current: RwLock::new(Arc::new(config)),
        })
    }

    /// The configuration for a new connection.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.current.read())
    }

    /// Reads the files again; on error the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = Arc::new(build(&self.cert, &self.key, self.tls13_only)?);
        *self.current.write() = config;
        Ok(())
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn build(cert: &Path, key: &Path, tls13_only: bool) -> Result<rustls::ServerConfig, TlsError> {
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let chain: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .collect::<Result<_, _>>()
        .map_err(|source| TlsError::Read {
            path: cert.to_path_buf(),
            source,
        })?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate(cert.to_path_buf()));
    }
    let private = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .map_err(|source| TlsError::Read {
            path: key.to_path_buf(),
            source,
        })?
        .ok_or_else(|| TlsError::NoKey(key.to_path_buf()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let versions: &[&rustls::SupportedProtocolVersion] = if tls13_only {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let rustls_err = |source| TlsError::Rustls {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    };
    rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .map_err(rustls_err)?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(rustls_err)
}
