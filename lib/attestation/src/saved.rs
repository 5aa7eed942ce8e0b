//! A saved attestation: a document together with what it was issued for, so that it can be
//! verified and turned into a policy offline without the operator carrying the nonce around.
//!
//! `join-client attest` writes it and `attest-tool` (`verify`, `policy`, `ak-digest`) reads it:
//!
//! ```json
//! {"variant": "qemu-vtpm", "nonce": "<hex>", "userData": "<hex>", "document": "<base64>"}
//! ```
//!
//! `document` holds the document's exact bytes (what the aTLS certificate extension carries), in
//! standard base64, so that digests over it match the ones attest-proxy logs.

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::Variant;

/// Why a file is not a saved attestation.
#[derive(Debug, thiserror::Error)]
pub enum SavedError {
    #[error("not a saved attestation {{variant, nonce, userData, document}}: {0}")]
    Json(#[source] serde_json::Error),
    #[error("saved attestation: variant: {0}")]
    Variant(#[source] crate::variant::UnknownVariant),
    #[error("saved attestation: {field} is not hex: {source}")]
    Hex {
        field: &'static str,
        #[source]
        source: hex::FromHexError,
    },
    #[error("saved attestation: document is not standard base64: {0}")]
    Base64(#[source] base64::DecodeError),
    #[error("saved attestation: document is empty")]
    Empty,
}

/// An attestation document and the nonce and user data it was issued for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedAttestation {
    pub variant: Variant,
    pub nonce: Vec<u8>,
    pub user_data: Vec<u8>,
    pub document: Vec<u8>,
}

#[derive(Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Raw {
    variant: String,
    nonce: String,
    user_data: String,
    document: String,
}

impl SavedAttestation {
    /// The file's JSON, pretty-printed, with a trailing newline.
    pub fn to_json(&self) -> String {
        let raw = Raw {
            variant: self.variant.name().to_owned(),
            nonce: hex::encode(&self.nonce),
            user_data: hex::encode(&self.user_data),
            document: base64::engine::general_purpose::STANDARD.encode(&self.document),
        };
        // Serializing four strings cannot fail.
        serde_json::to_string_pretty(&raw).unwrap_or_default() + "\n"
    }

    /// Parses a saved attestation.
    pub fn parse(bytes: &[u8]) -> Result<SavedAttestation, SavedError> {
        let raw: Raw = serde_json::from_slice(bytes).map_err(SavedError::Json)?;
        let hex = |field, value: &str| {
            hex::decode(value).map_err(|source| SavedError::Hex { field, source })
        };
        let document = base64::engine::general_purpose::STANDARD
            .decode(&raw.document)
            .map_err(SavedError::Base64)?;
        if document.is_empty() {
            return Err(SavedError::Empty);
        }
        Ok(SavedAttestation {
            variant: raw.variant.parse().map_err(SavedError::Variant)?,
            nonce: hex("nonce", &raw.nonce)?,
            user_data: hex("userData", &raw.user_data)?,
            document,
        })
    }

    /// Whether `bytes` look like a saved attestation rather than a bare document: a JSON object
    /// with a string `document` and a string `nonce` (no variant's document has both).
    pub fn is_saved(bytes: &[u8]) -> bool {
        #[derive(Deserialize)]
        struct Probe {
            document: Option<serde_json::Value>,
            nonce: Option<serde_json::Value>,
        }
        serde_json::from_slice::<Probe>(bytes).is_ok_and(|p| {
            p.document
                .as_ref()
                .is_some_and(serde_json::Value::is_string)
                && p.nonce.as_ref().is_some_and(serde_json::Value::is_string)
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn round_trips_and_is_told_apart_from_a_bare_document() {
        let saved = SavedAttestation {
            variant: Variant::AzureTdx,
            nonce: vec![1, 2, 3],
            user_data: vec![],
            document: br#"{"Attestation":null}"#.to_vec(),
        };
        let json = saved.to_json();
        assert!(SavedAttestation::is_saved(json.as_bytes()));
        assert_eq!(SavedAttestation::parse(json.as_bytes()).unwrap(), saved);
        assert!(!SavedAttestation::is_saved(&saved.document));
        assert!(!SavedAttestation::is_saved(b"{\"RawQuote\":\"AA==\"}"));
    }

    #[test]
    fn bad_fields_are_named() {
        let bad = |json: &str| {
            SavedAttestation::parse(json.as_bytes())
                .unwrap_err()
                .to_string()
        };
        let err = bad(r#"{"variant":"qemu","nonce":"","userData":"","document":"e30="}"#);
        assert!(
            err.contains("variant: unknown attestation variant \"qemu\""),
            "{err}"
        );
        let err = bad(r#"{"variant":"qemu-vtpm","nonce":"0g","userData":"","document":"e30="}"#);
        assert!(err.contains("nonce is not hex"), "{err}");
        let err = bad(r#"{"variant":"qemu-vtpm","nonce":"","userData":"","document":"!"}"#);
        assert!(err.contains("document is not standard base64"), "{err}");
        let err = bad(r#"{"variant":"qemu-vtpm","nonce":"","userData":"","document":""}"#);
        assert!(err.contains("document is empty"), "{err}");
        let err = bad(r#"{"variant":"qemu-vtpm","nonce":""}"#);
        assert!(err.contains("missing field `userData`"), "{err}");
    }
}
