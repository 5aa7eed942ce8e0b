//! ValidatingAdmissionPolicy: the deployed policies' CEL, evaluated as kube-apiserver does.
//!
//! RBAC says which verbs a user may use; a `ValidatingAdmissionPolicy` narrows what a request may
//! contain. The deployment ships one (`deploy/base/admission-policy.yaml`) that limits token-issuer to
//! bootstrap-token Secrets, so the end-to-end tests must run it against what token-issuer writes,
//! or a policy that refuses token-issuer (or admits too much) would only show in a real cluster.
//!
//! The CEL is parsed and evaluated by the `cel` crate. Kubernetes' CEL environment is that of
//! cel-go plus Kubernetes libraries; of those the crate lacks the strings extension's
//! `substring`, registered here, and `string(bytes)` is made strict (invalid UTF-8 is an error,
//! not a lossy conversion). `matches` compiles each pattern once ([`matches`]), as cel-go does
//! for a literal pattern, where the crate compiles it on every call. The variables keep Kubernetes' types: Secret `data` values are
//! `bytes`, `metadata.creationTimestamp` is a `timestamp`, `object` is `null` on DELETE and
//! `oldObject` on CREATE.
//!
//! The order is the API server's: `matchConstraints.resourceRules`, then every
//! `matchConditions` expression (all must be true), then the `validations` in order; the first
//! false one denies with its `reason` and `message` in the dispatcher's format. With
//! `failurePolicy: Fail` an expression that cannot be evaluated denies too. A policy applies only
//! through a binding whose `validationActions` include `Deny`. Fields not modelled here
//! (`paramKind`, `variables`, `messageExpression`, selectors, ...) make loading fail rather than
//! be ignored.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock, Mutex};

use base64::Engine as _;
use cel::extractors::{Arguments, This};
use cel::objects::Key;
use cel::{Context, ExecutionError, FunctionContext, Program};
use serde::Deserialize;
use serde_json::Value as Json;

use crate::status::{self, Failure};

