//! [`KubeApi`] on the real kube-rs client.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    DeviceClass, ResourceClaim, ResourceClaimSpec, ResourceClaimTemplate, ResourceSlice,
};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions, WatchEvent,
    WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};

use super::publisher::wire;
use super::{FIELD_MANAGER, KubeApi, KubeError, SliceEvent, SliceEvents};

/// How long one API call may take before it counts as a stall (connect, send, answer).
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the server keeps one watch open before ending it (the watcher then resumes).
const WATCH_SECONDS: u32 = 240;

/// How long a watch may stay silent before its connection counts as lost: a little longer than
/// the server keeps it open.
const WATCH_READ_TIMEOUT: Duration = Duration::from_secs(WATCH_SECONDS as u64 + 30);

/// The API server through kube-rs (rustls with aws-lc-rs; `http://` URLs work too).
#[derive(Clone)]
pub struct KubeClient {
    client: kube::Client,
    /// The same server with a read timeout that outlasts a quiet watch.
    watch_client: kube::Client,
}

impl KubeClient {
    /// A client from the config's `kubernetes.kubeconfig`: that file when given, else the
    /// in-cluster service account when running in a pod (`KUBERNETES_SERVICE_HOST` set), else
    /// `$KUBECONFIG` or `~/.kube/config`. Every call gives up after `timeout`.
    pub async fn from_kubeconfig(
        kubeconfig: Option<&Path>,
        timeout: Duration,
    ) -> Result<KubeClient, KubeError> {
        let config = match kubeconfig {
            Some(path) => {
                let file = Kubeconfig::read_from(path).map_err(|e| {
                    KubeError::Config(format!("reading the kubeconfig {}: {e}", path.display()))
                })?;
                kube::Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| {
                        KubeError::Config(format!("the kubeconfig {}: {e}", path.display()))
                    })?
            }
            None if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() => {
                kube::Config::incluster().map_err(|e| {
                    KubeError::Config(format!(
                        "the in-cluster service account (no kubernetes.kubeconfig given): {e}"
                    ))
                })?
            }
            None => kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    KubeError::Config(format!(
                        "not in a pod and no usable $KUBECONFIG or ~/.kube/config ({e}); set kubernetes.kubeconfig"
                    ))
                })?,
        };
        KubeClient::from_kube_config(config, timeout)
    }

    /// A client for the server at `url` (e.g. a test server's `http://127.0.0.1:port`), no
    /// credentials.
    pub fn for_url(url: &str, timeout: Duration) -> Result<KubeClient, KubeError> {
        let uri = url
            .parse()
            .map_err(|e| KubeError::Config(format!("API server URL {url:?}: {e}")))?;
        KubeClient::from_kube_config(kube::Config::new(uri), timeout)
    }

    fn from_kube_config(
        mut config: kube::Config,
        timeout: Duration,
    ) -> Result<KubeClient, KubeError> {
        config.connect_timeout = Some(timeout.min(Duration::from_secs(5)));
        config.read_timeout = Some(timeout);
        config.write_timeout = Some(timeout);
        // The publisher retries with its own backoff and reports each failure in `status`; the
        // kubelet retries a failed prepare. A second, hidden retry layer would only delay both.
        config.default_retry = false;
        let url = config.cluster_url.to_string();
        let mut watching = config.clone();
        watching.read_timeout = Some(WATCH_READ_TIMEOUT);
        let client = kube::Client::try_from(config)
            .map_err(|e| KubeError::Config(format!("client for {url}: {e}")))?;
        let watch_client = kube::Client::try_from(watching)
            .map_err(|e| KubeError::Config(format!("client for {url}: {e}")))?;
        Ok(KubeClient {
            client,
            watch_client,
        })
    }

    fn slices(&self) -> Api<ResourceSlice> {
        Api::all(self.client.clone())
    }

    /// The ResourceSlices of `driver` on every node (the admission webhook's view of what the
    /// nodes publish), read in pages of 200; at most 20,000 are kept, so a huge cluster costs
    /// the webhook bounded memory (the rest is logged as unread).
    pub async fn list_driver_slices(&self, driver: &str) -> Result<Vec<ResourceSlice>, KubeError> {
        let mut params = ListParams::default()
            .fields(&format!("spec.driver={driver}"))
            .limit(SLICE_PAGE);
        let mut out = Vec::new();
        loop {
            let page = self.slices().list(&params).await.map_err(|e| {
                KubeError::from_kube(format!("the ResourceSlices of driver {driver}"), e)
            })?;
            out.extend(page.items);
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() && out.len() < MAX_DRIVER_SLICES => {
                    params = params.continue_token(&token);
                }
                Some(token) if !token.is_empty() => {
                    tracing::warn!(
                        "more than {MAX_DRIVER_SLICES} ResourceSlices of driver {driver}: the rest are not read"
                    );
                    return Ok(out);
                }
                _ => return Ok(out),
            }
        }
    }
}

