//! The GCE API as a root of trust, shared by gcp-sev-snp and gcp-sev-es.
//!
//! Neither variant's evidence names the vTPM's attestation key in anything a vendor signed: a
//! GCE SEV-SNP report carries only the connection's extraData, and an SEV-ES machine has no
//! report at all. The key is trusted because Google's Compute Engine API, asked
//! `instances.getShieldedInstanceIdentity` for the instance the document's InstanceInfo names
//! (`project_id`, `zone`, `instance_name`, as Constellation asks), answers with that very key as
//! `signingKey.ekPub` (a PEM `PUBLIC KEY`, SubjectPublicKeyInfo). gcp-sev-es also asks
//! `instances.get` whether the instance is a confidential VM ([`ConfidentialCompute`]), and
//! reads the platform Google's firmware measured from the event log ([`platform`]).
//!
//! The verifier holds no cloud credential, so it asks through a [`GceIdentity`]: in the
//! service, attest-proxy's cache in front of the `gce-identity` process. What that source
//! cannot answer now is [`GceKeyError::Unavailable`] (the node retries); an instance the API
//! does not know is [`GceKeyError::NotFound`] (the node is refused).

pub mod platform;

use std::collections::HashMap;
use std::fmt;

use serde::Deserialize;
use x509_parser::prelude::FromDer as _;
use x509_parser::public_key::PublicKey as ParsedKey;
use x509_parser::x509::SubjectPublicKeyInfo;

/// go-tpm-tools' `attest.GCEInstanceInfo`, as `encoding/json` writes the protobuf struct
/// (snake_case names, `omitempty`): gcp-sev-es's whole InstanceInfo, and the `GCP` field of
/// gcp-sev-snp's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct GceInstance {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub zone: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub project_id: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub project_number: u64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub instance_name: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub instance_id: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The largest gcp-sev-es InstanceInfo accepted: three names of at most 63 characters (a
/// domain-scoped project ID somewhat more) and two numbers.
pub const MAX_GCE_INSTANCE_INFO: usize = 1024;

impl GceInstance {
    /// gcp-sev-es's InstanceInfo: `{"zone", "project_id", "instance_name"}` as Constellation's
    /// issuer writes it (the numbers, when present, are read and not used).
    pub fn parse(bytes: &[u8]) -> Result<GceInstance, String> {
        if bytes.len() > MAX_GCE_INSTANCE_INFO {
            return Err(format!(
                "InstanceInfo of {} bytes, more than the limit of {MAX_GCE_INSTANCE_INFO}",
                bytes.len()
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| {
            format!(
                "InstanceInfo is not GCEInstanceInfo JSON (zone, project_id, instance_name): {e}"
            )
        })
    }

    /// The JSON Constellation's issuer writes (Go's `encoding/json` on go-tpm-tools' struct:
    /// fields in proto order, empty ones left out).
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What `instances.get` says about an instance's confidential computing:
/// `confidentialInstanceConfig.enableConfidentialCompute` and
/// `confidentialInstanceConfig.confidentialInstanceType`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConfidentialCompute {
    /// `enableConfidentialCompute`; false when the field or the whole config is absent.
    pub enabled: bool,
    /// `confidentialInstanceType` (`SEV`, `SEV_SNP`, `TDX`, ...); empty when absent.
    pub instance_type: String,
}

impl ConfidentialCompute {
    /// Reads an `instances.get` answer (the whole instance resource, or the part
    /// `?fields=confidentialInstanceConfig` leaves). Only its JSON shape is checked here.
    pub fn from_instance_json(body: &[u8]) -> Result<ConfidentialCompute, String> {
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Instance {
            #[serde(default)]
            confidential_instance_config: Option<Config>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Config {
            #[serde(default)]
            enable_confidential_compute: bool,
            #[serde(default)]
            confidential_instance_type: String,
        }
        let instance: Instance = serde_json::from_slice(body)
            .map_err(|e| format!("the answer is not a compute#instance: {e}"))?;
        Ok(instance
            .confidential_instance_config
            .map(|c| ConfidentialCompute {
                enabled: c.enable_confidential_compute,
                instance_type: c.confidential_instance_type.chars().take(40).collect(),
            })
            .unwrap_or_default())
    }

    /// Whether this is an AMD SEV confidential VM, which gcp-sev-es attests: confidential
    /// compute enabled with no type named or `SEV` (Google's API has no type of its own for
    /// SEV-ES machines; an SEV-SNP or TDX instance attests as its own variant). `Err` says why
    /// not.
    pub fn check_sev(&self) -> Result<(), String> {
        match (self.enabled, self.instance_type.as_str()) {
            (true, "" | "SEV" | "CONFIDENTIAL_INSTANCE_TYPE_UNSPECIFIED") => Ok(()),
            (false, "" | "CONFIDENTIAL_INSTANCE_TYPE_UNSPECIFIED") => Err(
                "the GCE API says the instance is not a confidential VM (confidentialInstanceConfig.enableConfidentialCompute is not true)".to_owned(),
            ),
            (_, other) => Err(format!(
                "the GCE API says the instance is a {other} confidential VM, not an AMD SEV one"
            )),
        }
    }
}

impl fmt::Display for ConfidentialCompute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.instance_type.is_empty() {
            "no type"
        } else {
            &self.instance_type
        };
        write!(f, "enableConfidentialCompute {}, {kind}", self.enabled)
    }
}

/// Why no trusted key could be had for an instance.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum GceKeyError {
    /// The GCE API does not know the instance (HTTP 404): the document names a machine that
    /// does not exist in that project and zone.
    #[error("the GCE API knows no instance {0}")]
    NotFound(String),
    /// The GCE API could not be asked or did not answer (403, 429, 5xx, a timeout, the
    /// gce-identity process down); nothing is wrong with the node's evidence.
    #[error("the GCE API cannot be asked now: {0}")]
    Unavailable(String),
}

