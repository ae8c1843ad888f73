//! The webhook's serving certificate: read from a directory holding `tls.crt` and `tls.key` (a
//! mounted kubernetes.io/tls Secret), and read again when the files change.
//!
//! The kubelet updates a mounted Secret by swapping a symlink to a new directory, so the two
//! files change together; the watcher polls their contents (a change of bytes, not of mtimes,
//! which a symlink swap does not touch) and installs a new pair only when it loads and the key
//! matches the certificate. Handshakes after that use the new pair; connections already open
//! keep theirs. A broken new pair (half-written, a key of another certificate) keeps the old one
//! in use and is logged once, until the files change again.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::rustls::crypto::{CryptoProvider, aws_lc_rs};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use super::WebhookError;

/// The certificate chain's file name in the TLS directory (a kubernetes.io/tls Secret's key).
pub const CERT_FILE: &str = "tls.crt";
/// The private key's file name in the TLS directory.
pub const KEY_FILE: &str = "tls.key";
/// Largest certificate or key file read (a chain of a few certificates is a few KiB).
const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// The raw bytes of the two files, to tell whether they changed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pair {
    cert: Vec<u8>,
    key: Vec<u8>,
}

fn read_bounded(path: &Path) -> Result<Vec<u8>, WebhookError> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|source| WebhookError::ReadTls {
        path: path.to_path_buf(),
        source,
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| WebhookError::ReadTls {
            path: path.to_path_buf(),
            source,
        })?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(WebhookError::BadTls {
            path: path.to_path_buf(),
            why: format!("larger than {MAX_PEM_BYTES} bytes; it is not a certificate or key"),
        });
    }
    Ok(bytes)
}

fn read_pair(dir: &Path) -> Result<Pair, WebhookError> {
    Ok(Pair {
        cert: read_bounded(&dir.join(CERT_FILE))?,
        key: read_bounded(&dir.join(KEY_FILE))?,
    })
}

fn certified(
    dir: &Path,
    pair: &Pair,
    provider: &CryptoProvider,
) -> Result<CertifiedKey, WebhookError> {
    let cert_path = dir.join(CERT_FILE);
    let key_path = dir.join(KEY_FILE);
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pair.cert)
        .collect::<Result<_, _>>()
        .map_err(|e| WebhookError::BadTls {
            path: cert_path.clone(),
            why: format!("not a PEM certificate chain ({e})"),
        })?;
    if chain.is_empty() {
        return Err(WebhookError::BadTls {
            path: cert_path,
            why:
                "holds no PEM CERTIFICATE block; put the serving certificate (and its chain) there"
                    .into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&pair.key).map_err(|e| WebhookError::BadTls {
        path: key_path.clone(),
        why: format!("holds no usable PEM private key ({e}); put the certificate's key there"),
    })?;
    CertifiedKey::from_der(chain, key, provider).map_err(|e| WebhookError::BadTls {
        path: key_path,
        why: format!(
            "cannot serve with this key and {} ({e}); the key must be the certificate's",
            CERT_FILE
        ),
    })
}

/// The certificate every new handshake is answered with; replaced when the files change.
#[derive(Debug)]
pub struct Certificates {
    dir: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<(Pair, Arc<CertifiedKey>)>,
    /// Why the files last failed to load, so one problem is logged once, not at every look.
    last_problem: RwLock<Option<String>>,
}

impl Certificates {
    /// Loads `dir/tls.crt` and `dir/tls.key`; an error names the file and what is wrong.
    pub fn load(dir: &Path) -> Result<Arc<Certificates>, WebhookError> {
        let provider = Arc::new(aws_lc_rs::default_provider());
        let pair = read_pair(dir)?;
        let key = certified(dir, &pair, &provider)?;
        Ok(Arc::new(Certificates {
            dir: dir.to_path_buf(),
            provider,
            current: RwLock::new((pair, Arc::new(key))),
            last_problem: RwLock::new(None),
        }))
    }

    /// Reads the files again; installs them when they changed and load. `Ok(true)`: a new
    /// pair is in use. `Err`: they changed but do not load, and the old pair stays.
    pub fn reload(&self) -> Result<bool, WebhookError> {
        let pair = read_pair(&self.dir)?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == pair {
            return Ok(false);
        }
        match certified(&self.dir, &pair, &self.provider) {
            Ok(key) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = (pair, Arc::new(key));
                Ok(true)
            }
            Err(e) => Err(e),
        }
    }

    /// [`Certificates::reload`], logging what happened: a new pair once, and each problem with
    /// the files once (until it changes, or a good pair is loaded).
    pub fn reload_and_log(&self) {
        let problem = match self.reload() {
            Ok(true) => {
                tracing::info!(dir = %self.dir.display(), "webhook: new serving certificate loaded; new connections use it");
                None
            }
            Ok(false) => None,
            Err(e) => Some(e.to_string()),
        };
        let mut last = self.last_problem.write().unwrap_or_else(|e| e.into_inner());
        if let Some(why) = &problem
            && last.as_ref() != Some(why)
        {
            tracing::warn!(error = %why, "webhook: the certificate files do not load; still serving the previous certificate");
        }
        *last = problem;
    }

    /// The TLS server config answering every handshake with the current pair (HTTP/1.1).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<ServerConfig>, WebhookError> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| WebhookError::BadTls {
                path: self.dir.clone(),
                why: format!("the TLS provider offers no protocol version ({e})"),
            })?
            .with_no_client_auth()
            .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Arc::new(config))
    }

    /// Polls the files every `every` and reloads them when they change, until aborted.
    pub fn watch(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let me = me.clone();
                // File reads: off the async workers.
                let _ = tokio::task::spawn_blocking(move || me.reload_and_log()).await;
            }
        })
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(
            self.current
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .clone(),
        )
    }
}
