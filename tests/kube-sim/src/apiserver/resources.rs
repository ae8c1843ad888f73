//! The resource types the server serves: group, version, plural, kind and the fields a selector
//! may name. Routes (routes.rs) look them up and error bodies (status.rs) name them.

/// A resource type the server serves.
#[derive(Debug, PartialEq, Eq)]
pub struct Resource {
    /// API group (`""` for the core group).
    pub group: &'static str,
    /// Group version.
    pub version: &'static str,
    /// URL plural.
    pub plural: &'static str,
    /// Kind of one object.
    pub kind: &'static str,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Fields a `fieldSelector` may name (besides `metadata.name` and, when namespaced,
    /// `metadata.namespace`), as the real server registers them.
    pub fields: &'static [&'static str],
}

impl Resource {
    /// `apiVersion` of its objects.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_string()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }

    /// `plural.group` as error messages name it.
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.to_string()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
}

/// Nodes (core/v1, cluster scoped).
pub static NODES: Resource = Resource {
    group: "",
    version: "v1",
    plural: "nodes",
    kind: "Node",
    namespaced: false,
    fields: &["spec.unschedulable"],
};

/// ResourceSlices (resource.k8s.io/v1, cluster scoped).
pub static RESOURCE_SLICES: Resource = Resource {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceslices",
    kind: "ResourceSlice",
    namespaced: false,
    fields: &["spec.nodeName", "spec.driver", "spec.pool.name"],
};

/// ResourceClaims (resource.k8s.io/v1, namespaced).
pub static RESOURCE_CLAIMS: Resource = Resource {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceclaims",
    kind: "ResourceClaim",
    namespaced: true,
    fields: &[],
};

/// ResourceClaimTemplates (resource.k8s.io/v1, namespaced).
pub static RESOURCE_CLAIM_TEMPLATES: Resource = Resource {
    group: "resource.k8s.io",
    version: "v1",
    plural: "resourceclaimtemplates",
    kind: "ResourceClaimTemplate",
    namespaced: true,
    fields: &[],
};

/// DeviceClasses (resource.k8s.io/v1, cluster scoped).
pub static DEVICE_CLASSES: Resource = Resource {
    group: "resource.k8s.io",
    version: "v1",
    plural: "deviceclasses",
    kind: "DeviceClass",
    namespaced: false,
    fields: &[],
};

/// Every resource served.
pub static ALL: [&Resource; 5] = [
    &NODES,
    &RESOURCE_SLICES,
    &RESOURCE_CLAIMS,
    &DEVICE_CLASSES,
    &RESOURCE_CLAIM_TEMPLATES,
];
