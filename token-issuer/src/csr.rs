//! Validation of the node's kubelet CSR: the untrusted input, checked before anything else.
//!
//! The rules are the ones Kubernetes applies to kubelet client certificates and Constellation
//! applies in its join service: the signature must verify (the node holds the key), the subject
//! is exactly `O=system:nodes`, `CN=system:node:<node name>` with a valid object name, and only
//! IP subject alternative names are carried over.
//!
//! No DNS name is certified, not even one equal to the node name. The kubelet certificate is
//! also a serving certificate (server auth), signed by the cluster CA that every pod and
//! component trusts; a DNS SAN would let whoever holds it serve as that name, e.g.
//! `kubernetes.default.svc`, to all of them. The node name is no safer: it is the node's own
//! claim, and a valid node name may itself be `kubernetes.default.svc`. Constellation nodes ask
//! for IP SANs only, and the API server reaches kubelets by address; a CSR with any other SAN
//! is refused as a whole ([`CsrError::SanNotAllowed`]), so the node learns why rather than
//! getting a certificate that silently says less than it asked for.

use std::net::IpAddr;

use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::extensions::{GeneralName, ParsedExtension};
use x509_parser::prelude::FromDer;

/// Kubelet CSRs are a few hundred bytes; anything this large is not one.
pub const MAX_CSR_LEN: usize = 16 * 1024;

const NODE_CN_PREFIX: &str = "system:node:";
const NODES_ORG: &str = "system:nodes";

/// Why a CSR was refused. The messages go back to the caller as-is.
#[derive(Debug, thiserror::Error)]
pub enum CsrError {
    /// Empty request.
    #[error("certificate request is empty")]
    Empty,
    /// Larger than [`MAX_CSR_LEN`].
    #[error("certificate request is {0} bytes, more than the {MAX_CSR_LEN} allowed")]
    TooLarge(usize),
    /// Not a DER PKCS#10 request.
    #[error("certificate request is not a DER PKCS#10 request: {0}")]
    Parse(String),
    /// Bytes after the request.
    #[error("certificate request has {0} trailing bytes")]
    TrailingBytes(usize),
    /// The self-signature does not verify.
    #[error("certificate request signature does not verify")]
    Signature,
    /// A subject attribute is not a readable string.
    #[error("certificate request subject has an unreadable attribute")]
    SubjectEncoding,
    /// Organization is not exactly `system:nodes`.
    #[error("subject organization must be exactly [\"system:nodes\"], got {0:?}")]
    Organization(Vec<String>),
    /// Not exactly one common name.
    #[error("subject must have exactly one common name, got {0}")]
    CommonNameCount(usize),
    /// CN lacks the `system:node:` prefix.
    #[error("subject common name {0:?} does not start with \"system:node:\"")]
    CommonNamePrefix(String),
    /// The node name is not a valid Kubernetes object name.
    #[error(
        "node name {0:?} is not a valid Kubernetes name (DNS-1123 subdomain, at most 253 characters)"
    )]
    NodeName(String),
    /// A SAN other than an IP address: the cluster CA certifies kubelets by address only.
    #[error(
        "subject alternative name {0} is not allowed: kubelet certificates carry IP addresses only"
    )]
    SanNotAllowed(String),
    /// An IP SAN with a length other than 4 or 16.
    #[error("subject alternative name has a malformed IP address ({0} bytes)")]
    MalformedIp(usize),
    /// An extension request that does not parse.
    #[error("certificate request carries a malformed extension request")]
    MalformedExtension,
}

/// What a validated CSR asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeRequest {
    /// The node name (CN without `system:node:`).
    pub node_name: String,
    /// IP SANs, in request order.
    pub ips: Vec<IpAddr>,
    /// The requested key as DER SubjectPublicKeyInfo.
    pub public_key_der: Vec<u8>,
}

impl NodeRequest {
    /// The certificate subject common name.
    pub fn common_name(&self) -> String {
        format!("{NODE_CN_PREFIX}{}", self.node_name)
    }

    /// The certificate subject organization.
    pub fn organization(&self) -> &'static str {
        NODES_ORG
    }
}