/// Where the verifier gets the attestation key GCE vouches for. Called on the verification
/// threads: implementations answer from a cache or wait a bounded time.
pub trait GceIdentity: Send + Sync + fmt::Debug {
    /// The DER SubjectPublicKeyInfo of the instance's vTPM signing key (the AK), as
    /// `getShieldedInstanceIdentity` returns it in `signingKey.ekPub`.
    fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError>;

    /// The instance's confidential-computing configuration, as `instances.get` returns it.
    fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<ConfidentialCompute, GceKeyError>;
}

/// The instance a document names, checked to be a well-formed GCE resource name, so it can be
/// put into an API path as it is.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InstanceRef {
    pub project: String,
    pub zone: String,
    pub instance: String,
}

impl fmt::Display for InstanceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "projects/{}/zones/{}/instances/{}",
            self.project, self.zone, self.instance
        )
    }
}

/// Why a GCEInstanceInfo (gcp-sev-snp's `GCP` field, gcp-sev-es's whole InstanceInfo) does not
/// name an instance.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
#[error("the InstanceInfo's GCE instance {field} {value:?} is not a GCE {what}")]
pub struct InstanceRefError {
    pub field: &'static str,
    pub value: String,
    pub what: &'static str,
}

impl InstanceRef {
    /// The instance a GCEInstanceInfo names (`project_id`, `zone`, `instance_name`; the numbers
    /// are not used, as by Constellation), each checked against GCE's naming rules: project IDs are
    /// 6–30 of `[a-z0-9-]` (with an optional `domain.example:` prefix for domain-scoped
    /// projects), zones and instance names RFC 1035 labels of at most 63 characters.
    pub fn from_instance_info(gce: &GceInstance) -> Result<InstanceRef, InstanceRefError> {
        let label = |field: &'static str, value: &str, what: &'static str| {
            let ok = !value.is_empty()
                && value.len() <= 63
                && value.starts_with(|c: char| c.is_ascii_lowercase())
                && !value.ends_with('-')
                && value
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if ok {
                Ok(value.to_owned())
            } else {
                Err(InstanceRefError {
                    field,
                    value: value.chars().take(80).collect(),
                    what,
                })
            }
        };
        let project = check_project_id(&gce.project_id).map_err(|_| InstanceRefError {
            field: "project_id",
            value: gce.project_id.chars().take(80).collect(),
            what: "project ID",
        })?;
        Ok(InstanceRef {
            project,
            zone: label("zone", &gce.zone, "zone name")?,
            instance: label("instance_name", &gce.instance_name, "instance name")?,
        })
    }
}

/// `id` if it is a GCE project ID: 6–30 of `[a-z0-9-]`, starting with a letter and not ending
/// with `-`, with an optional `domain.example:` prefix for domain-scoped projects.
fn check_project_id(id: &str) -> Result<String, ()> {
    let (domain, bare) = match id.rsplit_once(':') {
        Some((domain, bare)) => (Some(domain), bare),
        None => (None, id),
    };
    let domain_ok = domain.is_none_or(|d| {
        !d.is_empty()
            && d.len() <= 63
            && d.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "-.".contains(c))
    });
    let bare_ok = (6..=30).contains(&bare.len())
        && bare.starts_with(|c: char| c.is_ascii_lowercase())
        && !bare.ends_with('-')
        && bare
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if domain_ok && bare_ok {
        Ok(id.to_owned())
    } else {
        Err(())
    }
}

