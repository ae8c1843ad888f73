//! The DRA driver's two kubelet sockets, kept served for the daemon's life.
//!
//! `<plugins_dir>/<driver>/dra.sock` carries the DRA services (v1, v1beta1) and the health
//! services (v1, v1alpha1); `<plugins_registry_dir>/<driver>-reg.sock` carries the plugin
//! registration, which the kubelet finds by watching its registry directory (also after the
//! kubelet restarts: it reads the directory again). The service socket is bound first, so the
//! endpoint a registration names always exists.
//!
//! A socket that disappears (a directory wiped, a file removed by hand) is served again at once,
//! together with the registration, so the kubelet registers the plugin anew. On shutdown the
//! registration goes first (the kubelet stops sending calls), then the service socket; both
//! files are unlinked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use super::{
    ConnLimits, DraService, HealthService, KubeletError, RegistrationService, RegistrationState,
    ServedSocket,
};

/// How often the sockets are checked by default.
pub const WATCH_EVERY: Duration = Duration::from_secs(1);

/// Where the driver's sockets go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DraDriverConfig {
    /// The DRA driver name.
    pub driver: String,
    /// The kubelet's plugin registry directory (`dra.plugins_registry_dir`).
    pub registry_dir: PathBuf,
    /// The kubelet's plugins directory (`dra.plugins_dir`).
    pub plugins_dir: PathBuf,
    /// How often the sockets are checked for having disappeared.
    pub watch_every: Duration,
}

impl DraDriverConfig {
    /// The DRA and health services' socket: `<plugins_dir>/<driver>/dra.sock`.
    pub fn endpoint(&self) -> PathBuf {
        self.plugins_dir.join(&self.driver).join("dra.sock")
    }

    /// The registration socket: `<plugins_registry_dir>/<driver>-reg.sock`.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir.join(format!("{}-reg.sock", self.driver))
    }
}

/// The driver's side of the kubelet, as `status` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DraDriverStatus {
    /// The DRA driver name.
    pub driver: String,
    /// The DRA and health services' socket.
    pub endpoint: PathBuf,
    /// The registration socket.
    pub registration_socket: PathBuf,
    /// `registered`, `refused` or `waiting`.
    pub registration: &'static str,
    /// The kubelet's reason, when it refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The running sockets.
pub struct DraDriver {
    config: DraDriverConfig,
    state: watch::Receiver<RegistrationState>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

/// Everything served, able to build its routers again.
struct Services {
    dra: DraService,
    health: HealthService,
    registration: RegistrationService,
    limits: ConnLimits,
}

impl Services {
    fn serve_endpoint(&self, path: &Path) -> Result<ServedSocket, KubeletError> {
        let router = super::conn::server()
            .add_service(self.dra.v1_server())
            .add_service(self.dra.v1beta1_server())
            .add_service(self.health.v1_server())
            .add_service(self.health.v1alpha1_server());
        ServedSocket::serve(path, router, self.limits)
    }

    fn serve_registration(&self, path: &Path) -> Result<ServedSocket, KubeletError> {
        self.registration.reset();
        let router = super::conn::server().add_service(self.registration.clone().into_server());
        ServedSocket::serve(path, router, self.limits)
    }
}

impl DraDriver {
    /// Serves both sockets with the default [`ConnLimits`] and keeps them served until
    /// [`DraDriver::shutdown`].
    pub fn start(
        config: DraDriverConfig,
        dra: DraService,
        health: HealthService,
    ) -> Result<DraDriver, KubeletError> {
        Self::start_with_limits(config, ConnLimits::default(), dra, health)
    }