/// What the admission webhook reads besides slices: claims, templates and DeviceClasses.
impl KubeClient {
    /// The spec of ResourceClaim `namespace/name`; `None` when it does not exist.
    pub async fn claim_spec(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimSpec>, KubeError> {
        let api: Api<ResourceClaim> = Api::namespaced(self.client.clone(), namespace);
        let got = api
            .get_opt(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("ResourceClaim {namespace}/{name}"), e))?;
        Ok(got.map(|c| c.spec))
    }

    /// The claim spec of ResourceClaimTemplate `namespace/name`; `None` when it does not exist.
    pub async fn claim_template_spec(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<ResourceClaimSpec>, KubeError> {
        let api: Api<ResourceClaimTemplate> = Api::namespaced(self.client.clone(), namespace);
        let got = api.get_opt(name).await.map_err(|e| {
            KubeError::from_kube(format!("ResourceClaimTemplate {namespace}/{name}"), e)
        })?;
        Ok(got.map(|t| t.spec.spec))
    }

    /// Every DeviceClass (at most a few hundred in any cluster; one page).
    pub async fn list_device_classes(&self) -> Result<Vec<DeviceClass>, KubeError> {
        let api: Api<DeviceClass> = Api::all(self.client.clone());
        let list = api
            .list(&ListParams::default().limit(MAX_DEVICE_CLASSES))
            .await
            .map_err(|e| KubeError::from_kube("the DeviceClasses".to_string(), e))?;
        Ok(list.items)
    }
}

/// DeviceClasses read by [`KubeClient::list_device_classes`].
const MAX_DEVICE_CLASSES: u32 = 500;

impl KubeClient {
    async fn send_slice(
        &self,
        what: &str,
        req: hyper::Request<Vec<u8>>,
    ) -> Result<ResourceSlice, KubeError> {
        let stored: serde_json::Value = self
            .client
            .request(req)
            .await
            .map_err(|e| KubeError::from_kube(what.to_string(), e))?;
        slice_from_wire(what, stored)
    }
}

/// Requests on the ResourceSlices collection.
fn slices_request() -> kube::core::Request {
    kube::core::Request::new("/apis/resource.k8s.io/v1/resourceslices")
}

fn request_error(what: &str, e: kube::core::request::Error) -> KubeError {
    KubeError::Other {
        what: what.to_string(),
        message: e.to_string(),
    }
}

/// A slice as sent: its carried list attributes as `ints` (wire::ints_to_wire).
fn slice_to_wire(what: &str, slice: &ResourceSlice) -> Result<Vec<u8>, KubeError> {
    let mut v = serde_json::to_value(slice).map_err(|e| request_error_json(what, e))?;
    v["apiVersion"] = serde_json::json!("resource.k8s.io/v1");
    v["kind"] = serde_json::json!("ResourceSlice");
    wire::ints_to_wire(&mut v);
    serde_json::to_vec(&v).map_err(|e| request_error_json(what, e))
}

/// A slice as the server sent it, its `ints` in the carried form (wire::ints_from_wire).
fn slice_from_wire(what: &str, mut v: serde_json::Value) -> Result<ResourceSlice, KubeError> {
    wire::ints_from_wire(&mut v);
    serde_json::from_value(v).map_err(|e| request_error_json(what, e))
}

fn request_error_json(what: &str, e: serde_json::Error) -> KubeError {
    KubeError::Other {
        what: what.to_string(),
        message: format!("the ResourceSlice does not decode: {e}"),
    }
}

/// ResourceSlices asked for in one list call of [`KubeClient::list_driver_slices`].
const SLICE_PAGE: u32 = 200;
/// The most ResourceSlices [`KubeClient::list_driver_slices`] keeps.
const MAX_DRIVER_SLICES: usize = 20_000;

fn post_params(dry_run: bool) -> PostParams {
    PostParams {
        dry_run,
        field_manager: Some(FIELD_MANAGER.to_string()),
    }
}

#[async_trait]
impl KubeApi for KubeClient {
    async fn resource_claim(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<ResourceClaim, KubeError> {
        Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .get(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("ResourceClaim {namespace}/{name}"), e))
    }

