//! AWS Signature Version 4 for the one request this process signs: an EC2 Query API `GET`
//! with its parameters in the query string and an empty body.
//!
//! Written here on aws-lc-rs's HMAC-SHA256 and SHA-256 rather than taken from AWS's `aws-sigv4`
//! crate, which brings the AWS SDK's runtime crates and RustCrypto's HMAC: aws-lc-rs is this
//! project's one crypto provider. The steps are AWS's: a canonical request (method, path,
//! sorted query, lower-case headers, signed header names, payload hash), a string to sign over
//! its hash with the credential scope `date/region/service/aws4_request`, and a signing key
//! derived from the secret by HMAC over date, region, service and `aws4_request`. The test
//! below checks them against AWS's published example.

use aws_lc_rs::{digest, hmac};

/// The algorithm name in the string to sign and the `Authorization` header.
pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";

/// An AWS credential: an access key, its secret and, for a role's temporary credential, the
/// session token.
#[derive(Clone)]
pub struct Credential {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// One request to sign.
#[derive(Debug)]
pub struct Request<'a> {
    pub method: &'a str,
    /// The URI path, already encoded (`/` for the Query API).
    pub path: &'a str,
    /// `(name, value)` pairs, each already URI-encoded as AWS requires (unreserved characters
    /// as they are, everything else `%XX`); sorted here.
    pub query: &'a [(&'a str, &'a str)],
    /// `(lower-case name, value)` of the headers to sign; `host` and `x-amz-date` among them.
    pub headers: &'a [(&'a str, &'a str)],
    pub payload: &'a [u8],
}

/// `YYYYMMDDTHHMMSSZ` for `time`, as `x-amz-date` carries it.
pub fn amz_date(time: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(time)
        .to_string()
        .chars()
        .filter(|c| !matches!(c, '-' | ':'))
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(digest::digest(&digest::SHA256, data))
}

fn hmac(key: &[u8], data: &[u8]) -> hmac::Tag {
    hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data)
}

/// The sorted query string of `query`, as the canonical request and the URL carry it.
pub fn canonical_query(query: &[(&str, &str)]) -> String {
    let mut pairs: Vec<_> = query.to_vec();
    pairs.sort();
    pairs
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("&")
}

/// What the signature covers: the canonical request, and the signed header names.
fn canonical_request(request: &Request<'_>) -> (String, String) {
    let mut headers: Vec<(String, String)> = request
        .headers
        .iter()
        .map(|(n, v)| {
            let value = v.split_whitespace().collect::<Vec<_>>().join(" ");
            (n.to_ascii_lowercase(), value)
        })
        .collect();
    headers.sort();
    let signed = headers
        .iter()
        .map(|(n, _)| n.as_str())
        .collect::<Vec<_>>()
        .join(";");
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    (
        format!(
            "{}\n{}\n{}\n{}\n{}\n{}",
            request.method,
            request.path,
            canonical_query(request.query),
            canonical_headers,
            signed,
            sha256_hex(request.payload)
        ),
        signed,
    )
}

/// The `Authorization` header value for `request`, made at `amz_date` (`x-amz-date`'s value,
/// which must be among the signed headers) for `service` in `region`.
pub fn authorization(
    credential: &Credential,
    request: &Request<'_>,
    amz_date: &str,
    region: &str,
    service: &str,
) -> String {
    let (canonical, signed) = canonical_request(request);
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let scope = format!("{date}/{region}/{service}/aws4_request");
    let to_sign = format!(
        "{ALGORITHM}\n{amz_date}\n{scope}\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let mut key = hmac(
        format!("AWS4{}", credential.secret_access_key).as_bytes(),
        date.as_bytes(),
    );
    for part in [region, service, "aws4_request"] {
        key = hmac(key.as_ref(), part.as_bytes());
    }
    let signature = hex::encode(hmac(key.as_ref(), to_sign.as_bytes()));
    format!(
        "{ALGORITHM} Credential={}/{scope}, SignedHeaders={signed}, Signature={signature}",
        credential.access_key_id
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// AWS's worked example of Signature Version 4 (IAM `ListUsers`, 2015-08-30, us-east-1,
    /// the documentation's example key), with its published signature.
    #[test]
    fn signs_aws_documented_example() {
        let credential = Credential {
            access_key_id: "AKIDEXAMPLE".to_owned(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".to_owned(),
            session_token: None,
        };
        let request = Request {
            method: "GET",
            path: "/",
            query: &[("Version", "2010-05-08"), ("Action", "ListUsers")],
            headers: &[
                (
                    "content-type",
                    "application/x-www-form-urlencoded; charset=utf-8",
                ),
                ("host", "iam.amazonaws.com"),
                ("x-amz-date", "20150830T123600Z"),
            ],
            payload: b"",
        };
        let (canonical, _) = canonical_request(&request);
        assert_eq!(
            sha256_hex(canonical.as_bytes()),
            "f536975d06c0309214f805bb90ccff089219ecd68b2577efef23edd43b7e1a59"
        );
        assert_eq!(
            authorization(
                &credential,
                &request,
                "20150830T123600Z",
                "us-east-1",
                "iam"
            ),
            "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/iam/aws4_request, \
             SignedHeaders=content-type;host;x-amz-date, \
             Signature=5d672d79c15b13162d9279b0855cfba6789a8edb4c82c400e06b5924a6f2b5d7"
        );
    }

    #[test]
    fn amz_date_is_basic_iso8601() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_440_938_160);
        assert_eq!(amz_date(t), "20150830T123600Z");
    }
}
