//! The kubelet's DRA device health service, `v1.DRAResourceHealth` and (for kubelets before v1)
//! `v1alpha1.DRAResourceHealth`: one server-streaming call, NodeWatchResources.
//!
//! The stream follows the daemon's [`HealthMonitor`] and speaks of published devices: each
//! inventory device stands for every name its pool publishes (the whole device, its shares, each
//! placement of each slice), all in this node's DRA pool. Every message is the complete list, as
//! the kubelet expects (it reconciles its cache with each message): one at once, one after every
//! change, and one every refresh period, because the kubelet turns a device it has not heard
//! about within `health_check_timeout_seconds` into Unknown.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use futures::Stream;
use kubelet_proto::health_v1 as v1;
use kubelet_proto::health_v1alpha1 as v1alpha1;
use policies::PublishedDevice;

use crate::device_health::{HealthMonitor, HealthReport};

/// How often the complete list is sent again when nothing changed.
pub const REFRESH: Duration = Duration::from_secs(10);
/// Longest message the kubelet keeps (it cuts longer ones).
const MAX_MESSAGE: usize = 1024;

/// The health of one published device, as one stream entry says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceEntry {
    /// This node's DRA pool.
    pub pool: String,
    /// The published device name.
    pub device: String,
    /// Usable or not.
    pub healthy: bool,
    /// Why not, when not.
    pub message: String,
    /// When the devices were last checked, in Unix seconds.
    pub checked_at: i64,
}

/// The health service; cheap to clone.
#[derive(Clone)]
pub struct HealthService {
    inner: Arc<Inner>,
}

struct Inner {
    monitor: HealthMonitor,
    /// Set when the daemon shuts down: the streams end, so the server stops at once.
    closed: tokio::sync::watch::Sender<bool>,
    pool: String,
    /// (inventory device id, published name), sorted by name.
    devices: Vec<(String, String)>,
    refresh: Duration,
}

type EntryStream = Pin<Box<dyn Stream<Item = Vec<DeviceEntry>> + Send>>;

impl HealthService {
    /// Health of the `published` devices of DRA pool `pool`, from `monitor`; the complete list
    /// is repeated every `refresh` ([`REFRESH`] in the daemon).
    pub fn new(
        monitor: HealthMonitor,
        published: &[PublishedDevice],
        pool: &str,
        refresh: Duration,
    ) -> Self {
        let mut devices: Vec<(String, String)> = published
            .iter()
            .map(|p| (p.device_id.clone(), p.name.clone()))
            .collect();
        devices.sort_by(|a, b| a.1.cmp(&b.1));
        devices.dedup_by(|a, b| a.1 == b.1);
        HealthService {
            inner: Arc::new(Inner {
                monitor,
                closed: tokio::sync::watch::channel(false).0,
                pool: pool.to_string(),
                devices,
                refresh,
            }),
        }
    }

    /// Ends every stream (the daemon is shutting down; the kubelet watches again when the
    /// plugin registers again).
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }

    /// Seconds after which the kubelet should stop trusting an entry: three refresh periods.
    pub fn timeout_secs(&self) -> i64 {
        i64::try_from((self.inner.refresh * 3).as_secs().max(1)).unwrap_or(i64::MAX)
    }

    /// Every published device's health in `report`.
    pub fn picture(&self, report: &HealthReport) -> Vec<DeviceEntry> {
        let checked_at = report
            .checked_at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
        self.inner
            .devices
            .iter()
            .map(|(id, name)| {
                let h = report.of(id);
                DeviceEntry {
                    pool: self.inner.pool.clone(),
                    device: name.clone(),
                    healthy: h.healthy,
                    message: truncate(&h.reason),
                    checked_at,
                }
            })
            .collect()
    }

    /// The stream of complete lists: now, after each change, and every refresh period.
    fn entries(&self) -> EntryStream {
        let service = self.clone();
        let rx = self.inner.monitor.subscribe();
        let state = (service, rx, true, true);
        Box::pin(futures::stream::unfold(
            state,
            |(service, mut rx, first, mut alive)| async move {
                let mut closed = service.inner.closed.subscribe();
                if *closed.borrow() {
                    return None;
                }
                if !first {
                    let refresh = tokio::time::sleep(service.inner.refresh);
                    let watching = alive;
                    let change = async {
                        if watching {
                            rx.changed().await.is_ok()
                        } else {
                            std::future::pending().await
                        }
                    };
                    tokio::select! {
                        still = change => alive = still,
                        () = refresh => {}
                        _ = closed.wait_for(|c| *c) => return None,
                    }
                }
                let report = rx.borrow_and_update().clone();
                let picture = service.picture(&report);
                Some((picture, (service, rx, false, alive)))
            },
        ))
    }

    /// The v1 gRPC service.
    pub fn v1_server(&self) -> v1::dra_resource_health_server::DraResourceHealthServer<HealthV1> {
        v1::dra_resource_health_server::DraResourceHealthServer::new(HealthV1(self.clone()))
    }

    /// The v1alpha1 gRPC service.
    pub fn v1alpha1_server(
        &self,
    ) -> v1alpha1::dra_resource_health_server::DraResourceHealthServer<HealthV1alpha1> {
        v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(HealthV1alpha1(
            self.clone(),
        ))
    }
}

