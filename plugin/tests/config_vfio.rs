//! The config of passthrough pools and of the device plugins' resource names (docs/vms.md).

use nri_accel::config::{Config, ConfigError};

fn invalid(text: &str) -> (String, String) {
    match Config::from_yaml(text, "test.yaml").expect_err("config must be refused") {
        ConfigError::Invalid { field, message, .. } => (field, message),
        e => panic!("{e:?}"),
    }
}

#[test]
fn a_passthrough_pool_with_a_kubevirt_resource_name_loads() {
    let c = Config::from_yaml(
        "pools:\n  - name: vm-gpus\n    passthrough: true\n    select: { vendor: nvidia }\n    family: { kind: exclusive }\n\
         device_plugin:\n  enabled: true\n  resource_names: { vm-gpus: nvidia.com/GA102GL_A10 }\n",
        "test.yaml",
    )
    .unwrap();
    assert!(c.pools[0].passthrough);
    assert_eq!(
        c.device_plugin.resource_names["vm-gpus"],
        "nvidia.com/GA102GL_A10"
    );
}

#[test]
fn resource_names_are_checked() {
    let pool = "pools:\n  - { name: vm, passthrough: true, family: { kind: exclusive } }\n  - { name: b, family: { kind: exclusive } }\n";
    let (field, msg) = invalid(&format!(
        "{pool}device_plugin:\n  resource_names: {{ nosuch: nvidia.com/x }}\n"
    ));
    assert_eq!(field, "device_plugin.resource_names");
    assert_eq!(
        msg,
        "resource name for pool \"nosuch\", which is not defined in pools"
    );
    let (_, msg) = invalid(&format!(
        "{pool}device_plugin:\n  resource_names: {{ vm: GA102GL_A10 }}\n"
    ));
    assert!(
        msg.starts_with(
            "pool \"vm\": \"GA102GL_A10\" is not a resource name of the form vendor.com/model"
        ),
        "{msg}"
    );
    let (_, msg) = invalid(&format!(
        "{pool}device_plugin:\n  resource_names: {{ vm: nvidia.com/x, b: nvidia.com/x }}\n"
    ));
    assert!(
        msg.starts_with("two resources would be advertised as \"nvidia.com/x\""),
        "{msg}"
    );
}
