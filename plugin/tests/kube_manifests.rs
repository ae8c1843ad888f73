//! The Kubernetes manifests in packaging/kubernetes/ against the code: the RBAC grants what the
//! API client calls, the DeviceClasses select on attributes that are published, the DaemonSet's
//! config loads, and the example opaque configuration parses.

mod kube_common;

use std::collections::BTreeSet;
use std::path::PathBuf;

use kube_common::source;
use nri_accel::config::Config;
use nri_accel::kube::opaque::DeviceConfig;
use nri_accel::kube::slices::{self, Capabilities, PoolInput};
use serde_json::Value;

fn docs(file: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../packaging/kubernetes")
        .join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

#[test]
fn the_cluster_role_grants_what_the_client_calls() {
    let rbac = docs("rbac.yaml");
    let role = of_kind(&rbac, "ClusterRole")[0];
    let verbs = |resource: &str| -> BTreeSet<String> {
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| {
                r["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|x| x == resource)
            })
            .flat_map(|r| {
                r["verbs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
            })
            .collect()
    };
    for v in ["list", "create", "update", "delete"] {
        assert!(verbs("resourceslices").contains(v), "resourceslices {v}");
    }
    assert_eq!(verbs("resourceclaims"), BTreeSet::from(["get".to_string()]));
    // The per-device status: a server-side apply (patch) of the status subresource, and on 1.36+
    // the granular check of the driver's own entries on claims of the token's node only.
    assert_eq!(
        verbs("resourceclaims/status"),
        BTreeSet::from(["patch".to_string()])
    );
    assert_eq!(
        verbs("resourceclaims/driver"),
        BTreeSet::from(["associated-node:patch".to_string()])
    );
    let driver_rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resources"][0] == "resourceclaims/driver")
        .unwrap();
    assert_eq!(
        driver_rule["resourceNames"],
        serde_json::json!(["accel.nri.io"])
    );
    assert_eq!(verbs("nodes"), BTreeSet::from(["get".to_string()]));
    let binding = of_kind(&rbac, "ClusterRoleBinding")[0];
    let sa = of_kind(&rbac, "ServiceAccount")[0];
    assert_eq!(binding["subjects"][0]["name"], sa["metadata"]["name"]);
    let policy = of_kind(&rbac, "ValidatingAdmissionPolicy")[0];
    let condition = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        condition.contains("system:serviceaccount:nri-accel:nri-accel"),
        "{condition}"
    );
}

/// Names after `prefix` up to the first character that cannot be in an attribute name.
fn names_after(text: &str, prefix: &str) -> BTreeSet<String> {
    text.match_indices(prefix)
        .map(|(i, _)| {
            text[i + prefix.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

#[test]
fn device_classes_select_on_published_attributes() {
    let src = source(2);
    let content = slices::build(&PoolInput {
        inventory: &src.inventory,
        pools: &src.pools,
        published: &src.published,
        pcie_roots: &src.pcie_roots,
        unhealthy: &Default::default(),
        held: &Default::default(),
        driver: "accel.nri.io",
        caps: Capabilities::ALL,
    });
    let attributes: BTreeSet<String> = content
        .devices
        .iter()
        .flat_map(|e| e.device.attributes.iter().flatten().map(|(k, _)| k.clone()))
        .collect();
    let capacity: BTreeSet<String> = content
        .devices
        .iter()
        .flat_map(|e| e.device.capacity.iter().flatten().map(|(k, _)| k.clone()))
        .collect();
    let types: BTreeSet<String> = content
        .devices
        .iter()
        .filter_map(|e| e.device.attributes.as_ref()?.get("type")?.string.clone())
        .collect();
    let mut texts = Vec::new();
    for file in ["deviceclasses.yaml", "examples.yaml"] {
        for d in docs(file) {
            texts.push(d.to_string());
        }
    }
    let text = texts.join("\n");
    let used = names_after(&text, r#"device.attributes[\"accel.nri.io\"]."#);
    assert!(!used.is_empty());
    assert!(
        used.is_subset(&attributes),
        "{used:?} not all in {attributes:?}"
    );
    let used = names_after(&text, r#"device.capacity[\"accel.nri.io\"]."#);
    assert!(
        used.is_subset(&capacity),
        "{used:?} not all in {capacity:?}"
    );
    for t in ["device", "shared", "partition"] {
        assert!(types.contains(t));
        assert!(
            text.contains(&format!(r#"type == \"{t}\""#)),
            "no class selects type {t}"
        );
    }
}

#[test]
fn the_daemonset_config_loads_and_names_the_node() {
    let ds = docs("daemonset.yaml");
    let cm = of_kind(&ds, "ConfigMap")[0];
    let config = Config::from_yaml(
        cm["data"]["config.yaml"].as_str().unwrap(),
        "daemonset.yaml",
    )
    .expect("the DaemonSet's config loads");
    assert!(config.dra.enabled);
    let set = of_kind(&ds, "DaemonSet")[0];
    let pod = &set["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], "nri-accel");
    let env = &pod["containers"][0]["env"][0];
    assert_eq!(env["name"], "NODE_NAME");
    assert_eq!(env["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
    let mounts: BTreeSet<&str> = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["mountPath"].as_str().unwrap())
        .collect();
    for path in [
        "/var/run/cdi",
        "/var/run/nri",
        "/sys",
        "/var/lib/nri-accel",
        "/var/lib/kubelet/plugins_registry",
        "/var/lib/kubelet/plugins",
    ] {
        assert!(mounts.contains(path), "{path} not mounted");
    }
}

#[test]
fn the_example_opaque_configuration_parses() {
    let ex = docs("examples.yaml");
    let mut n = 0;
    for t in of_kind(&ex, "ResourceClaimTemplate") {
        for c in t["spec"]["spec"]["devices"]["config"]
            .as_array()
            .into_iter()
            .flatten()
        {
            DeviceConfig::parse(&c["opaque"]["parameters"]).expect("example config parses");
            n += 1;
        }
    }
    assert!(n > 0);
}
