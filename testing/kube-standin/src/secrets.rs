//! Decoding and validating a Secret on create, with the real server's rules and messages.

use base64::Engine as _;
use serde_json::{Map, Value, json};

use crate::resources;
use crate::status::{self, Cause, Failure};

/// The largest Secret the apiserver accepts (sum of data sizes).
const MAX_SECRET_SIZE: usize = 1024 * 1024;

const DNS1123_SUBDOMAIN_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
const CONFIG_KEY_MSG: &str = "a valid config key must consist of alphanumeric characters, '-', '_' or '.' (e.g. 'key.name',  or 'KEY_NAME',  or 'key-name', regex used for validation is '[-._a-zA-Z0-9]+')";

/// Whether `s` is a DNS-1123 subdomain (what most object names must be).
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            match (b.first(), b.last()) {
                (Some(f), Some(l)) => {
                    f.is_ascii_alphanumeric()
                        && l.is_ascii_alphanumeric()
                        && b.iter()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
                }
                _ => false,
            }
        })
}

fn cannot_handle(why: impl std::fmt::Display) -> Failure {
    status::bad_request(format!(
        "Secret in version \"v1\" cannot be handled as a Secret: {why}"
    ))
}

/// A Secret ready to store, minus server-set metadata.
#[derive(Debug)]
pub(crate) struct NewSecret {
    pub name: String,
    pub object: Map<String, Value>,
}

/// Decodes a create body for namespace `ns`: JSON, kind, namespace, name, `data` base64,
/// `stringData` merged into `data` (and dropped), `type` defaulted to `Opaque`, validation.
pub(crate) fn decode_create(
    body: &[u8],
    ns: &str,
    suffix: impl FnOnce() -> String,
) -> Result<NewSecret, Failure> {
    let r = &resources::SECRETS;
    let mut obj = resources::decode_object(r, body)?;
    let (mut meta, name) = resources::take_metadata(r, &mut obj, Some(ns), suffix)?;

    let mut causes = Vec::new();
    if name.is_empty() {
        causes.push(Cause {
            reason: "FieldValueRequired",
            message: "Required value: name or generateName is required".into(),
            field: "metadata.name".into(),
        });
    } else if !is_dns1123_subdomain(&name) {
        causes.push(Cause {
            reason: "FieldValueInvalid",
            message: format!("Invalid value: \"{name}\": {DNS1123_SUBDOMAIN_MSG}"),
            field: "metadata.name".into(),
        });
    }

    let mut data = Map::new();
    match obj.remove("data") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let Value::String(encoded) = v else {
                    return Err(cannot_handle(format!(
                        "json: cannot unmarshal into Go struct field Secret.data of type []uint8 (key {k:?})"
                    )));
                };
                if let Err(e) = base64::engine::general_purpose::STANDARD.decode(&encoded) {
                    return Err(cannot_handle(format!("illegal base64 data: {e}")));
                }
                data.insert(k, Value::String(encoded));
            }
        }
        Some(_) => {
            return Err(cannot_handle(
                "json: cannot unmarshal into Go struct field Secret.data of type map[string][]uint8",
            ));
        }
    }
    match obj.remove("stringData") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                let Value::String(plain) = v else {
                    return Err(cannot_handle(
                        "json: cannot unmarshal into Go struct field Secret.stringData of type string",
                    ));
                };
                data.insert(
                    k,
                    json!(base64::engine::general_purpose::STANDARD.encode(plain)),
                );
            }
        }
        Some(_) => {
            return Err(cannot_handle(
                "json: cannot unmarshal into Go struct field Secret.stringData of type map[string]string",
            ));
        }
    }
    let mut total = 0usize;
    for (k, v) in &data {
        if k.is_empty()
            || k.len() > 253
            || !k
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"-._".contains(&c))
        {
            causes.push(Cause {
                reason: "FieldValueInvalid",
                message: format!("Invalid value: \"{k}\": {CONFIG_KEY_MSG}"),
                field: format!("data[{k}]"),
            });
        }
        let len = v.as_str().map(|s| s.len() / 4 * 3).unwrap_or(0);
        total = total.saturating_add(len);
    }
    if total > MAX_SECRET_SIZE {
        causes.push(Cause {
            reason: "FieldValueTooLong",
            message: format!("Too long: must have at most {MAX_SECRET_SIZE} bytes"),
            field: "data".into(),
        });
    }
    let secret_type = match obj.remove("type") {
        None | Some(Value::Null) => "Opaque".to_owned(),
        Some(Value::String(s)) if s.is_empty() => "Opaque".to_owned(),
        Some(Value::String(s)) => s,
        Some(_) => {
            return Err(cannot_handle(
                "json: cannot unmarshal into Go struct field Secret.type of type v1.SecretType",
            ));
        }
    };
    if !causes.is_empty() {
        return Err(status::invalid("", "Secret", &name, causes));
    }

    meta.insert("name".into(), json!(name));
    meta.insert("namespace".into(), json!(ns));
    let mut object = Map::new();
    object.insert("kind".into(), json!("Secret"));
    object.insert("apiVersion".into(), json!("v1"));
    object.insert("metadata".into(), Value::Object(meta));
    if !data.is_empty() {
        object.insert("data".into(), Value::Object(data));
    }
    if let Some(immutable) = obj.remove("immutable") {
        object.insert("immutable".into(), immutable);
    }
    object.insert("type".into(), json!(secret_type));
    Ok(NewSecret { name, object })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_subdomain() {
        assert!(is_dns1123_subdomain("bootstrap-token-abc123"));
        assert!(is_dns1123_subdomain("a.b-c.d"));
        assert!(!is_dns1123_subdomain("Bad_Name"));
        assert!(!is_dns1123_subdomain("-a"));
        assert!(!is_dns1123_subdomain("a..b"));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }

    #[test]
    fn string_data_is_merged_and_dropped() {
        let s = decode_create(
            br#"{"metadata":{"name":"s"},"data":{"a":"eA=="},"stringData":{"b":"y","a":"z"}}"#,
            "default",
            String::new,
        )
        .unwrap();
        let v = Value::Object(s.object);
        assert_eq!(v["data"]["a"], "eg==");
        assert_eq!(v["data"]["b"], "eQ==");
        assert!(v.get("stringData").is_none());
        assert_eq!(v["type"], "Opaque");
    }

    #[test]
    fn bad_base64_is_400() {
        let e = decode_create(
            br#"{"metadata":{"name":"s"},"data":{"a":"!!"}}"#,
            "d",
            String::new,
        )
        .unwrap_err();
        assert_eq!(e.code(), 400);
    }
}
