//! The vTPM attestation document as Constellation's Go code writes it with `encoding/json`.
//!
//! Issuer (crate `tpm-issuer`) and validator share these types so the two cannot drift. The Go
//! conventions they reproduce: struct fields in declaration order; `[]byte` as standard base64
//! with padding, `null` when nil; protobuf fields carry `omitempty`, so empty ones are left out;
//! `map[uint32][]byte` keys are decimal strings, sorted as strings ("0", "1", "10", ...). On
//! input, unknown fields (`ak_cert`, `TeeAttestation`, ...) are ignored and every byte field
//! may be omitted or `null`, as Go accepts.

use std::collections::BTreeMap;

use base64::Engine as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `vtpm.AttestationDocument`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttestationDocument {
    /// `*attest.Attestation`; Go writes `null` for a nil pointer (no omitempty).
    #[serde(rename = "Attestation", default)]
    pub attestation: Option<Attestation>,
    /// Cloud-specific instance data; `null` for qemu-vtpm.
    #[serde(rename = "InstanceInfo", default, with = "opt_b64")]
    pub instance_info: Option<Vec<u8>>,
    /// The data the quote binds (aTLS: the hash of the certificate's key).
    #[serde(rename = "UserData", default, with = "opt_b64")]
    pub user_data: Option<Vec<u8>>,
}

impl AttestationDocument {
    /// Parses `document` within [`MAX_DOCUMENT_SIZE`](crate::vtpm::MAX_DOCUMENT_SIZE), checking
    /// nothing else.
    pub fn parse(document: &[u8]) -> Result<Self, crate::Error> {
        if document.len() > crate::vtpm::MAX_DOCUMENT_SIZE {
            return Err(crate::Error::TooLarge {
                size: document.len(),
                limit: crate::vtpm::MAX_DOCUMENT_SIZE,
            });
        }
        serde_json::from_slice(document).map_err(crate::Error::Json)
    }

    /// The hardware evidence in `InstanceInfo`; `missing` names it when it is absent or empty.
    pub fn hardware_evidence(&self, missing: &'static str) -> Result<&[u8], crate::Error> {
        self.instance_info
            .as_deref()
            .filter(|info| !info.is_empty())
            .ok_or(crate::Error::Missing(missing))
    }
}

/// go-tpm-tools' `attest.Attestation`, the fields a vTPM document uses.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attestation {
    /// The attestation key's `TPMT_PUBLIC`.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub ak_pub: Vec<u8>,
    /// One quote per PCR bank.
    #[serde(
        default,
        deserialize_with = "null_as_default",
        skip_serializing_if = "Vec::is_empty"
    )]
    pub quotes: Vec<Quote>,
    /// The TCG PC Client firmware event log.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub event_log: Vec<u8>,
}

/// go-tpm-tools' `tpm.Quote`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Quote {
    /// `TPMS_ATTEST` as signed by the TPM.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub quote: Vec<u8>,
    /// `TPMT_SIGNATURE` over `quote`.
    #[serde(default, with = "b64", skip_serializing_if = "Vec::is_empty")]
    pub raw_sig: Vec<u8>,
    /// The values of the quoted PCRs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcrs: Option<Pcrs>,
}

/// go-tpm-tools' `tpm.PCRs`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pcrs {
    /// The bank as a TPM algorithm id (`HashAlgo` is an `int32` enum; 0 is unspecified).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub hash: i32,
    /// PCR index → value.
    #[serde(default, with = "pcr_map", skip_serializing_if = "BTreeMap::is_empty")]
    pub pcrs: BTreeMap<u32, Vec<u8>>,
}

fn is_zero(v: &i32) -> bool {
    *v == 0
}

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn decode_b64<E: serde::de::Error>(s: &str) -> Result<Vec<u8>, E> {
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|e| E::custom(format!("invalid base64: {e}")))
}

/// `[]byte` with omitempty: absent or `null` decode to empty.
pub(crate) mod b64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(s) => decode_b64(&s),
            None => Ok(Vec::new()),
        }
    }
}

/// `[]byte` without omitempty: nil is `null`.
pub(crate) mod opt_b64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<String>::deserialize(d)? {
            Some(s) => decode_b64(&s).map(Some),
            None => Ok(None),
        }
    }
}

/// `map[uint32][]byte`: Go writes the keys in string order, so "10" comes before "2".
mod pcr_map {
    use super::*;
    use serde::ser::SerializeMap;

    pub fn serialize<S: Serializer>(v: &BTreeMap<u32, Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        let mut entries: Vec<(String, &Vec<u8>)> =
            v.iter().map(|(k, v)| (k.to_string(), v)).collect();
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        let mut map = s.serialize_map(Some(entries.len()))?;
        for (k, v) in entries {
            map.serialize_entry(&k, &base64::engine::general_purpose::STANDARD.encode(v))?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<u32, Vec<u8>>, D::Error> {
        let raw = Option::<BTreeMap<String, Option<String>>>::deserialize(d)?.unwrap_or_default();
        let mut out = BTreeMap::new();
        for (k, v) in raw {
            let index: u32 = k.parse().map_err(|_| {
                serde::de::Error::custom(format!("PCR index {k:?} is not a number"))
            })?;
            let value = match v {
                Some(s) => decode_b64(&s)?,
                None => Vec::new(),
            };
            out.insert(index, value);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serializes_like_go() {
        let mut pcrs = BTreeMap::new();
        for i in [0u32, 2, 10] {
            pcrs.insert(i, vec![i as u8]);
        }
        let doc = AttestationDocument {
            attestation: Some(Attestation {
                ak_pub: vec![1, 2],
                quotes: vec![Quote {
                    quote: vec![3],
                    raw_sig: vec![4],
                    pcrs: Some(Pcrs { hash: 11, pcrs }),
                }],
                event_log: Vec::new(),
            }),
            instance_info: None,
            user_data: Some(vec![0xff]),
        };
        let json = serde_json::to_string(&doc).unwrap();
        assert_eq!(
            json,
            r#"{"Attestation":{"ak_pub":"AQI=","quotes":[{"quote":"Aw==","raw_sig":"BA==","pcrs":{"hash":11,"pcrs":{"0":"AA==","10":"Cg==","2":"Ag=="}}}]},"InstanceInfo":null,"UserData":"/w=="}"#
        );
        assert_eq!(
            serde_json::from_str::<AttestationDocument>(&json).unwrap(),
            doc
        );
    }

    #[test]
    fn accepts_what_go_accepts() {
        let json = r#"{"Attestation":{"ak_pub":null,"quotes":null,"ak_cert":"AA==","TeeAttestation":null,
            "unknown":{"x":[1]}},"UserData":"","Extra":1}"#;
        let doc: AttestationDocument = serde_json::from_str(json).unwrap();
        let att = doc.attestation.unwrap();
        assert!(att.ak_pub.is_empty() && att.quotes.is_empty());
        assert_eq!(doc.instance_info, None);
        assert_eq!(doc.user_data, Some(Vec::new()));
        let doc: AttestationDocument = serde_json::from_str("{}").unwrap();
        assert_eq!(doc.attestation, None);
    }

    #[test]
    fn refuses_bad_base64_and_keys() {
        assert!(serde_json::from_str::<AttestationDocument>(r#"{"UserData":"!!"}"#).is_err());
        assert!(serde_json::from_str::<Pcrs>(r#"{"hash":11,"pcrs":{"x":"AA=="}}"#).is_err());
        assert!(serde_json::from_str::<AttestationDocument>(r#"{"UserData":5}"#).is_err());
    }
}