/// The GCP variants' setting beyond Constellation: `allowedGcpProjects`, the GCP projects whose
/// instances may join. Without it any project's instance may (as with Constellation): the GCE
/// API vouches for an attestation key of an instance in whatever project the document names,
/// including one of the attacker's own.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcpProjects(Option<std::collections::BTreeSet<String>>);

/// Why `allowedGcpProjects` could not be read.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum GcpProjectsError {
    #[error("attestation config: allowedGcpProjects: {0}")]
    Json(String),
    #[error("attestation config: allowedGcpProjects entry {0:?} is not a GCP project ID")]
    BadProject(String),
    #[error(
        "attestation config: allowedGcpProjects is empty, which would admit no node; name the cluster's projects, or remove it to admit any project"
    )]
    Empty,
    #[error(
        "attestation config: allowedGcpProjects applies to gcp-sev-snp and gcp-sev-es only; {0} names no GCP project"
    )]
    NotGcp(&'static str),
}

impl GcpProjects {
    /// Reads `allowedGcpProjects` from a whole attestation config.
    pub fn from_attestation_config(json: &[u8]) -> Result<GcpProjects, GcpProjectsError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Raw {
            allowed_gcp_projects: Option<Vec<String>>,
        }
        let raw: Raw =
            serde_json::from_slice(json).map_err(|e| GcpProjectsError::Json(e.to_string()))?;
        let Some(projects) = raw.allowed_gcp_projects else {
            return Ok(GcpProjects(None));
        };
        if projects.is_empty() {
            return Err(GcpProjectsError::Empty);
        }
        projects
            .iter()
            .map(|p| {
                check_project_id(p)
                    .map_err(|()| GcpProjectsError::BadProject(p.chars().take(80).collect()))
            })
            .collect::<Result<_, _>>()
            .map(|set| GcpProjects(Some(set)))
    }

    /// Only instances of `projects`.
    pub fn only<I: IntoIterator<Item = S>, S: Into<String>>(projects: I) -> GcpProjects {
        GcpProjects(Some(projects.into_iter().map(Into::into).collect()))
    }

    /// Whether any project is allowed (the setting is absent).
    pub fn is_any(&self) -> bool {
        self.0.is_none()
    }

    /// Whether an instance of `project` may join.
    pub fn admits(&self, project: &str) -> bool {
        self.0.as_ref().is_none_or(|set| set.contains(project))
    }

    /// The line this setting adds to the policy digest (none when absent).
    pub fn canonical(&self) -> String {
        match &self.0 {
            None => String::new(),
            Some(set) => format!(
                "gcp:projects:{}\n",
                set.iter().cloned().collect::<Vec<_>>().join(",")
            ),
        }
    }
}

/// The key material of a DER SubjectPublicKeyInfo, for an exact comparison: an RSA key's
/// modulus and exponent without leading zeros, or an EC key's curve and point.
#[derive(Debug, PartialEq, Eq)]
enum KeyMaterial {
    Rsa { modulus: Vec<u8>, exponent: Vec<u8> },
    Ec { curve: String, point: Vec<u8> },
}

fn strip(bytes: &[u8]) -> Vec<u8> {
    let first = bytes.iter().position(|&b| b != 0).unwrap_or(bytes.len());
    bytes[first..].to_vec()
}

fn key_material(spki_der: &[u8]) -> Result<KeyMaterial, String> {
    let (rest, spki) = SubjectPublicKeyInfo::from_der(spki_der)
        .map_err(|e| format!("not a DER SubjectPublicKeyInfo: {e}"))?;
    if !rest.is_empty() {
        return Err(format!(
            "{} bytes after the SubjectPublicKeyInfo",
            rest.len()
        ));
    }
    match spki
        .parsed()
        .map_err(|e| format!("unreadable public key: {e}"))?
    {
        ParsedKey::RSA(rsa) => Ok(KeyMaterial::Rsa {
            modulus: strip(rsa.modulus),
            exponent: strip(rsa.exponent),
        }),
        ParsedKey::EC(point) => {
            let curve = spki
                .algorithm
                .parameters
                .as_ref()
                .and_then(|p| p.as_oid().ok())
                .map(|oid| oid.to_id_string())
                .ok_or("an EC key without a named curve")?;
            Ok(KeyMaterial::Ec {
                curve,
                point: point.data().to_vec(),
            })
        }
        _ => Err("neither an RSA nor an EC key".to_owned()),
    }
}

