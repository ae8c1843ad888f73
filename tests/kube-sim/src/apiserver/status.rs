//! API errors as the real server words them: a `Status` object with a reason and a code.

use serde_json::{Value, json};

use super::resources::Resource;

/// Why a request failed, with what the `Status` body says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// 404: no such object.
    #[error("{} \"{name}\" not found", resource.qualified())]
    NotFound {
        /// The resource asked for.
        resource: &'static Resource,
        /// The object's name.
        name: String,
    },
    /// 409 AlreadyExists: create of a name that is taken.
    #[error("{} \"{name}\" already exists", resource.qualified())]
    AlreadyExists {
        /// The resource written.
        resource: &'static Resource,
        /// The object's name.
        name: String,
    },
    /// 409 Conflict: a stale resourceVersion or a failed precondition.
    #[error("Operation cannot be fulfilled on {} \"{name}\": {why}", resource.qualified())]
    Conflict {
        /// The resource written.
        resource: &'static Resource,
        /// The object's name.
        name: String,
        /// What did not match.
        why: String,
    },
    /// 422 Invalid: the object breaks a validation rule.
    #[error("{} \"{name}\" is invalid: {field}: {why}", resource.kind)]
    Invalid {
        /// The resource written.
        resource: &'static Resource,
        /// The object's name.
        name: String,
        /// The offending field path.
        field: String,
        /// The rule broken.
        why: String,
    },
    /// 400: the request itself is malformed.
    #[error("{0}")]
    BadRequest(String),
    /// 404 for a path the server does not serve.
    #[error("the server could not find the requested resource")]
    NoRoute,
    /// 405: a verb the resource does not support here.
    #[error("the server does not allow this method on the requested resource")]
    MethodNotAllowed,
    /// 413: the body is larger than the server accepts.
    #[error("the request body is larger than {0} bytes")]
    TooLarge(usize),
    /// A failure injected by the test (5xx, 429).
    #[error("injected failure")]
    Injected(u16),
}

impl ApiError {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => 404,
            ApiError::AlreadyExists { .. } | ApiError::Conflict { .. } => 409,
            ApiError::Invalid { .. } => 422,
            ApiError::BadRequest(_) => 400,
            ApiError::MethodNotAllowed => 405,
            ApiError::TooLarge(_) => 413,
            ApiError::Injected(code) => *code,
        }
    }

    /// The `reason` of the Status object.
    pub fn reason(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::NoRoute => "NotFound",
            ApiError::AlreadyExists { .. } => "AlreadyExists",
            ApiError::Conflict { .. } => "Conflict",
            ApiError::Invalid { .. } => "Invalid",
            ApiError::BadRequest(_) => "BadRequest",
            ApiError::MethodNotAllowed => "MethodNotAllowed",
            ApiError::TooLarge(_) => "RequestEntityTooLarge",
            ApiError::Injected(429) => "TooManyRequests",
            ApiError::Injected(503) => "ServiceUnavailable",
            ApiError::Injected(504) => "Timeout",
            ApiError::Injected(_) => "InternalError",
        }
    }

    /// The `Status` body the server sends.
    pub fn body(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.to_string(),
            "reason": self.reason(),
            "code": self.code(),
        });
        let details = match self {
            ApiError::NotFound { resource, name }
            | ApiError::AlreadyExists { resource, name }
            | ApiError::Conflict { resource, name, .. } => Some(json!({
                "name": name, "group": resource.group, "kind": resource.plural,
            })),
            ApiError::Invalid {
                resource,
                name,
                field,
                why,
            } => Some(json!({
                "name": name, "group": resource.group, "kind": resource.kind,
                "causes": [{"reason": "FieldValueInvalid", "message": why, "field": field}],
            })),
            _ => None,
        };
        if let Some(d) = details {
            status["details"] = d;
        }
        status
    }
}

/// The `Status` a successful delete answers.
pub fn deleted(resource: &Resource, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": resource.group, "kind": resource.plural, "uid": uid},
    })
}
