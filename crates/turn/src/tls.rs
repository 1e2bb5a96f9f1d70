//! TLS for the client listener: rustls with coturn's `cert` and `pkey` (PEM), reloadable.
//!
//! A reload (SIGUSR2, coturn's, or SIGHUP, or a change of the files seen by
//! [`crate::certwatch`]) reads the files again; new connections get the new certificate,
//! connections already open keep theirs. A reload that fails (unreadable file, no key, a key
//! that does not match the certificate) is logged and the previous certificate stays.
//!
//! With coturn's `CA-file`, clients must present a certificate that chains to one of its CAs,
//! as coturn asks OpenSSL (`SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT`): a client
//! without one, or with another, fails the handshake. Its CAs' names are sent in the
//! CertificateRequest, as `SSL_CTX_set_client_CA_list` does.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::RwLock;

/// The TLS listener's files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM certificate chain (coturn's `cert`).
    pub cert: PathBuf,
    /// PEM private key (coturn's `pkey`).
    pub pkey: PathBuf,
    /// TLS 1.3 only (coturn's `no-tlsv1_2`).
    pub tls13_only: bool,
    /// coturn's `CA-file`: clients must present a certificate signed by one of its CAs.
    pub client_ca: Option<PathBuf>,
    /// Reload when the files change ([`crate::certwatch`]); off with our `no-cert-watch`.
    pub watch: bool,
}

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
    /// The `CA-file` holds no CA certificate rustls can use, or rustls refused the set.
    #[error("CA-file {path}: {why}")]
    ClientCa {
        /// The CA file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
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

/// What the files held when read: the certificate, the key and the client CAs, read one
/// after the other (a configuration is built from these bytes, not from the files again).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Pems {
    cert: Vec<u8>,
    key: Vec<u8>,
    ca: Option<Vec<u8>>,
}

/// Sizes only: the key never reaches a log.
impl std::fmt::Debug for Pems {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pems")
            .field("cert_bytes", &self.cert.len())
            .field("key_bytes", &self.key.len())
            .field("ca_bytes", &self.ca.as_ref().map(Vec::len))
            .finish()
    }
}

impl Pems {
    /// Reads the files of `files`.
    pub(crate) fn read(files: &TlsFiles) -> Result<Pems, TlsError> {
        Ok(Pems {
            cert: read(&files.cert)?,
            key: read(&files.pkey)?,
            ca: files.client_ca.as_deref().map(read).transpose()?,
        })
    }
}

/// The current TLS server configuration, swapped on reload.
#[derive(Debug)]
pub struct Certs {
    files: TlsFiles,
    current: RwLock<Arc<rustls::ServerConfig>>,
    /// The bytes [`Certs::current`] was built from.
    loaded: parking_lot::Mutex<Pems>,
}

impl Certs {
    /// Loads the certificate, the key and the client CAs (an error here is a start-up error).
    pub fn load(files: &TlsFiles) -> Result<Certs, TlsError> {
        let pems = Pems::read(files)?;
        let config = build(files, &pems)?;
        Ok(Certs {
            files: files.clone(),
            current: RwLock::new(Arc::new(config)),
            loaded: parking_lot::Mutex::new(pems),
        })
    }

    /// The files this configuration is read from.
    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The configuration for a new connection.
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        Arc::clone(&self.current.read())
    }

    /// Reads the files again; on error the previous configuration stays in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let pems = Pems::read(&self.files)?;
        let config = Arc::new(build(&self.files, &pems)?);
        *self.loaded.lock() = pems;
        *self.current.write() = config;
        Ok(())
    }

    /// Installs `pems` if they differ from the bytes in use: `Ok(true)` if they did and
    /// were installed, `Ok(false)` if they are the same; on error the previous configuration
    /// stays in use.
    pub(crate) fn reload_changed(&self, pems: Pems) -> Result<bool, TlsError> {
        let mut loaded = self.loaded.lock();
        if *loaded == pems {
            return Ok(false);
        }
        let config = Arc::new(build(&self.files, &pems)?);
        *loaded = pems;
        *self.current.write() = config;
        Ok(true)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn build(files: &TlsFiles, pems: &Pems) -> Result<rustls::ServerConfig, TlsError> {
    let (cert, key) = (files.cert.as_path(), files.pkey.as_path());
    let (cert_pem, key_pem) = (&pems.cert, &pems.key);
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
    let versions: &[&rustls::SupportedProtocolVersion] = if files.tls13_only {
        &[&rustls::version::TLS13]
    } else {
        rustls::DEFAULT_VERSIONS
    };
    let rustls_err = |source| TlsError::Rustls {
        cert: cert.to_path_buf(),
        key: key.to_path_buf(),
        source,
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(versions)
        .map_err(rustls_err)?;
    let builder = match (&files.client_ca, &pems.ca) {
        (Some(ca), Some(pem)) => {
            builder.with_client_cert_verifier(client_verifier(ca, pem, provider)?)
        }
        _ => builder.with_no_client_auth(),
    };
    builder.with_single_cert(chain, private).map_err(rustls_err)
}

/// The verifier of coturn's `CA-file`: a client certificate is required and must chain to
/// one of the file's CAs (certificates rustls cannot parse are skipped, as OpenSSL skips
/// them; a file with none it can use is an error).
fn client_verifier(
    ca: &Path,
    pem: &[u8],
    provider: Arc<rustls::crypto::CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let err = |why: String| TlsError::ClientCa {
        path: ca.to_path_buf(),
        why,
    };
    let certs: Vec<_> = rustls_pemfile::certs(&mut &pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| err(format!("not PEM: {e}")))?;
    let mut roots = rustls::RootCertStore::empty();
    let (added, _skipped) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(err("no CA certificate found".into()));
    }
    rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| err(e.to_string()))
}