/// Why admission policies could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The manifest file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A document is not valid YAML or not a policy or binding this stand-in models.
    #[error("document {index} is not a ValidatingAdmissionPolicy(Binding) the stand-in models")]
    Parse {
        /// Zero-based document index.
        index: usize,
        /// Why.
        #[source]
        source: serde_yaml::Error,
    },
    /// A CEL expression does not parse.
    #[error("policy {policy}: cannot compile `{expression}`: {why}")]
    Compile {
        /// The policy's name.
        policy: String,
        /// The expression.
        expression: String,
        /// The parser's message.
        why: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Document {
    kind: String,
    metadata: Metadata,
    #[serde(default)]
    spec: serde_yaml::Value,
}

#[derive(Deserialize)]
struct Metadata {
    name: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct PolicySpec {
    #[serde(default)]
    failure_policy: Option<String>,
    match_constraints: MatchResources,
    #[serde(default)]
    match_conditions: Vec<MatchCondition>,
    validations: Vec<ValidationSpec>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct MatchResources {
    resource_rules: Vec<ResourceRule>,
}

/// `admissionregistration.k8s.io/v1` `NamedRuleWithOperations`, without `resourceNames`/`scope`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ResourceRule {
    api_groups: Vec<String>,
    api_versions: Vec<String>,
    operations: Vec<String>,
    resources: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MatchCondition {
    name: String,
    expression: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ValidationSpec {
    expression: String,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BindingSpec {
    policy_name: String,
    validation_actions: Vec<String>,
}

/// One compiled expression and its source (for messages).
struct Expression {
    source: String,
    program: Program,
}

struct Validation {
    expression: Expression,
    message: Option<String>,
    reason: &'static str,
}

struct Compiled {
    match_conditions: Vec<(String, Expression)>,
    validations: Vec<Validation>,
}

/// One `ValidatingAdmissionPolicy` with the name of a binding that enforces it (`Deny`).
#[derive(Clone)]
pub struct AdmissionPolicy {
    name: String,
    binding: String,
    fail_closed: bool,
    rules: Vec<ResourceRule>,
    compiled: Arc<Compiled>,
}

impl fmt::Debug for AdmissionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdmissionPolicy")
            .field("name", &self.name)
            .field("binding", &self.binding)
            .finish_non_exhaustive()
    }
}

/// The reasons a validation may give and the codes the dispatcher answers with
/// (`reasonToCode`); the API server refuses to store a policy with any other reason.
fn reason_code(reason: &str) -> Option<(&'static str, u16)> {
    Some(match reason {
        "Unauthorized" => ("Unauthorized", 401),
        "Forbidden" => ("Forbidden", 403),
        "Invalid" => ("Invalid", 422),
        "RequestEntityTooLarge" => ("RequestEntityTooLarge", 413),
        _ => return None,
    })
}

fn compile(policy: &str, source: &str) -> Result<Expression, LoadError> {
    Program::compile(source)
        .map(|program| Expression {
            source: source.to_owned(),
            program,
        })
        .map_err(|e| LoadError::Compile {
            policy: policy.to_owned(),
            expression: source.to_owned(),
            why: e.to_string(),
        })
}

impl AdmissionPolicy {
    /// The policies in a multi-document manifest that a binding with `validationActions: [Deny]`
    /// enforces (one entry per such binding); other kinds of objects are skipped.
    pub fn from_yaml(text: &str) -> Result<Vec<Self>, LoadError> {
        let mut policies = Vec::new();
        let mut bindings = Vec::new();
        for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let parse = |source| LoadError::Parse { index, source };
            let doc = Document::deserialize(document).map_err(parse)?;
            match doc.kind.as_str() {
                "ValidatingAdmissionPolicy" => {
                    let spec: PolicySpec = serde_yaml::from_value(doc.spec).map_err(parse)?;
                    policies.push((doc.metadata.name, spec));
                }
                "ValidatingAdmissionPolicyBinding" => {
                    let spec: BindingSpec = serde_yaml::from_value(doc.spec).map_err(parse)?;
                    bindings.push((doc.metadata.name, spec));
                }
                _ => {}
            }
        }
        let mut out = Vec::new();
        for (name, spec) in policies {
            let match_conditions = spec
                .match_conditions
                .iter()
                .map(|c| Ok((c.name.clone(), compile(&name, &c.expression)?)))
                .collect::<Result<Vec<_>, LoadError>>()?;
            let validations =
                spec.validations
                    .iter()
                    .map(|v| {
                        let reason = match v.reason.as_deref() {
                            None => "Invalid",
                            Some(r) => reason_code(r).map(|(r, _)| r).ok_or_else(|| {
                                LoadError::Compile {
                                    policy: name.clone(),
                                    expression: v.expression.clone(),
                                    why: format!("unsupported reason {r:?}"),
                                }
                            })?,
                        };
                        Ok(Validation {
                            expression: compile(&name, &v.expression)?,
                            message: v.message.clone(),
                            reason,
                        })
                    })
                    .collect::<Result<Vec<_>, LoadError>>()?;
            let compiled = Arc::new(Compiled {
                match_conditions,
                validations,
            });
            // failurePolicy defaults to Fail.
            let fail_closed = spec.failure_policy.as_deref() != Some("Ignore");
            for (binding, b) in &bindings {
                if b.policy_name == name && b.validation_actions.iter().any(|a| a == "Deny") {
                    out.push(Self {
                        name: name.clone(),
                        binding: binding.clone(),
                        fail_closed,
                        rules: spec.match_constraints.resource_rules.clone(),
                        compiled: Arc::clone(&compiled),
                    });
                }
            }
        }
        Ok(out)
    }

    /// [`AdmissionPolicy::from_yaml`] of a file.
    pub fn from_file(path: &Path) -> Result<Vec<Self>, LoadError> {
        let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_yaml(&text)
    }

    /// The policy's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn matches_rules(&self, req: &Request<'_>) -> bool {
        let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
        self.rules.iter().any(|r| {
            has(&r.api_groups, req.group)
                && has(&r.api_versions, req.version)
                && has(&r.resources, req.resource)
                && has(&r.operations, req.operation)
        })
    }

    /// `None` when the policy admits (or does not apply), else the denial's reason and message.
    fn evaluate(&self, req: &Request<'_>) -> Option<(&'static str, String)> {
        if !self.matches_rules(req) {
            return None;
        }
        let ctx = context(req);
        for (name, condition) in &self.compiled.match_conditions {
            match run(&ctx, condition) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(why) if self.fail_closed => {
                    return Some((
                        "Invalid",
                        format!("failed to evaluate match condition {name:?}: {why}"),
                    ));
                }
                Err(_) => return None,
            }
        }
        for v in &self.compiled.validations {
            match run(&ctx, &v.expression) {
                Ok(true) => {}
                Ok(false) => {
                    let message = v
                        .message
                        .clone()
                        .unwrap_or_else(|| format!("failed expression: {}", v.expression.source));
                    return Some((v.reason, message));
                }
                Err(why) if self.fail_closed => return Some(("Invalid", why)),
                Err(_) => {}
            }
        }
        None
    }
}