/// At most [`MAX_MESSAGE`] bytes, cut at a character boundary.
fn truncate(text: &str) -> String {
    if text.len() <= MAX_MESSAGE {
        return text.to_string();
    }
    let mut end = MAX_MESSAGE - 3;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// A stream of gRPC messages for one API version.
type Messages<T> = Pin<Box<dyn Stream<Item = Result<T, tonic::Status>> + Send>>;

/// Declares the gRPC service of one health API version over [`HealthService`] (the versions
/// differ only in their generated types).
macro_rules! health_version {
    ($(#[$doc:meta])* $name:ident, $pb:ident, $shown:literal) => {
        $(#[$doc])*
        pub struct $name(HealthService);

        #[tonic::async_trait]
        impl $pb::dra_resource_health_server::DraResourceHealth for $name {
            type NodeWatchResourcesStream = Messages<$pb::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _req: tonic::Request<$pb::NodeWatchResourcesRequest>,
            ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
                tracing::info!(api = $shown, "the kubelet is watching device health");
                let timeout = self.0.timeout_secs();
                let stream = futures::StreamExt::map(self.0.entries(), move |entries| {
                    let devices = entries
                        .into_iter()
                        .map(|e| $pb::DeviceHealth {
                            device: Some($pb::DeviceIdentifier {
                                pool_name: e.pool,
                                device_name: e.device,
                            }),
                            health: if e.healthy {
                                $pb::HealthStatus::Healthy
                            } else {
                                $pb::HealthStatus::Unhealthy
                            } as i32,
                            last_updated_time: e.checked_at,
                            health_check_timeout_seconds: timeout,
                            message: e.message,
                        })
                        .collect();
                    Ok($pb::NodeWatchResourcesResponse { devices })
                });
                Ok(tonic::Response::new(Box::pin(stream)))
            }
        }
    };
}

health_version!(
    /// `v1.DRAResourceHealth`.
    HealthV1, v1, "v1"
);
health_version!(
    /// `v1alpha1.DRAResourceHealth`.
    HealthV1alpha1, v1alpha1, "v1alpha1"
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device_health::DeviceHealth;
    use futures::StreamExt;
    use policies::PublishedKind;
    use std::time::SystemTime;

    fn published(id: &str, name: &str) -> PublishedDevice {
        PublishedDevice {
            pool: "gpus".into(),
            name: name.into(),
            device_id: id.into(),
            kind: PublishedKind::Whole,
            unit: None,
        }
    }

    #[tokio::test]
    async fn full_list_first_then_after_each_change() {
        let report = HealthReport {
            devices: [("a".to_string(), DeviceHealth::healthy())].into(),
            checked_at: SystemTime::now(),
        };
        let (monitor, tx) = HealthMonitor::fixed(report);
        let service = HealthService::new(
            monitor,
            &[published("a", "gpus-a"), published("a", "gpus-a-1g-0")],
            "node-1",
            Duration::from_secs(3600),
        );
        assert_eq!(service.timeout_secs(), 3 * 3600);
        let mut stream = service.entries();
        let first = stream.next().await.unwrap();
        assert_eq!(first.len(), 2);
        assert!(first.iter().all(|e| e.healthy && e.pool == "node-1"));
        tx.send_replace(Arc::new(HealthReport {
            devices: [(
                "a".to_string(),
                DeviceHealth {
                    healthy: false,
                    reason: "x".repeat(2000),
                },
            )]
            .into(),
            checked_at: SystemTime::now(),
        }));
        let second = stream.next().await.unwrap();
        assert_eq!(second.len(), 2, "every message is the complete list");
        assert!(second.iter().all(|e| !e.healthy));
        assert_eq!(second[0].message.len(), MAX_MESSAGE);
        assert!(second[0].message.ends_with("..."));
    }

    #[tokio::test]
    async fn the_list_is_repeated_when_nothing_changes() {
        let report = HealthReport {
            devices: [("a".to_string(), DeviceHealth::healthy())].into(),
            checked_at: SystemTime::now(),
        };
        // The sender is dropped: checks are off, the list still comes every refresh.
        let (monitor, _) = HealthMonitor::fixed(report);
        let service = HealthService::new(
            monitor,
            &[published("a", "gpus-a")],
            "n",
            Duration::from_millis(5),
        );
        let mut stream = service.entries();
        for _ in 0..3 {
            let list = stream.next().await.unwrap();
            assert_eq!(list.len(), 1);
        }
    }
}