    /// Serves both sockets, each with `limits` on its connections, and keeps them served until
    /// [`DraDriver::shutdown`].
    pub fn start_with_limits(
        config: DraDriverConfig,
        limits: ConnLimits,
        dra: DraService,
        health: HealthService,
    ) -> Result<DraDriver, KubeletError> {
        let endpoint = config.endpoint();
        let registration_path = config.registration_socket();
        let registration = RegistrationService::dra(
            &config.driver,
            &endpoint,
            &[
                kubelet_proto::DRA_V1_SERVICE,
                kubelet_proto::DRA_V1BETA1_SERVICE,
                kubelet_proto::HEALTH_V1_SERVICE,
                kubelet_proto::HEALTH_V1ALPHA1_SERVICE,
            ],
        );
        let state = registration.subscribe();
        let services = Services {
            dra,
            health,
            registration,
            limits,
        };
        let served = services.serve_endpoint(&endpoint)?;
        let registered = services.serve_registration(&registration_path)?;
        tracing::info!(driver = %config.driver, endpoint = %endpoint.display(),
            registration = %registration_path.display(), "serving the kubelet's DRA plugin sockets");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(keep_served(
            services,
            config.watch_every,
            (endpoint, served),
            (registration_path, registered),
            stopped,
        ));
        Ok(DraDriver {
            config,
            state,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The kubelet's verdict on the registration now.
    pub fn registration(&self) -> RegistrationState {
        self.state.borrow().clone()
    }

    /// Follows the kubelet's verdicts.
    pub fn subscribe(&self) -> watch::Receiver<RegistrationState> {
        self.state.clone()
    }

    /// A function giving the driver's status (for the `status` document).
    pub fn status_source(&self) -> impl Fn() -> DraDriverStatus + Send + Sync + 'static {
        let state = self.state.clone();
        let config = self.config.clone();
        move || {
            let (registration, reason) = match &*state.borrow() {
                RegistrationState::Waiting => ("waiting", None),
                RegistrationState::Registered => ("registered", None),
                RegistrationState::Refused(r) => ("refused", Some(r.clone())),
            };
            DraDriverStatus {
                driver: config.driver.clone(),
                endpoint: config.endpoint(),
                registration_socket: config.registration_socket(),
                registration,
                reason,
            }
        }
    }

    /// Stops serving and unlinks both sockets (the registration first).
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
        {
            tracing::warn!(error = %e, "the DRA socket keeper ended badly");
        }
    }
}

impl Drop for DraDriver {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            // Dropping the sockets inside the task unlinks them.
            task.abort();
        }
    }
}

/// Re-serves a socket that disappeared; on stop, shuts both down (registration first).
async fn keep_served(
    services: Services,
    every: Duration,
    (endpoint, mut served): (PathBuf, ServedSocket),
    (registration, mut registered): (PathBuf, ServedSocket),
    mut stopped: oneshot::Receiver<()>,
) {
    let mut last_error = None;
    loop {
        tokio::select! {
            _ = &mut stopped => break,
            () = tokio::time::sleep(every) => {}
        }
        let endpoint_gone = !served.is_present() || !served.is_serving();
        if endpoint_gone {
            match services.serve_endpoint(&endpoint) {
                Ok(new) => {
                    tracing::warn!(socket = %endpoint.display(), "the DRA socket disappeared; served it again");
                    let old = std::mem::replace(&mut served, new);
                    tokio::spawn(old.shutdown());
                }
                Err(e) => {
                    report(&mut last_error, &e);
                    continue;
                }
            }
        }
        if endpoint_gone || !registered.is_present() || !registered.is_serving() {
            match services.serve_registration(&registration) {
                Ok(new) => {
                    tracing::warn!(socket = %registration.display(), "served the registration socket again; the kubelet registers the plugin anew");
                    let old = std::mem::replace(&mut registered, new);
                    tokio::spawn(old.shutdown());
                    last_error = None;
                }
                Err(e) => report(&mut last_error, &e),
            }
        }
    }
    services.health.close();
    registered.shutdown().await;
    served.shutdown().await;
    tracing::info!(driver = %services.dra.settings().driver, "the kubelet's DRA plugin sockets are closed");
}

/// Logs a failure to serve again once per distinct error.
fn report(last: &mut Option<String>, e: &KubeletError) {
    let text = e.to_string();
    if last.as_deref() != Some(text.as_str()) {
        tracing::error!(error = %text, "cannot serve a DRA plugin socket again; retrying");
        *last = Some(text);
    }
}