/// What admission sees of one request.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    /// `CREATE`, `UPDATE` or `DELETE`.
    pub operation: &'static str,
    pub group: &'a str,
    pub version: &'a str,
    pub resource: &'a str,
    pub namespace: Option<&'a str>,
    pub name: &'a str,
    pub username: &'a str,
    /// The object as it would be stored (`None` on DELETE).
    pub object: Option<&'a Json>,
    /// The stored object (`None` on CREATE).
    pub old_object: Option<&'a Json>,
}

/// Runs every policy; the first denial answers, in the validating dispatcher's format.
pub(crate) fn admit(policies: &[AdmissionPolicy], req: &Request<'_>) -> Result<(), Failure> {
    for policy in policies {
        if let Some((reason, message)) = policy.evaluate(req) {
            let message = format!(
                "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {message}",
                policy.name, policy.binding
            );
            let code = reason_code(reason).map_or(422, |(_, c)| c);
            let mut failure = status::forbidden(req.group, req.resource, req.name, &message);
            failure.status.reason = reason;
            failure.status.code = code;
            if let Some(details) = failure.status.details.as_mut() {
                details.causes.push(status::Cause {
                    message,
                    ..status::Cause::default()
                });
            }
            return Err(failure);
        }
    }
    Ok(())
}

fn run(ctx: &Context<'_>, e: &Expression) -> Result<bool, String> {
    match e.program.execute(ctx) {
        Ok(cel::Value::Bool(b)) => Ok(b),
        Ok(other) => Err(format!(
            "expression '{}' resulted in error: expected bool, got {other:?}",
            e.source
        )),
        Err(err) => Err(format!(
            "expression '{}' resulted in error: {err}",
            e.source
        )),
    }
}

fn context<'a>(req: &Request<'_>) -> Context<'a> {
    let mut ctx = Context::default();
    ctx.add_function("substring", substring);
    ctx.add_function("string", strict_string);
    ctx.add_function("matches", matches);
    let secret = req.resource == "secrets" && req.group.is_empty();
    let object = |o: Option<&Json>| o.map_or(cel::Value::Null, |o| object_value(o, secret));
    let request: HashMap<Key, cel::Value> = HashMap::from([
        ("operation".into(), req.operation.into()),
        ("namespace".into(), req.namespace.unwrap_or("").into()),
        ("name".into(), req.name.into()),
        (
            "resource".into(),
            HashMap::<Key, cel::Value>::from([
                ("group".into(), req.group.into()),
                ("version".into(), req.version.into()),
                ("resource".into(), req.resource.into()),
            ])
            .into(),
        ),
        (
            "userInfo".into(),
            HashMap::<Key, cel::Value>::from([("username".into(), req.username.into())]).into(),
        ),
    ]);
    ctx.add_variable_from_value("request", request);
    ctx.add_variable_from_value("object", object(req.object));
    ctx.add_variable_from_value("oldObject", object(req.old_object));
    ctx
}