/// Whether `s` is a DNS-1123 subdomain, the rule for Node object names.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            let b = label.as_bytes();
            matches!((b.first(), b.last()), (Some(f), Some(l)) if f.is_ascii_alphanumeric() && l.is_ascii_alphanumeric())
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// Parses and validates a DER CSR.
pub fn validate(der: &[u8]) -> Result<NodeRequest, CsrError> {
    if der.is_empty() {
        return Err(CsrError::Empty);
    }
    if der.len() > MAX_CSR_LEN {
        return Err(CsrError::TooLarge(der.len()));
    }
    let (rest, csr) =
        X509CertificationRequest::from_der(der).map_err(|e| CsrError::Parse(e.to_string()))?;
    if !rest.is_empty() {
        return Err(CsrError::TrailingBytes(rest.len()));
    }
    csr.verify_signature().map_err(|_| CsrError::Signature)?;

    let info = &csr.certification_request_info;
    let orgs = info
        .subject
        .iter_organization()
        .map(|a| a.as_str().map(str::to_owned))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CsrError::SubjectEncoding)?;
    if orgs != [NODES_ORG] {
        return Err(CsrError::Organization(orgs));
    }
    let cns = info
        .subject
        .iter_common_name()
        .map(|a| a.as_str())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| CsrError::SubjectEncoding)?;
    let [cn] = cns.as_slice() else {
        return Err(CsrError::CommonNameCount(cns.len()));
    };
    let node_name = cn
        .strip_prefix(NODE_CN_PREFIX)
        .ok_or_else(|| CsrError::CommonNamePrefix((*cn).to_owned()))?;
    if !is_dns1123_subdomain(node_name) {
        return Err(CsrError::NodeName(node_name.to_owned()));
    }

    let mut ips = Vec::new();
    if let Some(extensions) = csr.requested_extensions() {
        for ext in extensions {
            match ext {
                ParsedExtension::SubjectAlternativeName(san) => {
                    for name in &san.general_names {
                        match name {
                            GeneralName::IPAddress(bytes) => ips.push(ip(bytes)?),
                            other => return Err(CsrError::SanNotAllowed(san_text(other))),
                        }
                    }
                }
                ParsedExtension::ParseError { .. } => return Err(CsrError::MalformedExtension),
                // Key usages, basic constraints and the like are ours to choose, not the node's.
                _ => {}
            }
        }
    }
    Ok(NodeRequest {
        node_name: node_name.to_owned(),
        ips,
        public_key_der: info.subject_pki.raw.to_vec(),
    })
}

/// A refused SAN as OpenSSL prints it (`DNS:name`), its text escaped: it is untrusted and goes
/// into logs and the caller's error.
fn san_text(name: &GeneralName<'_>) -> String {
    match name {
        GeneralName::DNSName(s) => format!("DNS:{}", s.escape_debug()),
        GeneralName::URI(s) => format!("URI:{}", s.escape_debug()),
        GeneralName::RFC822Name(s) => format!("email:{}", s.escape_debug()),
        other => other.to_string().escape_debug().to_string(),
    }
}

fn ip(bytes: &[u8]) -> Result<IpAddr, CsrError> {
    if let Ok(v4) = <[u8; 4]>::try_from(bytes) {
        Ok(IpAddr::from(v4))
    } else if let Ok(v6) = <[u8; 16]>::try_from(bytes) {
        Ok(IpAddr::from(v6))
    } else {
        Err(CsrError::MalformedIp(bytes.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names() {
        assert!(is_dns1123_subdomain("worker-0"));
        assert!(is_dns1123_subdomain("ip-10-0-0-1.ec2.internal"));
        assert!(!is_dns1123_subdomain("Worker"));
        assert!(!is_dns1123_subdomain("a_b"));
        assert!(!is_dns1123_subdomain(""));
        assert!(!is_dns1123_subdomain(&"a".repeat(254)));
    }

    #[test]
    fn garbage_is_a_parse_error() {
        assert!(matches!(
            validate(b"\x30\x03\x02\x01\x00"),
            Err(CsrError::Parse(_))
        ));
        assert!(matches!(validate(&[]), Err(CsrError::Empty)));
        assert!(matches!(
            validate(&vec![0; MAX_CSR_LEN + 1]),
            Err(CsrError::TooLarge(_))
        ));
    }
}
