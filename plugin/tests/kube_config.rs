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
