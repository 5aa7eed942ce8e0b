//! Label selectors on list requests (`?labelSelector=...`), as the API server reads them.
//!
//! Served: the equality-based requirements (`key`, `!key`, `key=value`, `key==value`,
//! `key!=value`) and the set-based ones (`key in (a,b)`, `key notin (a,b)`), joined by commas
//! (all must hold). A selector that does not parse is the real server's 400 `BadRequest`.

use serde_json::Value;

/// One requirement of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed label selector; empty matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Selector(Vec<Requirement>);

/// Splits at commas that are not inside parentheses.
fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

/// Label keys: an optional DNS subdomain prefix and `/`, then a name of `[A-Za-z0-9-_.]`
/// starting and ending alphanumeric.
fn valid_key(key: &str) -> bool {
    let name = match key.rsplit_once('/') {
        Some((prefix, name)) => {
            if !crate::secrets::is_dns1123_subdomain(prefix) {
                return false;
            }
            name
        }
        None => key,
    };
    valid_value(name) && !name.is_empty()
}

fn valid_value(value: &str) -> bool {
    let b = value.as_bytes();
    value.is_empty()
        || (b.len() <= 63
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric)
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.')))
}

fn parse_requirement(text: &str) -> Result<Requirement, String> {
    let text = text.trim();
    let bad = |why: &str| Err(format!("unable to parse requirement: {why}: {text:?}"));
    let key_ok = |key: &str| -> Result<String, String> {
        let key = key.trim();
        if valid_key(key) {
            Ok(key.to_owned())
        } else {
            Err(format!(
                "unable to parse requirement: invalid label key {key:?}"
            ))
        }
    };
    let value_ok = |value: &str| -> Result<String, String> {
        let value = value.trim();
        if valid_value(value) {
            Ok(value.to_owned())
        } else {
            Err(format!(
                "unable to parse requirement: invalid label value {value:?}"
            ))
        }
    };
    if let Some(key) = text.strip_prefix('!') {
        return Ok(Requirement::NotExists(key_ok(key)?));
    }
    if let Some((key, value)) = text.split_once("!=") {
        return Ok(Requirement::NotIn(key_ok(key)?, vec![value_ok(value)?]));
    }
    if let Some((key, value)) = text.split_once("==").or_else(|| text.split_once('=')) {
        return Ok(Requirement::In(key_ok(key)?, vec![value_ok(value)?]));
    }
    for (op, negated) in [(" notin ", true), (" in ", false)] {
        if let Some((key, values)) = text.split_once(op) {
            let Some(inner) = values
                .trim()
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
            else {
                return bad("set values must be in parentheses");
            };
            let values = inner
                .split(',')
                .map(value_ok)
                .collect::<Result<Vec<_>, _>>()?;
            let key = key_ok(key)?;
            return Ok(if negated {
                Requirement::NotIn(key, values)
            } else {
                Requirement::In(key, values)
            });
        }
    }
    if text.contains(|c: char| c.is_whitespace() || "()=!".contains(c)) {
        return bad("unknown operator");
    }
    Ok(Requirement::Exists(key_ok(text)?))
}

impl Selector {
    /// Parses the `labelSelector` parameter (already percent-decoded).
    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        if text.trim().is_empty() {
            return Ok(Self::default());
        }
        split_top_level(text)
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    /// The `labelSelector` query parameter of a request, if any.
    pub(crate) fn from_query(query: Option<&str>) -> Result<Self, String> {
        let Some(query) = query else {
            return Ok(Self::default());
        };
        for pair in query.split('&') {
            if let Some(value) = pair.strip_prefix("labelSelector=") {
                return Self::parse(&percent_decode(value)?);
            }
        }
        Ok(Self::default())
    }

    /// Whether `object`'s `metadata.labels` satisfy every requirement.
    pub(crate) fn matches(&self, object: &Value) -> bool {
        let label = |key: &str| {
            object
                .pointer("/metadata/labels")
                .and_then(|l| l.get(key))
                .and_then(Value::as_str)
        };
        self.0.iter().all(|r| match r {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::NotExists(k) => label(k).is_none(),
            Requirement::In(k, values) => label(k).is_some_and(|v| values.iter().any(|w| w == v)),
            Requirement::NotIn(k, values) => label(k).is_none_or(|v| values.iter().all(|w| w != v)),
        })
    }
}

/// Decodes `%XX` escapes and `+` (form encoding, as Go's `url.ParseQuery` does).
fn percent_decode(text: &str) -> Result<String, String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid URL escape in {text:?}"))?;
                out.push(hex);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).map_err(|_| format!("invalid UTF-8 in {text:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selectors_match_like_the_apiserver() {
        let cp = json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": "", "zone": "a"}}});
        let worker = json!({"metadata": {"labels": {"zone": "b"}}});
        let none = json!({"metadata": {}});
        let cases = [
            (
                "node-role.kubernetes.io/control-plane",
                [true, false, false],
            ),
            (
                "!node-role.kubernetes.io/control-plane",
                [false, true, true],
            ),
            ("zone=a", [true, false, false]),
            ("zone==b", [false, true, false]),
            ("zone!=a", [false, true, true]),
            ("zone in (a, b)", [true, true, false]),
            ("zone notin (a)", [false, true, true]),
            (
                "zone,!node-role.kubernetes.io/control-plane",
                [false, true, false],
            ),
            ("", [true, true, true]),
        ];
        for (text, want) in cases {
            let s = Selector::parse(text).unwrap();
            let got = [s.matches(&cp), s.matches(&worker), s.matches(&none)];
            assert_eq!(got, want, "{text}");
        }
    }

    #[test]
    fn query_is_decoded_and_garbage_refused() {
        let s = Selector::from_query(Some(
            "limit=5&labelSelector=node-role.kubernetes.io%2Fcontrol-plane",
        ))
        .unwrap();
        assert!(s.matches(
            &json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}})
        ));
        assert!(Selector::parse("a b").is_err());
        assert!(Selector::parse("zone in a").is_err());
        assert!(Selector::parse("-bad=x").is_err());
        assert!(Selector::from_query(Some("labelSelector=%zz")).is_err());
    }
}