/// Whether two DER SubjectPublicKeyInfos hold the same key (an error names which one is not a
/// key this comparison reads).
pub fn same_key(vouched: &[u8], ak: &[u8]) -> Result<bool, String> {
    let vouched = key_material(vouched).map_err(|e| format!("the GCE API's key: {e}"))?;
    let ak = key_material(ak).map_err(|e| format!("the attestation key: {e}"))?;
    Ok(vouched == ak)
}

/// `signingKey.ekPub` of a `getShieldedInstanceIdentity` answer: one PEM `PUBLIC KEY` block,
/// returned as DER.
pub fn spki_from_pem(pem: &str) -> Result<Vec<u8>, String> {
    use rustls_pki_types::SubjectPublicKeyInfoDer;
    use rustls_pki_types::pem::PemObject as _;
    let der = SubjectPublicKeyInfoDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| format!("signingKey.ekPub is not a PEM PUBLIC KEY: {e}"))?;
    key_material(&der).map_err(|e| format!("signingKey.ekPub: {e}"))?;
    Ok(der.to_vec())
}

/// The DER SubjectPublicKeyInfo of `signingKey.ekPub` in a `getShieldedInstanceIdentity`
/// answer (its JSON body).
pub fn signing_key_from_identity_json(body: &[u8]) -> Result<Vec<u8>, String> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Identity {
        signing_key: Option<Entry>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Entry {
        ek_pub: Option<String>,
    }
    let answer: Identity = serde_json::from_slice(body)
        .map_err(|e| format!("the answer is not a shieldedInstanceIdentity: {e}"))?;
    let pem = answer
        .signing_key
        .and_then(|k| k.ek_pub)
        .ok_or_else(|| "no signingKey.ekPub".to_owned())?;
    spki_from_pem(&pem)
}

/// Answers given up front (tests, offline verification): instance → SPKI DER, and instance →
/// confidential-computing configuration.
#[derive(Clone, Debug, Default)]
pub struct StaticGceIdentity {
    keys: HashMap<InstanceRef, Vec<u8>>,
    confidential: HashMap<InstanceRef, ConfidentialCompute>,
    unavailable: Option<String>,
}

impl StaticGceIdentity {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_key(mut self, instance: InstanceRef, spki_der: Vec<u8>) -> Self {
        self.keys.insert(instance, spki_der);
        self
    }

    /// What `instances.get` answers for `instance`.
    pub fn with_confidential_compute(
        mut self,
        instance: InstanceRef,
        config: ConfidentialCompute,
    ) -> Self {
        self.confidential.insert(instance, config);
        self
    }

    /// Every lookup fails as if the API could not be reached.
    pub fn unavailable(mut self, reason: &str) -> Self {
        self.unavailable = Some(reason.to_owned());
        self
    }
}

impl GceIdentity for StaticGceIdentity {
    fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError> {
        if let Some(reason) = &self.unavailable {
            return Err(GceKeyError::Unavailable(reason.clone()));
        }
        self.keys
            .get(instance)
            .cloned()
            .ok_or_else(|| GceKeyError::NotFound(instance.to_string()))
    }

    fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<ConfidentialCompute, GceKeyError> {
        if let Some(reason) = &self.unavailable {
            return Err(GceKeyError::Unavailable(reason.clone()));
        }
        self.confidential
            .get(instance)
            .cloned()
            .ok_or_else(|| GceKeyError::NotFound(instance.to_string()))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn gce(project: &str, zone: &str, name: &str) -> GceInstance {
        GceInstance {
            zone: zone.to_owned(),
            project_id: project.to_owned(),
            instance_name: name.to_owned(),
            ..GceInstance::default()
        }
    }

    #[test]
    fn instance_names_follow_gce_rules() {
        let ok = InstanceRef::from_instance_info(&gce(
            "constellation-331613",
            "europe-west3-b",
            "worker-7",
        ))
        .unwrap();
        assert_eq!(
            ok.to_string(),
            "projects/constellation-331613/zones/europe-west3-b/instances/worker-7"
        );
        assert!(
            InstanceRef::from_instance_info(&gce("example.com:my-project", "us-east1-b", "w"))
                .is_ok()
        );
        for (project, zone, name, field) in [
            ("", "us-east1-b", "w", "project_id"),
            ("short", "us-east1-b", "w", "project_id"),
            ("proj-123/../x", "us-east1-b", "w", "project_id"),
            ("my-project", "", "w", "zone"),
            ("my-project", "us-east1-b/x", "w", "zone"),
            ("my-project", "us-east1-b", "", "instance_name"),
            ("my-project", "us-east1-b", "Worker", "instance_name"),
            ("my-project", "us-east1-b", "w?x=1", "instance_name"),
            ("my-project", "us-east1-b", "worker-", "instance_name"),
            ("my-project", "us-east1-b", &"w".repeat(64), "instance_name"),
        ] {
            let err = InstanceRef::from_instance_info(&gce(project, zone, name)).unwrap_err();
            assert_eq!(err.field, field, "{project} {zone} {name}: {err}");
        }
    }

    #[test]
    fn confidential_config_reads_as_instances_get_writes_it() {
        let read = |json: &str| ConfidentialCompute::from_instance_json(json.as_bytes());
        let sev =
            read(r#"{"confidentialInstanceConfig":{"enableConfidentialCompute":true}}"#).unwrap();
        assert_eq!(sev.check_sev(), Ok(()));
        let typed = read(
            r#"{"kind":"compute#instance","confidentialInstanceConfig":{"enableConfidentialCompute":true,"confidentialInstanceType":"SEV"}}"#,
        )
        .unwrap();
        assert_eq!(typed.instance_type, "SEV");
        assert_eq!(typed.check_sev(), Ok(()));
        for (json, needle) in [
            ("{}", "not a confidential VM"),
            (
                r#"{"confidentialInstanceConfig":{"enableConfidentialCompute":false}}"#,
                "not a confidential VM",
            ),
            (
                r#"{"confidentialInstanceConfig":{"confidentialInstanceType":"SEV_SNP"}}"#,
                "SEV_SNP confidential VM",
            ),
            (
                r#"{"confidentialInstanceConfig":{"enableConfidentialCompute":true,"confidentialInstanceType":"TDX"}}"#,
                "TDX confidential VM",
            ),
        ] {
            let err = read(json).unwrap().check_sev().unwrap_err();
            assert!(err.contains(needle), "{json}: {err}");
        }
        assert!(read("42").is_err());
        assert!(
            read(r#"{"confidentialInstanceConfig":{"enableConfidentialCompute":"yes"}}"#).is_err()
        );
    }

    #[test]
    fn keys_compare_by_their_material() {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let p256 = |_: ()| {
            let pkcs8 = aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                &rng,
            )
            .unwrap();
            let key = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
                &aws_lc_rs::signature::ECDSA_P256_SHA256_ASN1_SIGNING,
                pkcs8.as_ref(),
            )
            .unwrap();
            use aws_lc_rs::signature::KeyPair as _;
            let point = key.public_key().as_ref().to_vec();
            let mut spki =
                hex::decode("3059301306072a8648ce3d020106082a8648ce3d030107034200").unwrap();
            spki.extend_from_slice(&point);
            spki
        };
        let a = p256(());
        let b = p256(());
        assert!(same_key(&a, &a).unwrap());
        assert!(!same_key(&a, &b).unwrap());
        assert!(
            same_key(b"junk", &a)
                .unwrap_err()
                .contains("the GCE API's key")
        );
        let mut trailing = a.clone();
        trailing.push(0);
        assert!(same_key(&a, &trailing).unwrap_err().contains("after"));
    }

    #[test]
    fn ek_pub_pem_is_read_as_one_public_key() {
        let spki = hex::decode(
            "3059301306072a8648ce3d020106082a8648ce3d03010703420004\
             6b17d1f2e12c4247f8bce6e563a440f277037d812deb33a0f4a13945d898c296\
             4fe342e2fe1a7f9b8ee7eb4a7c0f9e162bce33576b315ececbb6406837bf51f5",
        )
        .unwrap();
        use base64::Engine as _;
        let pem = format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            base64::engine::general_purpose::STANDARD.encode(&spki)
        );
        assert_eq!(spki_from_pem(&pem).unwrap(), spki);
        let cert = pem.replace("PUBLIC KEY", "CERTIFICATE");
        assert!(
            spki_from_pem(&cert)
                .unwrap_err()
                .contains("not a PEM PUBLIC KEY")
        );
        assert!(spki_from_pem("").is_err());
    }
}
