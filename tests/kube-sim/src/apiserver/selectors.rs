//! `labelSelector` and `fieldSelector` as the real server parses and applies them.

use serde_json::Value;

use super::resources::Resource;
use super::status::ApiError;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector: every requirement must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits at commas that are not inside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&text[start..]);
    out
}

fn bad(what: &str, text: &str) -> ApiError {
    ApiError::BadRequest(format!(
        "unable to parse requirement: invalid {what}: {text:?}"
    ))
}

fn set_values(text: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|t| t.strip_suffix(')'))
        .ok_or_else(|| bad("label selector", whole))?;
    Ok(inner.split(',').map(|v| v.trim().to_string()).collect())
}

impl LabelSelector {
    /// Parses `a=b,c!=d,e in (x,y),f notin (z),g,!h`.
    pub fn parse(text: &str) -> Result<LabelSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(text) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let req = if let Some(key) = p.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_string())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = p.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), set_values(v, p)?)
            } else if let Some((k, v)) = p.split_once(" in ") {
                LabelReq::In(k.trim().into(), set_values(v, p)?)
            } else if p.contains([' ', '(', ')']) {
                return Err(bad("label selector", p));
            } else {
                LabelReq::Exists(p.to_string())
            };
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let get = |k: &str| labels.get(k).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => get(k).is_none_or(|x| vs.iter().all(|v| v != x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A parsed field selector: `path=value` / `path==value` / `path!=value`, all must hold.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    /// Parses the selector; a field the resource does not index is a 400, as on a real server.
    pub fn parse(text: &str, resource: &Resource) -> Result<FieldSelector, ApiError> {
        let mut reqs = Vec::new();
        for part in text.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (field, equal, value) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(bad("field selector", p));
            };
            let field = field.trim();
            let known = field == "metadata.name"
                || (resource.namespaced && field == "metadata.namespace")
                || resource.fields.contains(&field);
            if !known {
                return Err(ApiError::BadRequest(format!(
                    "field label not supported: {field}"
                )));
            }
            reqs.push((field.to_string(), equal, value.trim().to_string()));
        }
        Ok(FieldSelector(reqs))
    }

    /// Whether the object's fields satisfy every requirement (a missing field reads as "").
    pub fn matches(&self, object: &Value) -> bool {
        self.0.iter().all(|(path, equal, want)| {
            let mut v = object;
            for step in path.split('.') {
                v = &v[step];
            }
            let have = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            (have == *want) == *equal
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::resources::RESOURCE_SLICES;
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selectors_match_like_the_real_server() {
        let o = json!({"metadata": {"labels": {"app": "x", "tier": "gpu"}}});
        let yes = [
            "app=x",
            "app==x,tier",
            "tier in (gpu, cpu)",
            "!other",
            "app!=y",
            "zone notin (a)",
        ];
        for s in yes {
            assert!(LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        let no = [
            "app=y",
            "other",
            "!app",
            "tier notin (gpu)",
            "tier in (cpu)",
        ];
        for s in no {
            assert!(!LabelSelector::parse(s).unwrap().matches(&o), "{s}");
        }
        assert!(LabelSelector::parse("a in x").is_err());
    }

    #[test]
    fn field_selectors_use_only_indexed_fields() {
        let o = json!({"metadata": {"name": "s"}, "spec": {"nodeName": "n1", "driver": "d"}});
        let sel = FieldSelector::parse("spec.nodeName=n1,spec.driver=d", &RESOURCE_SLICES).unwrap();
        assert!(sel.matches(&o));
        let sel = FieldSelector::parse("spec.nodeName!=n1", &RESOURCE_SLICES).unwrap();
        assert!(!sel.matches(&o));
        let err = FieldSelector::parse("spec.devices=x", &RESOURCE_SLICES).unwrap_err();
        assert_eq!(err.code(), 400);
    }
}
