//! The keys a joining node makes: the kubelet's key and CSR, and the SSH host key.

use std::net::IpAddr;

use base64::Engine;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use ring::signature::KeyPair as _;

/// Why key material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Generating or encoding the kubelet key or CSR failed.
    #[error("cannot make the kubelet certificate request")]
    Csr(#[source] rcgen::Error),
    /// Generating the SSH host key failed.
    #[error("cannot generate the SSH host key")]
    Ssh,
}

/// The kubelet's private key and the CSR the cluster CA signs.
#[derive(Debug)]
pub struct KubeletRequest {
    /// PKCS#8 PEM of the kubelet's ECDSA P-256 key.
    pub key_pem: String,
    /// The CSR, DER, as `IssueJoinTicketRequest.certificate_request` carries it.
    pub csr_der: Vec<u8>,
}

/// A CSR for `node_name` in the form the kubelet makes: CN `system:node:<name>`, O
/// `system:nodes`, the node's IPs as SANs.
pub fn kubelet_request(node_name: &str, ips: &[IpAddr]) -> Result<KubeletRequest, KeyError> {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(KeyError::Csr)?;
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::OrganizationName, "system:nodes");
    subject.push(DnType::CommonName, format!("system:node:{node_name}"));
    params.distinguished_name = subject;
    params.subject_alt_names = ips.iter().map(|ip| SanType::IpAddress(*ip)).collect();
    let csr = params.serialize_request(&key).map_err(KeyError::Csr)?;
    Ok(KubeletRequest {
        key_pem: key.serialize_pem(),
        csr_der: csr.der().to_vec(),
    })
}

/// An Ed25519 SSH host key.
#[derive(Debug)]
pub struct SshHostKey {
    /// PKCS#8 DER of the private key.
    pub pkcs8: Vec<u8>,
    /// The public key in SSH wire format (`string "ssh-ed25519"`, `string key`), as
    /// `IssueJoinTicketRequest.host_public_key` carries it.
    pub public_wire: Vec<u8>,
}

impl SshHostKey {
    /// A fresh host key.
    pub fn generate() -> Result<Self, KeyError> {
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 =
            ring::signature::Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Ssh)?;
        let pair = ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref())
            .map_err(|_| KeyError::Ssh)?;
        let mut public_wire = Vec::new();
        put_ssh_string(&mut public_wire, b"ssh-ed25519");
        put_ssh_string(&mut public_wire, pair.public_key().as_ref());
        Ok(Self {
            pkcs8: pkcs8.as_ref().to_vec(),
            public_wire,
        })
    }

    /// The public key as an OpenSSH `authorized_keys` / `.pub` line.
    pub fn public_line(&self) -> String {
        format!(
            "ssh-ed25519 {}",
            base64::engine::general_purpose::STANDARD.encode(&self.public_wire)
        )
    }
}

fn put_ssh_string(out: &mut Vec<u8>, bytes: &[u8]) {
    // SSH strings are u32-length-prefixed; host key fields are far below 4 GiB.
    out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use x509_parser::prelude::*;

    #[test]
    fn csr_has_kubelet_subject_and_ips() {
        let ip: IpAddr = "10.9.8.7".parse().unwrap();
        let request = kubelet_request("worker-1", &[ip]).unwrap();
        let (_, csr) = X509CertificationRequest::from_der(&request.csr_der).unwrap();
        csr.verify_signature().unwrap();
        let subject = &csr.certification_request_info.subject;
        assert_eq!(
            subject.iter_common_name().next().unwrap().as_str().unwrap(),
            "system:node:worker-1"
        );
        assert_eq!(
            subject
                .iter_organization()
                .next()
                .unwrap()
                .as_str()
                .unwrap(),
            "system:nodes"
        );
    }

    #[test]
    fn ssh_key_wire_format() {
        let key = SshHostKey::generate().unwrap();
        assert_eq!(&key.public_wire[..4], &11u32.to_be_bytes());
        assert_eq!(&key.public_wire[4..15], b"ssh-ed25519");
        assert_eq!(&key.public_wire[15..19], &32u32.to_be_bytes());
        assert_eq!(key.public_wire.len(), 19 + 32);
        assert!(
            key.public_line()
                .starts_with("ssh-ed25519 AAAAC3NzaC1lZDI1NTE5")
        );
    }
}
