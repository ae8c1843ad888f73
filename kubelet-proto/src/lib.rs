//! The kubelet's plugin APIs as nri-accel speaks them: plugin registration (v1), the DRA plugin
//! service (v1 and v1beta1), DRA device health (v1 and v1alpha1) and the device plugin API
//! (v1beta1), each with its messages, its tonic server and its client.
//!
//! The `.proto` files under `proto/` are nri-accel's own text, field-compatible with the kubelet's
//! (`k8s.io/kubelet/pkg/apis/...`). `build.rs` compiles them with `protox` and `tonic-prost-build`,
//! so building needs no system `protoc`. The gRPC service names on the wire, which are also what a
//! DRA plugin lists in its registration's `supported_versions`, are the constants below.

/// Lint allowances for generated code live here and nowhere else.
macro_rules! generated {
    ($($(#[$doc:meta])* $name:ident => $file:literal),* $(,)?) => {
        $(
            $(#[$doc])*
            #[allow(missing_docs, clippy::all, clippy::pedantic, non_snake_case)]
            pub mod $name {
                include!(concat!(env!("OUT_DIR"), "/", $file));
            }
        )*
    };
}

generated! {
    /// Plugin registration (`pluginregistration.Registration`), served by every kubelet plugin.
    pluginregistration => "pluginregistration.rs",
    /// The DRA plugin service, v1 (Kubernetes 1.34+).
    dra_v1 => "k8s.io.kubelet.pkg.apis.dra.v1.rs",
    /// The DRA plugin service, v1beta1 (older kubelets).
    dra_v1beta1 => "k8s.io.kubelet.pkg.apis.dra.v1beta1.rs",
    /// DRA device health, v1.
    health_v1 => "v1.rs",
    /// DRA device health, v1alpha1 (kubelets before v1 existed).
    health_v1alpha1 => "v1alpha1.rs",
    /// The device plugin API, v1beta1: `DevicePlugin` (served by plugins) and `Registration`
    /// (served by the kubelet).
    deviceplugin => "v1beta1.rs",
}

/// `type` of a DRA plugin in its registration.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// `supported_versions` entry for the v1 DRA service.
pub const DRA_V1_SERVICE: &str = "v1.DRAPlugin";
/// `supported_versions` entry for the v1beta1 DRA service.
pub const DRA_V1BETA1_SERVICE: &str = "v1beta1.DRAPlugin";
/// `supported_versions` entry (and gRPC service name) of DRA health v1.
pub const HEALTH_V1_SERVICE: &str = "v1.DRAResourceHealth";
/// `supported_versions` entry (and gRPC service name) of DRA health v1alpha1.
pub const HEALTH_V1ALPHA1_SERVICE: &str = "v1alpha1.DRAResourceHealth";
/// The device plugin API version a plugin registers with.
pub const DEVICE_PLUGIN_VERSION: &str = "v1beta1";
/// `health` of a usable device in ListAndWatch.
pub const DEVICE_HEALTHY: &str = "Healthy";
/// `health` of an unusable device in ListAndWatch.
pub const DEVICE_UNHEALTHY: &str = "Unhealthy";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_on_the_wire_are_the_ones_plugins_advertise() {
        use health_v1::dra_resource_health_server::SERVICE_NAME as H1;
        use health_v1alpha1::dra_resource_health_server::SERVICE_NAME as H1A1;
        assert_eq!(H1, HEALTH_V1_SERVICE);
        assert_eq!(H1A1, HEALTH_V1ALPHA1_SERVICE);
        assert_eq!(
            dra_v1::dra_plugin_server::SERVICE_NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"
        );
        assert_eq!(
            dra_v1beta1::dra_plugin_server::SERVICE_NAME,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
        );
        assert_eq!(
            pluginregistration::registration_server::SERVICE_NAME,
            "pluginregistration.Registration"
        );
        assert_eq!(
            deviceplugin::device_plugin_server::SERVICE_NAME,
            "v1beta1.DevicePlugin"
        );
        assert_eq!(
            deviceplugin::registration_server::SERVICE_NAME,
            "v1beta1.Registration"
        );
    }

    #[test]
    fn field_numbers_match_the_kubelets() {
        use prost::Message;
        // share_id = 5 (v1 only), cdi_device_ids = 4: encode and look at the tags.
        let d = dra_v1::Device {
            request_names: vec![],
            pool_name: String::new(),
            device_name: String::new(),
            cdi_device_ids: vec!["x".into()],
            share_id: Some("s".into()),
        };
        let bytes = d.encode_to_vec();
        assert_eq!(bytes, [0x22, 1, b'x', 0x2a, 1, b's']);
        let r = deviceplugin::RegisterRequest {
            version: "v".into(),
            endpoint: String::new(),
            resource_name: String::new(),
            options: Some(deviceplugin::DevicePluginOptions {
                pre_start_required: false,
                get_preferred_allocation_available: true,
            }),
        };
        assert_eq!(r.encode_to_vec(), [0x0a, 1, b'v', 0x22, 2, 0x10, 1]);
    }
}
