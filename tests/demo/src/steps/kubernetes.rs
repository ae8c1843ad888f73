//! The demo's Kubernetes DRA path: the daemon publishes its ResourceSlices to kube-sim's
//! in-process API server, kube-sim's scheduler allocates a claim from them, kube-sim's kubelet
//! calls NodePrepareResources over the real DRA socket, and the runtime creates the container
//! with the CDI ids it got back; nri-accel gives it the GPU's NUMA-local CPUs.

use std::path::Path;

use anyhow::{Context, bail};
use fake_runtime::FakeRuntime;
use kube_sim::apiserver::{ApiServer, RESOURCE_CLAIMS};
use kube_sim::kubelet::wire::dra::Claim;
use kube_sim::kubelet::{DraClient, PluginWatcher};
use kube_sim::scheduler::{self, DeviceRequest};
use serde_json::Value;

use nri_accel::claims_api::ClaimsClient;
use nri_accel::config::Config;
use nri_accel::fixtures;

use super::{WAIT, pod, show_adjustment};

/// The demo node's name in the simulated cluster (and so its DRA pool's).
const NODE: &str = "demo-node";

/// Starts the simulated API server, with the demo node on it, and turns the DRA driver on in
/// `cfg`: kubeconfig and the kubelet's directories under `dir`.
pub(super) async fn enable(cfg: &mut Config, dir: &Path) -> anyhow::Result<ApiServer> {
    let api = ApiServer::start()
        .await
        .context("starting the simulated API server")?;
    api.add_node(NODE);
    let kubeconfig = dir.join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)
        .context("writing the demo's kubeconfig")?;
    cfg.dra.enabled = true;
    cfg.dra.plugins_registry_dir = dir.join("kubelet/plugins_registry");
    cfg.dra.plugins_dir = dir.join("kubelet/plugins");
    cfg.kubernetes.node_name = NODE.into();
    cfg.kubernetes.kubeconfig = Some(kubeconfig);
    Ok(api)
}

/// Runs the DRA path and leaves nothing held: the container is removed and its claim
/// unprepared at the end.
pub(super) async fn run(
    cfg: &Config,
    api: &ApiServer,
    fake: &FakeRuntime,
    client: &ClaimsClient,
) -> anyhow::Result<()> {
    let driver = cfg.dra.driver_name.as_str();
    let published = tokio::time::timeout(WAIT, async {
        loop {
            let report = client.status().await?;
            if report.document["kubernetes"]["resource_slices"]["state"] == "published" {
                return anyhow::Ok(api.resource_slices());
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .context("waiting for the ResourceSlices to be published")??;
    let devices: usize = published
        .iter()
        .map(|s| s["spec"]["devices"].as_array().map_or(0, Vec::len))
        .sum();
    let counter_sets: usize = published
        .iter()
        .map(|s| s["spec"]["sharedCounters"].as_array().map_or(0, Vec::len))
        .sum();
    println!(
        "   published to the API server: {} ResourceSlices, {devices} devices in pool {NODE}",
        published.len()
    );
    println!(
        "   ({counter_sets} counter set: the slices of gpu3 each consume some of its counters, so the"
    );
    println!("   scheduler can never allocate two slices that overlap)");

    let mut kubelet = PluginWatcher::new(&cfg.dra.plugins_registry_dir);
    let plugin = kubelet
        .wait_for(driver, WAIT)
        .await
        .context("waiting for the kubelet to register the plugin")?;
    println!(
        "   the kubelet registered {} ({}) at {}",
        plugin.name,
        plugin.dra_version,
        plugin.endpoint.display()
    );

    let whole = |d: &Value| scheduler::attribute(d, "family") == Some("exclusive");
    let allocation = scheduler::allocate(
        &published,
        &api.all(&RESOURCE_CLAIMS),
        driver,
        NODE,
        "uid-k8s-train",
        &[DeviceRequest {
            name: "gpu",
            matches: &whole,
        }],
    )
    .map_err(anyhow::Error::msg)
    .context("the simulated scheduler")?;
    let device = allocation["devices"]["results"][0]["device"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    api.insert(
        &RESOURCE_CLAIMS,
        scheduler::allocated_claim(
            "default",
            "train-gpu",
            "uid-k8s-train",
            "gpu.accel.nri.io",
            &["gpu"],
            allocation,
        ),
    );
    println!("   the scheduler allocated ResourceClaim default/train-gpu: device {device}");

    let dra = DraClient::for_plugin(&plugin).await?;
    let claim = Claim {
        namespace: "default".into(),
        uid: "uid-k8s-train".into(),
        name: "train-gpu".into(),
    };
    let answer = dra.prepare(std::slice::from_ref(&claim)).await?;
    let ids: Vec<String> = match answer.get(&claim.uid) {
        Some(Ok(devices)) => devices
            .iter()
            .flat_map(|d| d.cdi_device_ids.iter().cloned())
            .collect(),
        Some(Err(e)) => bail!("NodePrepareResources refused the claim: {e}"),
        None => bail!("NodePrepareResources did not answer for the claim"),
    };
    println!(
        "   kubelet NodePrepareResources over the DRA socket -> CDI {}",
        ids.join(", ")
    );

    let p = pod("k8s-train", &[]);
    fake.add_pod(p.clone());
    let c = fixtures::container("c-k8s-train-00000001", &p, "trainer", &ids);
    fake.create_container(&p, &c).await?;
    fake.add_container(c.clone());
    println!(
        "   the runtime creates the pod's container with those CDI names; nri-accel's answer,"
    );
    println!(
        "   the adjustment, pins it to the GPU's NUMA-local CPUs (step 4 explains the numbers):"
    );
    show_adjustment(fake, &c.id);

    fake.notify(nri_proto::api::Event::REMOVE_CONTAINER, &p, Some(&c))
        .await?;
    match dra.unprepare(&[claim]).await?.get("uid-k8s-train") {
        Some(Ok(())) => println!("   the pod went; kubelet NodeUnprepareResources: released"),
        Some(Err(e)) => bail!("NodeUnprepareResources failed: {e}"),
        None => bail!("NodeUnprepareResources did not answer for the claim"),
    }
    Ok(())
}