/// An object as Kubernetes' CEL sees it: typed by its OpenAPI schema, so `metav1.Time` fields are
/// timestamps and a Secret's `data` values (base64 in JSON) are bytes.
fn object_value(o: &Json, secret: bool) -> cel::Value {
    let Json::Object(fields) = o else {
        return json_value(o);
    };
    let mut out = HashMap::<Key, cel::Value>::new();
    for (k, v) in fields {
        let value = match (k.as_str(), v) {
            ("metadata", Json::Object(meta)) => {
                let mut m = HashMap::<Key, cel::Value>::new();
                for (mk, mv) in meta {
                    let value = match (mk.as_str(), mv) {
                        ("creationTimestamp" | "deletionTimestamp", Json::String(t)) => {
                            timestamp(t)
                        }
                        _ => json_value(mv),
                    };
                    m.insert(mk.as_str().into(), value);
                }
                m.into()
            }
            ("data", Json::Object(data)) if secret => data
                .iter()
                .map(|(dk, dv)| {
                    let bytes = dv
                        .as_str()
                        .and_then(|s| base64::engine::general_purpose::STANDARD.decode(s).ok())
                        .unwrap_or_default();
                    (Key::from(dk.as_str()), cel::Value::Bytes(Arc::new(bytes)))
                })
                .collect::<HashMap<_, _>>()
                .into(),
            _ => json_value(v),
        };
        out.insert(k.as_str().into(), value);
    }
    out.into()
}

/// A stored timestamp; the store only holds what the server wrote (RFC 3339), so a parse
/// failure leaves the string, and comparing it with a timestamp then fails the expression.
fn timestamp(t: &str) -> cel::Value {
    cel::functions::timestamp(Arc::new(t.to_owned())).unwrap_or_else(|_| t.into())
}

fn json_value(v: &Json) -> cel::Value {
    match v {
        Json::Null => cel::Value::Null,
        Json::Bool(b) => (*b).into(),
        Json::Number(n) => n
            .as_i64()
            .map(cel::Value::Int)
            .or_else(|| n.as_u64().map(cel::Value::UInt))
            .unwrap_or_else(|| cel::Value::Float(n.as_f64().unwrap_or_default())),
        Json::String(s) => s.as_str().into(),
        Json::Array(a) => a.iter().map(json_value).collect::<Vec<_>>().into(),
        Json::Object(m) => m
            .iter()
            .map(|(k, v)| (Key::from(k.as_str()), json_value(v)))
            .collect::<HashMap<_, _>>()
            .into(),
    }
}

/// The strings extension's `substring(start)` and `substring(start, end)`: code-point indices,
/// an error when out of range or reversed.
fn substring(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Arc<String>>,
    Arguments(args): Arguments,
) -> Result<cel::Value, ExecutionError> {
    let chars: Vec<char> = this.chars().collect();
    let index = |v: Option<&cel::Value>| match v {
        Some(cel::Value::Int(i)) => usize::try_from(*i).ok(),
        _ => None,
    };
    let (start, end) = match args.len() {
        1 => (index(args.first()), Some(chars.len())),
        2 => (index(args.first()), index(args.get(1))),
        n => return Err(ftx.error(format!("substring takes 1 or 2 arguments, got {n}"))),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= chars.len() => {
            Ok(chars[s..e].iter().collect::<String>().into())
        }
        _ => Err(ftx.error(format!(
            "index out of range: {args:?} for a string of length {}",
            chars.len()
        ))),
    }
}

