//! `nri-accel webhook`: the validating admission webhook (docs/webhook.md).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
#[cfg(feature = "tls")]
use std::sync::Arc;
#[cfg(feature = "tls")]
use std::time::Duration;

#[cfg(feature = "tls")]
use crate::kube::{DEFAULT_CALL_TIMEOUT, KubeClient};
#[cfg(feature = "tls")]
use crate::webhook::check::Rules;
#[cfg(feature = "tls")]
use crate::webhook::fleet::{Capacity, Fleet};
#[cfg(feature = "tls")]
use crate::webhook::tls::Certificates;
#[cfg(feature = "tls")]
use crate::webhook::{State, serve};

/// Where the webhook learns what devices the nodes have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CapacitySource {
    /// List the ResourceSlices of the config's DRA driver through the API server.
    Slices,
    /// Do not ask the API server: check the annotations and the config's families only.
    None,
}

/// The webhook's command-line settings.
#[derive(Debug, Clone, clap::Args)]
pub struct WebhookArgs {
    /// Address to serve HTTPS on.
    #[arg(long, default_value = "0.0.0.0:8443")]
    pub listen: SocketAddr,
    /// Directory holding tls.crt and tls.key (a mounted kubernetes.io/tls Secret); the files
    /// are read again when they change.
    #[arg(long, default_value = "/etc/nri-accel/tls")]
    pub tls_dir: PathBuf,
    /// Seconds between two looks at the certificate files.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub tls_reload_secs: u64,
    /// Where the nodes' devices are learnt from.
    #[arg(long, value_enum, default_value_t = CapacitySource::Slices)]
    pub capacity: CapacitySource,
    /// Seconds between two reads of the ResourceSlices.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub capacity_refresh_secs: u64,
}

/// A build without the `tls` feature (the demo build) has no HTTPS server: it says so.
#[cfg(not(feature = "tls"))]
pub async fn run(
    _config_path: &Path,
    _args: WebhookArgs,
    _registry: &policies::Registry,
) -> anyhow::Result<ExitCode> {
    anyhow::bail!(
        "this build of nri-accel has no TLS (the demo build leaves it out), so it cannot serve \
         the webhook: run the shipped binary (cargo build --release -p nri-accel)"
    )
}

/// Runs the webhook until SIGTERM or SIGINT, judging asks with the policies of `registry`
/// (the nodes' build should register the same).
#[cfg(feature = "tls")]
pub async fn run(
    config_path: &Path,
    args: WebhookArgs,
    registry: &policies::Registry,
) -> anyhow::Result<ExitCode> {
    let config = super::load_config(config_path)?;
    let certs = Certificates::load(&args.tls_dir)?;
    let _watch = certs.watch(Duration::from_secs(args.tls_reload_secs));
    let rules = Arc::new(Rules {
        prefix: config.annotations.prefix.clone(),
        pools: config.pools.clone(),
        registry: registry.clone(),
    });
    let mut claims: Option<Arc<dyn crate::webhook::admit::ClaimLookup>> = None;
    let (fleet, _refresh) = match args.capacity {
        CapacitySource::None => (
            Fleet::fixed(Capacity::Unknown(
                "the webhook runs with --capacity none".to_string(),
            )),
            None,
        ),
        CapacitySource::Slices => {
            match KubeClient::from_kubeconfig(
                config.kubernetes.kubeconfig.as_deref(),
                DEFAULT_CALL_TIMEOUT,
            )
            .await
            {
                Ok(client) => {
                    let fleet = Fleet::fixed(Capacity::Unknown(
                        "the ResourceSlices were not read yet".to_string(),
                    ));
                    claims = Some(Arc::new(client.clone()));
                    let task = fleet.keep_fresh(
                        Arc::new(client),
                        config.dra.driver_name.clone(),
                        Duration::from_secs(args.capacity_refresh_secs),
                    );
                    (fleet, Some(task))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "webhook: no API server client; the nodes' capacity is not checked");
                    (
                        Fleet::fixed(Capacity::Unknown(format!("no API server client: {e}"))),
                        None,
                    )
                }
            }
        }
    };
    let state = State {
        rules,
        fleet,
        claims,
        resource_prefix: config.device_plugin.resource_prefix.clone(),
    };
    let server = serve(args.listen, &certs, state).await?;
    println!(
        "nri-accel webhook: serving https://{}/validate",
        server.local_addr()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    tracing::info!("webhook: stopping");
    server.into_task().abort();
    Ok(ExitCode::SUCCESS)
}