    async fn node(&self, name: &str) -> Result<Node, KubeError> {
        Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .map_err(|e| KubeError::from_kube(format!("Node {name}"), e))
    }

    async fn list_slices(&self, driver: &str, node: &str) -> Result<Vec<ResourceSlice>, KubeError> {
        self.list_slices_versioned(driver, node)
            .await
            .map(|(items, _)| items)
    }

    async fn list_slices_versioned(
        &self,
        driver: &str,
        node: &str,
    ) -> Result<(Vec<ResourceSlice>, String), KubeError> {
        let what = format!("the ResourceSlices of node {node}");
        let params =
            ListParams::default().fields(&format!("spec.driver={driver},spec.nodeName={node}"));
        let req = slices_request()
            .list(&params)
            .map_err(|e| request_error(&what, e))?;
        let list: serde_json::Value = self
            .client
            .request(req)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?;
        let version = list["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let items = list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|item| slice_from_wire(&what, item.clone()))
            .collect::<Result<_, _>>()?;
        Ok((items, version))
    }

    async fn watch_slices(
        &self,
        driver: &str,
        node: &str,
        resource_version: &str,
    ) -> Result<SliceEvents, KubeError> {
        let what = format!("the ResourceSlices of node {node}");
        let params = WatchParams::default()
            .fields(&format!("spec.driver={driver},spec.nodeName={node}"))
            .timeout(WATCH_SECONDS);
        let req = slices_request()
            .watch(&params, resource_version)
            .map_err(|e| request_error(&what, e))?;
        let events = self
            .watch_client
            .request_events::<serde_json::Value>(req)
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?;
        Ok(events
            .map(move |event| match event {
                Ok(WatchEvent::Added(s) | WatchEvent::Modified(s)) => {
                    slice_from_wire(&what, s).map(SliceEvent::Applied)
                }
                Ok(WatchEvent::Deleted(s)) => slice_from_wire(&what, s).map(SliceEvent::Deleted),
                Ok(WatchEvent::Bookmark(b)) => {
                    Ok(SliceEvent::Bookmark(b.metadata.resource_version))
                }
                Ok(WatchEvent::Error(status)) => {
                    Err(KubeError::from_kube(what.clone(), kube::Error::Api(status)))
                }
                Err(e) => Err(KubeError::from_kube(what.clone(), e)),
            })
            .boxed())
    }

    async fn create_slice(
        &self,
        slice: &ResourceSlice,
        dry_run: bool,
    ) -> Result<ResourceSlice, KubeError> {
        let what = format!(
            "ResourceSlice {}",
            slice
                .metadata
                .name
                .as_deref()
                .or(slice.metadata.generate_name.as_deref())
                .unwrap_or("")
        );
        let body = slice_to_wire(&what, slice)?;
        let req = slices_request()
            .create(&post_params(dry_run), body)
            .map_err(|e| request_error(&what, e))?;
        self.send_slice(&what, req).await
    }

    async fn replace_slice(&self, slice: &ResourceSlice) -> Result<ResourceSlice, KubeError> {
        let name = slice.metadata.name.clone().unwrap_or_default();
        let what = format!("ResourceSlice {name}");
        let body = slice_to_wire(&what, slice)?;
        let req = slices_request()
            .replace(&name, &post_params(false), body)
            .map_err(|e| request_error(&what, e))?;
        self.send_slice(&what, req).await
    }

    async fn delete_slice(&self, name: &str, resource_version: &str) -> Result<(), KubeError> {
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                resource_version: Some(resource_version.to_string()),
                uid: None,
            }),
            ..DeleteParams::default()
        };
        self.slices()
            .delete(name, &params)
            .await
            .map(|_| ())
            .map_err(|e| KubeError::from_kube(format!("ResourceSlice {name}"), e))
    }

    async fn apply_claim_device_status(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        devices: &[serde_json::Value],
    ) -> Result<Vec<serde_json::Value>, KubeError> {
        let what = format!("ResourceClaim {namespace}/{name}");
        let status = if devices.is_empty() {
            serde_json::json!({})
        } else {
            serde_json::json!({ "devices": devices })
        };
        let body = serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": namespace, "uid": uid},
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let claim = Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
            .patch_status(name, &params, &Patch::Apply(body))
            .await
            .map_err(|e| KubeError::from_kube(what.clone(), e))?;
        let stored = claim.status.and_then(|s| s.devices).unwrap_or_default();
        stored
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()
            .map_err(|e| KubeError::Other {
                what,
                message: e.to_string(),
            })
    }
}