/// `string()` as cel-go defines it for bytes: invalid UTF-8 is an error.
fn strict_string(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<cel::Value>,
) -> Result<cel::Value, ExecutionError> {
    match this {
        cel::Value::Bytes(b) => String::from_utf8(b.to_vec())
            .map(Into::into)
            .map_err(|_| ftx.error("invalid UTF-8 in bytes, cannot convert to string")),
        other => cel::functions::string(ftx, This(other)),
    }
}

/// Compiled `matches` patterns. Bounded, since a pattern may be computed from the request; the
/// deployed policies use a few literal ones.
static PATTERNS: LazyLock<Mutex<HashMap<String, regex::Regex>>> = LazyLock::new(Mutex::default);
const MAX_PATTERNS: usize = 64;

/// `string.matches(pattern)`, the crate's function with each pattern compiled once.
fn matches(
    ftx: &FunctionContext<'_, '_>,
    This(this): This<Arc<String>>,
    pattern: Arc<String>,
) -> Result<bool, ExecutionError> {
    let mut patterns = PATTERNS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(compiled) = patterns.get(pattern.as_str()) {
        return Ok(compiled.is_match(&this));
    }
    let compiled = regex::Regex::new(&pattern)
        .map_err(|err| ftx.error(format!("'{pattern}' not a valid regex:\n{err}")))?;
    let matched = compiled.is_match(&this);
    if patterns.len() >= MAX_PATTERNS {
        patterns.clear();
    }
    patterns.insert(pattern.to_string(), compiled);
    Ok(matched)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(expr: &str, req: &Request<'_>) -> Result<bool, String> {
        let e = compile("t", expr).map_err(|e| e.to_string())?;
        run(&context(req), &e)
    }

    #[test]
    fn kubernetes_types_and_extensions() {
        let object = serde_json::json!({
            "type": "bootstrap.kubernetes.io/token",
            "metadata": {"name": "bootstrap-token-abcdef", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "data": {"token-id": "YWJjZGVm", "expiration": "MjAyNi0wMS0wMVQwMDozMDowMFo="},
        });
        let req = Request {
            operation: "CREATE",
            group: "",
            version: "v1",
            resource: "secrets",
            namespace: Some("kube-system"),
            name: "bootstrap-token-abcdef",
            username: "u",
            object: Some(&object),
            old_object: None,
        };
        for expr in [
            "string(object.data['token-id']) == object.metadata.name.substring(16)",
            "object.metadata.name.substring(0, 9) == 'bootstrap'",
            "timestamp(string(object.data['expiration'])) <= object.metadata.creationTimestamp + duration('1h')",
            "!(timestamp(string(object.data['expiration'])) <= object.metadata.creationTimestamp + duration('10m'))",
            "oldObject == null && object != null",
            "object.data.all(k, k in ['token-id', 'expiration'])",
            "object.metadata.name.matches('^bootstrap-token-[a-z0-9]{6}$')",
            "has(object.type) && !has(object.immutable)",
        ] {
            assert_eq!(eval(expr, &req), Ok(true), "{expr}");
        }
        assert!(eval("object.metadata.name.substring(40) == ''", &req).is_err());
        assert!(eval("string(object.data['missing']) == ''", &req).is_err());
        // A kept pattern answers as a new one would; a bad pattern is an error every time.
        for _ in 0..2 {
            assert_eq!(
                eval(
                    "object.metadata.name.matches('^bootstrap-token-[a-z0-9]{6}$')",
                    &req
                ),
                Ok(true)
            );
            assert_eq!(
                eval(
                    "object.metadata.name.matches('^bootstrap-token-[A-Z]{6}$')",
                    &req
                ),
                Ok(false)
            );
            assert!(eval("object.metadata.name.matches('(')", &req).is_err());
        }
    }
}
