//! `metav1.Status` bodies exactly as kube-apiserver writes them.
//!
//! Message formats follow `k8s.io/apimachinery/pkg/api/errors` (`NewNotFound`,
//! `NewAlreadyExists`, `NewForbidden`, `NewInvalid`, ...), because clients (kube-rs, client-go)
//! and the tests read `reason`, `code` and `details`, and operators read `message`. The structs
//! keep Go's field order so the JSON is byte-for-byte what the real server sends.

use serde::Serialize;

/// A `metav1.Status` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Status {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    /// `Success` or `Failure`.
    pub status: &'static str,
    /// Human-readable description.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Machine-readable reason (`NotFound`, `Forbidden`, ...).
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    /// Extra data for the reason.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub details: Option<Details>,
    /// The HTTP status code; absent on success, as the real server writes it.
    #[serde(skip_serializing_if = "is_zero")]
    pub code: u16,
}

fn is_zero(c: &u16) -> bool {
    *c == 0
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
struct Empty {}

/// `metav1.StatusDetails`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Details {
    /// Object name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// API group.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub group: String,
    /// The resource (for most reasons) or the Kind (for `Invalid`).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// The object's uid (successful deletes).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub uid: String,
    /// Field errors.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub causes: Vec<Cause>,
    /// Seconds a client should wait before retrying.
    #[serde(skip_serializing_if = "is_zero")]
    pub retry_after_seconds: u16,
}

/// `metav1.StatusCause`: one field error.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Cause {
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    #[serde(skip_serializing_if = "str::is_empty")]
    pub reason: &'static str,
    /// The part of the message after the field name.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The JSON path of the field, e.g. `metadata.name`.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub field: String,
}

/// A failure answer: the `Status` body (whose `code` is the HTTP status) and extra headers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The body.
    pub status: Box<Status>,
    /// Extra response headers, e.g. `Retry-After`.
    pub headers: Vec<(&'static str, String)>,
}

impl Failure {
    /// The HTTP status code.
    pub fn code(&self) -> u16 {
        self.status.code
    }
}

fn failure(code: u16, reason: &'static str, message: String, details: Option<Details>) -> Failure {
    Failure {
        status: Box::new(Status {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message,
            reason,
            details,
            code,
        }),
        headers: Vec::new(),
    }
}

fn details(name: &str, group: &str, kind: &str) -> Details {
    Details {
        name: name.to_owned(),
        group: group.to_owned(),
        kind: kind.to_owned(),
        ..Details::default()
    }
}

/// `resource.group`, or just `resource` for the core group, as `GroupResource.String()` does.
fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{resource}.{group}")
    }
}

/// 401: no or unknown credentials.
pub fn unauthorized() -> Failure {
    failure(401, "Unauthorized", "Unauthorized".into(), None)
}

/// 403 for a resource request; `reason` is the authorizer's sentence (`User "x" cannot ...`).
pub fn forbidden(group: &str, resource: &str, name: &str, reason: &str) -> Failure {
    let q = qualified(group, resource);
    let message = if name.is_empty() {
        format!("{q} is forbidden: {reason}")
    } else {
        format!("{q} \"{name}\" is forbidden: {reason}")
    };
    failure(
        403,
        "Forbidden",
        message,
        Some(details(name, group, resource)),
    )
}

/// 403 for a non-resource path.
pub fn forbidden_path(reason: &str) -> Failure {
    failure(
        403,
        "Forbidden",
        format!("forbidden: {reason}"),
        Some(Details::default()),
    )
}

/// 404 for a named object.
pub fn not_found(group: &str, resource: &str, name: &str) -> Failure {
    failure(
        404,
        "NotFound",
        format!("{} \"{name}\" not found", qualified(group, resource)),
        Some(details(name, group, resource)),
    )
}

/// 404 for a path under `/api` that names no known resource.
pub fn no_such_resource() -> Failure {
    failure(
        404,
        "NotFound",
        "the server could not find the requested resource".into(),
        Some(Details::default()),
    )
}

/// 409 on create of an existing name.
pub fn already_exists(group: &str, resource: &str, name: &str) -> Failure {
    failure(
        409,
        "AlreadyExists",
        format!("{} \"{name}\" already exists", qualified(group, resource)),
        Some(details(name, group, resource)),
    )
}

/// 409 on a failed precondition (stale `resourceVersion`, other `uid`) or an optimistic
/// concurrency failure: `NewConflict`'s "Operation cannot be fulfilled on ..." message.
pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Failure {
    failure(
        409,
        "Conflict",
        format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            qualified(group, resource)
        ),
        Some(details(name, group, resource)),
    )
}

