//! The metrics server over real TCP: a recorded prepare moves the exported counters, /healthz
//! follows the gate, and a non-loopback address is refused.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use nri_accel::metrics::{ClaimState, HealthState, Metrics, MetricsError, Outcome, serve};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1.1 request over a fresh connection; returns (status code, body).
async fn get(addr: SocketAddr, method: &str, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let req = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
    stream.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8(raw).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_owned())
}

/// The value of the sample whose line starts with `series ` (name plus labels).
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

async fn start() -> (Arc<Metrics>, HealthState, nri_accel::metrics::MetricsServer) {
    let metrics = Arc::new(Metrics::new());
    let health = HealthState::new();
    let server = serve(
        "127.0.0.1:0".parse().unwrap(),
        metrics.clone(),
        health.clone(),
    )
    .await
    .unwrap();
    (metrics, health, server)
}

#[tokio::test]
async fn scrape_sees_a_recorded_prepare() {
    let (metrics, _health, server) = start().await;
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0);

    let (status, before) = get(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    let count = r#"nri_accel_prepare_duration_seconds_count{result="ok"}"#;
    assert_eq!(sample(&before, count), None, "{before}");

    metrics.record_prepare(Outcome::Ok, Duration::from_millis(3));
    metrics.set_claims(ClaimState::Prepared, 1);
    metrics.set_pool_units("gpus", 7, 1);
    metrics.set_gate_open(true);
    metrics.set_device_healthy("0000:18:00.0", false);

    let (status, after) = get(addr, "GET", "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(sample(&after, count), Some(1.0), "{after}");
    let sum = sample(
        &after,
        r#"nri_accel_prepare_duration_seconds_sum{result="ok"}"#,
    )
    .unwrap();
    assert!((sum - 0.003).abs() < 1e-9, "sum {sum}");
    assert_eq!(
        sample(&after, r#"nri_accel_claims{state="prepared"}"#),
        Some(1.0)
    );
    assert_eq!(
        sample(&after, r#"nri_accel_device_healthy{device="0000:18:00.0"}"#),
        Some(0.0)
    );
    assert_eq!(
        sample(&after, r#"nri_accel_units{pool="gpus",state="free"}"#),
        Some(7.0)
    );
    assert_eq!(
        sample(&after, r#"nri_accel_units{pool="gpus",state="used"}"#),
        Some(1.0)
    );
    assert_eq!(sample(&after, "nri_accel_gate_open"), Some(1.0));
    assert!(after.ends_with("# EOF\n"), "{after}");
    server.shutdown();
}

#[tokio::test]
async fn exposition_names_every_family() {
    let (metrics, _health, server) = start().await;
    metrics.record_unprepare(Outcome::Error, Duration::from_millis(1));
    metrics.record_nri_event("CreateContainer", Duration::from_micros(200), true);
    metrics.set_pool_devices("gpus", 3, 1);
    metrics.set_pending_updates(2);
    metrics.set_claims(ClaimState::Adopted, 0);
    metrics.set_nri_connected(true);
    metrics.set_node_lock_lost(true);
    metrics.set_cdi_dir_moved(false);
    let refusals = std::collections::BTreeMap::from([(("annotation", "no_capacity"), 3u64)]);
    metrics.set_refusals(&refusals);
    // Counts kept elsewhere that only grow: a second refresh with the same totals adds nothing.
    metrics.set_write_errors(2, 1);
    metrics.set_write_errors(2, 1);
    metrics.set_refusals(&refusals);
    metrics.record_reconcile(nri_accel::metrics::ReconcileAction::RolledBack, 2);
    metrics.set_resource_slices(true, 5, 2, 1);
    metrics.set_resource_slices(true, 5, 2, 1);
    let (_, body) = get(server.local_addr(), "GET", "/metrics").await;
    for series in [
        r#"nri_accel_unprepare_duration_seconds_count{result="error"} 1"#,
        r#"nri_accel_nri_event_duration_seconds_count{event="CreateContainer"} 1"#,
        r#"nri_accel_nri_event_errors_total{event="CreateContainer"} 1"#,
        r#"nri_accel_devices{pool="gpus",state="free"} 3"#,
        "nri_accel_pending_container_updates 2",
        "nri_accel_gate_open 0",
        r#"nri_accel_claims{state="adopted"} 0"#,
        "nri_accel_nri_connected 1",
        "nri_accel_node_lock_lost 1",
        "nri_accel_cdi_dir_moved 0",
        r#"nri_accel_refusals_total{door="annotation",reason="no_capacity"} 3"#,
        "nri_accel_checkpoint_write_errors_total 2",
        "nri_accel_cdi_write_errors_total 1",
        r#"nri_accel_reconcile_actions_total{action="rolled_back"} 2"#,
        r#"nri_accel_reconcile_actions_total{action="failed"} 0"#,
        "nri_accel_resource_slices_in_sync 1",
        "nri_accel_resource_slice_devices_on_server 5",
        r#"nri_accel_resource_slice_republishes_total{reason="kubelet_registration"} 2"#,
        r#"nri_accel_resource_slice_republishes_total{reason="server_differs"} 1"#,
        "# TYPE nri_accel_unprepare_duration_seconds histogram",
        "# UNIT nri_accel_unprepare_duration_seconds seconds",
        "# TYPE nri_accel_claims gauge",
    ] {
        assert!(body.contains(series), "missing {series:?} in:\n{body}");
    }
    server.shutdown();
}

#[tokio::test]
async fn healthz_follows_connection_and_gate() {
    let (_metrics, health, server) = start().await;
    let addr = server.local_addr();
    let (status, body) = get(addr, "GET", "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("not connected"), "{body}");

    health.set_runtime_connected(true);
    let (status, body) = get(addr, "GET", "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.contains("gate closed"), "{body}");

    health.set_gate_open(true);
    assert_eq!(get(addr, "GET", "/healthz").await, (200, "ok\n".to_owned()));

    // A CDI dir not in place and a lost node lock refuse claims whatever the runtime does: the
    // lock first (issue 39).
    health.set_cdi_dir_problem(Some("the CDI dir /run/cdi was moved".into()));
    let (status, body) = get(addr, "GET", "/healthz").await;
    assert_eq!(
        (status, body.as_str()),
        (503, "the CDI dir /run/cdi was moved\n")
    );
    health.set_node_lock_problem(Some("the node lock /x/node.lock was removed".into()));
    let (status, body) = get(addr, "GET", "/healthz").await;
    assert_eq!(status, 503);
    assert!(body.starts_with("the node lock"), "{body}");
    health.set_node_lock_problem(None);
    health.set_cdi_dir_problem(None);
    assert_eq!(get(addr, "GET", "/healthz").await.0, 200);

    health.set_runtime_connected(false);
    assert_eq!(get(addr, "GET", "/healthz").await.0, 503);
    server.shutdown();
}

#[tokio::test]
async fn other_paths_and_methods_are_refused() {
    let (_metrics, _health, server) = start().await;
    let addr = server.local_addr();
    assert_eq!(get(addr, "GET", "/").await.0, 404);
    assert_eq!(get(addr, "POST", "/metrics").await.0, 405);
}

#[tokio::test]
async fn non_loopback_address_is_refused() {
    let err = serve(
        "0.0.0.0:0".parse().unwrap(),
        Arc::new(Metrics::new()),
        HealthState::new(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, MetricsError::NotLoopback { .. }));
    assert!(err.to_string().contains("0.0.0.0:0"), "{err}");
}

#[tokio::test]
async fn ipv6_loopback_is_accepted() {
    // Hosts without IPv6 cannot bind [::1]; then only the refusal path is meaningful.
    match serve(
        "[::1]:0".parse().unwrap(),
        Arc::new(Metrics::new()),
        HealthState::new(),
    )
    .await
    {
        Ok(server) => {
            assert!(server.local_addr().ip().is_loopback());
            assert_eq!(get(server.local_addr(), "GET", "/metrics").await.0, 200);
        }
        Err(err) => assert!(matches!(err, MetricsError::Bind { .. }), "{err}"),
    }
}
