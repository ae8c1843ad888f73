//! The resources the server serves and how a URL path names one of them.

use super::status::ApiError;

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
pub static ALL: [&Resource; 4] = [&NODES, &RESOURCE_SLICES, &RESOURCE_CLAIMS, &DEVICE_CLASSES];

/// What a path names: a collection (all namespaces or one) or one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The resource.
    pub resource: &'static Resource,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object name, if the path names one.
    pub name: Option<String>,
}

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...`.
pub fn parse(path: &str) -> Result<Route, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::NoRoute),
    };
    let (namespace, plural, name) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name)),
        [plural] => (None, *plural, None),
        [plural, name] => (None, *plural, Some(*name)),
        _ => return Err(ApiError::NoRoute),
    };
    let resource = ALL
        .iter()
        .copied()
        .find(|r| r.group == group && r.version == version && r.plural == plural)
        .ok_or(ApiError::NoRoute)?;
    if namespace.is_some() && !resource.namespaced {
        return Err(ApiError::NoRoute);
    }
    if resource.namespaced && namespace.is_none() && name.is_some() {
        return Err(ApiError::NoRoute);
    }
    Ok(Route {
        resource,
        namespace: namespace.map(str::to_string),
        name: name.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_collections_and_objects() {
        let r = parse("/apis/resource.k8s.io/v1/resourceslices").unwrap();
        assert_eq!((r.resource.plural, r.name), ("resourceslices", None));
        let r = parse("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c").unwrap();
        assert_eq!(r.namespace.as_deref(), Some("ns"));
        assert_eq!(r.name.as_deref(), Some("c"));
        assert_eq!(parse("/api/v1/nodes/n1").unwrap().resource.kind, "Node");
        assert!(parse("/api/v1/namespaces/x/nodes/n1").is_err());
        assert!(parse("/apis/resource.k8s.io/v1/resourceclaims/c").is_err());
        assert!(parse("/apis/resource.k8s.io/v1beta1/resourceslices").is_err());
    }
}
