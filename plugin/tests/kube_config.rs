//! The `dra` and `kubernetes` config sections: defaults, and `check-config`'s one-sentence
//! errors naming the line and column.

use nri_accel::config::Config;

fn load(text: &str) -> Result<Config, String> {
    Config::from_yaml(text, "config.yaml").map_err(|e| e.to_string())
}

#[test]
fn the_sections_are_off_by_default() {
    let c = load("").unwrap();
    assert!(!c.dra.enabled);
    assert_eq!(c.dra.driver_name, "accel.nri.io");
    assert_eq!(c.kubernetes.node_name, "");
    assert_eq!(c.kubernetes.kubeconfig, None);
    let c = load(
        "dra:\n  enabled: true\n  driver_name: gpu.example.com\nkubernetes:\n  node_name: node-1.example.com\n  kubeconfig: /etc/nri-accel/kubeconfig\n",
    )
    .unwrap();
    assert!(c.dra.enabled);
    assert_eq!(
        c.kubernetes.resolve_node_name().as_deref(),
        Some("node-1.example.com")
    );
}

#[test]
fn bad_values_are_refused_where_they_are() {
    let e = load("dra:\n  driver_name: Accel_NRI\n").unwrap_err();
    assert!(e.starts_with("config.yaml:2:"), "{e}");
    assert!(e.contains("DNS subdomain") && e.contains("63"), "{e}");
    let long = format!("dra:\n  driver_name: {}.io\n", "a".repeat(61));
    assert!(load(&long).unwrap_err().contains("63 characters"));
    let e = load("kubernetes:\n  node_name: Node_1\n").unwrap_err();
    assert!(
        e.starts_with("config.yaml:2:") && e.contains("node name"),
        "{e}"
    );
    let e = load("kubernetes:\n  kubeconfig: kube/config\n").unwrap_err();
    assert!(e.contains("must be absolute"), "{e}");
    let e = load("kubernetes:\n  node: x\n").unwrap_err();
    assert!(e.contains("node"), "{e}");
}

/// Every request to the API server names nri-accel (the audit log showed an empty User-Agent,
/// so its requests could only be told from the kubelet's by identity).
#[tokio::test]
async fn requests_carry_nri_accels_user_agent() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 8192];
        let n = s.read(&mut buf).await.unwrap();
        let _ = s
            .write_all(b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\n\r\n")
            .await;
        String::from_utf8_lossy(&buf[..n]).to_lowercase()
    });
    let client =
        nri_accel::kube::KubeClient::for_url(&url, std::time::Duration::from_secs(5)).unwrap();
    let _ = client.list_device_classes().await;
    let head = server.await.unwrap();
    let want = format!("user-agent: nri-accel/{}", env!("CARGO_PKG_VERSION"));
    assert!(head.contains(&want), "{head}");
}