/// 409 from server-side apply when fields another manager owns would change (no `force`).
pub fn apply_conflict(conflicts: &[(String, String)], api_version: &str) -> Failure {
    let causes: Vec<Cause> = conflicts
        .iter()
        .map(|(manager, field)| Cause {
            reason: "FieldManagerConflict",
            message: format!("conflict with \"{manager}\" using {api_version}"),
            field: field.clone(),
        })
        .collect();
    let noun = if causes.len() == 1 {
        "conflict"
    } else {
        "conflicts"
    };
    let list = causes
        .iter()
        .map(|c| format!("{}: {}", c.message, c.field))
        .collect::<Vec<_>>()
        .join("\n- ");
    failure(
        409,
        "Conflict",
        format!("Apply failed with {} {noun}: {list}", causes.len()),
        Some(Details {
            causes,
            ..Details::default()
        }),
    )
}

/// 415: a patch type the resource does not support (strategic merge on custom resources).
pub fn unsupported_media_type() -> Failure {
    failure(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
        Some(Details::default()),
    )
}

/// 422: the object failed validation. `kind` is the Kind (`Secret`), not the resource.
pub fn invalid(group: &str, kind: &str, name: &str, causes: Vec<Cause>) -> Failure {
    let list = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect::<Vec<_>>();
    let joined = if list.len() == 1 {
        list.concat()
    } else {
        format!("[{}]", list.join(", "))
    };
    let qualified_kind = qualified(group, kind);
    failure(
        422,
        "Invalid",
        format!("{qualified_kind} \"{name}\" is invalid: {joined}"),
        Some(Details {
            causes,
            ..details(name, group, kind)
        }),
    )
}

/// 400: the request body could not be decoded or is inconsistent with the URL.
pub fn bad_request(message: String) -> Failure {
    failure(400, "BadRequest", message, None)
}

/// 405: a verb the resource does not support here.
pub fn method_not_allowed() -> Failure {
    failure(
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource".into(),
        Some(Details::default()),
    )
}

/// 413: body larger than the apiserver's 3 MiB request limit.
pub fn too_large() -> Failure {
    failure(
        413,
        "RequestEntityTooLarge",
        "Request entity too large: limit is 3145728".into(),
        None,
    )
}

/// The body the apiserver would produce for an arbitrary failure code; used by fault injection.
pub fn for_code(code: u16, what: &str) -> Failure {
    match code {
        401 => unauthorized(),
        403 => failure(
            403,
            "Forbidden",
            format!("forbidden: {what}"),
            Some(Details::default()),
        ),
        404 => no_such_resource(),
        409 => failure(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled: {what}"),
            None,
        ),
        429 => {
            let mut f = failure(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.".into(),
                Some(Details {
                    retry_after_seconds: 1,
                    ..Details::default()
                }),
            );
            f.headers.push(("retry-after", "1".into()));
            f
        }
        500 => failure(
            500,
            "InternalError",
            format!("Internal error occurred: {what}"),
            Some(Details {
                causes: vec![Cause {
                    message: what.to_owned(),
                    ..Cause::default()
                }],
                ..Details::default()
            }),
        ),
        503 => failure(
            503,
            "ServiceUnavailable",
            format!("the server is currently unable to handle the request: {what}"),
            None,
        ),
        504 => failure(
            504,
            "Timeout",
            "Timeout: request did not complete within requested timeout - context deadline exceeded"
                .into(),
            Some(Details::default()),
        ),
        other => failure(other, "", what.to_owned(), None),
    }
}

/// The body of a successful DELETE.
pub fn deleted(group: &str, resource: &str, name: &str, uid: &str) -> Status {
    Status {
        kind: "Status",
        api_version: "v1",
        metadata: Empty {},
        status: "Success",
        message: String::new(),
        reason: "",
        details: Some(Details {
            uid: uid.to_owned(),
            ..details(name, group, resource)
        }),
        code: 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(f: &Failure) -> String {
        serde_json::to_string(&f.status).unwrap()
    }

    #[test]
    fn unauthorized_is_byte_for_byte_the_real_body() {
        assert_eq!(
            json(&unauthorized()),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
    }

    #[test]
    fn not_found_matches_real_body() {
        assert_eq!(
            json(&not_found("", "secrets", "x")),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"secrets \"x\" not found","reason":"NotFound","details":{"name":"x","kind":"secrets"},"code":404}"#
        );
    }

    #[test]
    fn forbidden_matches_real_body() {
        let f = forbidden(
            "",
            "secrets",
            "",
            r#"User "u" cannot create resource "secrets" in API group "" in the namespace "kube-system""#,
        );
        assert_eq!(
            json(&f),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"secrets is forbidden: User \"u\" cannot create resource \"secrets\" in API group \"\" in the namespace \"kube-system\"","reason":"Forbidden","details":{"kind":"secrets"},"code":403}"#
        );
    }

    #[test]
    fn invalid_lists_causes() {
        let f = invalid(
            "",
            "Secret",
            "A",
            vec![Cause {
                reason: "FieldValueInvalid",
                message: "Invalid value: \"A\": bad".into(),
                field: "metadata.name".into(),
            }],
        );
        assert_eq!(
            f.status.message,
            "Secret \"A\" is invalid: metadata.name: Invalid value: \"A\": bad"
        );
        assert_eq!(f.code(), 422);
    }
}
