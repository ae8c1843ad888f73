//! How a URL path names a resource collection or object.

use super::resources::{ALL, Resource};
use super::status::ApiError;

/// What a path names: a collection (all namespaces or one) or one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The resource.
    pub resource: &'static Resource,
    /// The namespace in the path, if any.
    pub namespace: Option<String>,
    /// The object name, if the path names one.
    pub name: Option<String>,
    /// The subresource after the name (`status`), if any.
    pub subresource: Option<String>,
}

/// Parses `/api/v1/...` or `/apis/<group>/<version>/...`.
pub fn parse(path: &str) -> Result<Route, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(ApiError::NoRoute),
    };
    let (namespace, plural, name, subresource) = match rest {
        ["namespaces", ns, plural] => (Some(*ns), *plural, None, None),
        ["namespaces", ns, plural, name] => (Some(*ns), *plural, Some(*name), None),
        ["namespaces", ns, plural, name, "status"] => {
            (Some(*ns), *plural, Some(*name), Some("status"))
        }
        [plural] => (None, *plural, None, None),
        [plural, name] => (None, *plural, Some(*name), None),
        [plural, name, "status"] => (None, *plural, Some(*name), Some("status")),
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
        subresource: subresource.map(str::to_string),
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
        let r = parse("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/status").unwrap();
        assert_eq!(r.subresource.as_deref(), Some("status"));
        assert!(parse("/apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/c/x").is_err());
    }
}
