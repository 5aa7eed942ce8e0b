//! The keys a joining node makes: the kubelet's key and CSR, and the SSH host key.

use std::net::IpAddr;

use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair as _};
use base64::Engine;
use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair, SanType};
use ssh_key::private::{Ed25519Keypair, Ed25519PrivateKey, KeypairData};
use ssh_key::public::Ed25519PublicKey;
use ssh_key::{LineEnding, PrivateKey};
use zeroize::Zeroizing;

/// Why key material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Generating or encoding the kubelet key or CSR failed.
    #[error("cannot make the kubelet certificate request")]
    Csr(#[source] rcgen::Error),
    /// Generating the SSH host key failed.
    #[error("cannot generate the SSH host key")]
    Ssh,
    /// The SSH host key is not an Ed25519 PKCS#8 document this crate wrote.
    #[error("the SSH host key is not an Ed25519 PKCS#8 key")]
    SshPkcs8,
    /// Encoding the SSH host key in OpenSSH's format failed.
    #[error("cannot encode the SSH host key for OpenSSH")]
    SshEncode(#[source] ssh_key::Error),
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

/// The fixed start of an Ed25519 PKCS#8 v2 document (RFC 8410 OneAsymmetricKey, the form
/// aws-lc-rs reads and writes): SEQUENCE, version 1, the Ed25519 algorithm identifier, then the
/// 32-byte seed as an OCTET STRING inside an OCTET STRING.
const PKCS8_V2_PREFIX: [u8; 16] = [
    0x30, 0x51, 0x02, 0x01, 0x01, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20,
];
/// What follows the seed: the `[1]` (implicit BIT STRING) public key, 32 bytes, no unused bits.
const PKCS8_V2_PUBLIC_KEY_TAG: [u8; 3] = [0x81, 0x21, 0x00];
const ED25519_SEED_LEN: usize = 32;

/// An Ed25519 SSH host key.
#[derive(Debug)]
pub struct SshHostKey {
    /// PKCS#8 (v2, RFC 8410) DER of the private key.
    pub pkcs8: Vec<u8>,
    /// The public key in SSH wire format (`string "ssh-ed25519"`, `string key`), as
    /// `IssueJoinTicketRequest.host_public_key` carries it.
    pub public_wire: Vec<u8>,
}

impl SshHostKey {
    /// A fresh host key.
    pub fn generate() -> Result<Self, KeyError> {
        let rng = aws_lc_rs::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Ssh)?;
        let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).map_err(|_| KeyError::Ssh)?;
        let mut public_wire = Vec::new();
        put_ssh_string(&mut public_wire, b"ssh-ed25519");
        put_ssh_string(&mut public_wire, pair.public_key().as_ref());
        Ok(Self {
            pkcs8: pkcs8.as_ref().to_vec(),
            public_wire,
        })
    }

    /// The private key in OpenSSH's format (`-----BEGIN OPENSSH PRIVATE KEY-----`), what
    /// sshd's `HostKey` reads.
    pub fn openssh_private_key(&self) -> Result<Zeroizing<String>, KeyError> {
        openssh_private_key(&self.pkcs8)
    }

    /// The public key as an OpenSSH `authorized_keys` / `.pub` line.
    pub fn public_line(&self) -> String {
        format!(
            "ssh-ed25519 {}",
            base64::engine::general_purpose::STANDARD.encode(&self.public_wire)
        )
    }
}

/// An Ed25519 private key given as PKCS#8 v2 (what [`SshHostKey::generate`] makes) in
/// OpenSSH's private key format, unencrypted, for sshd.
pub fn openssh_private_key(pkcs8: &[u8]) -> Result<Zeroizing<String>, KeyError> {
    // aws-lc-rs checks the document and that its public key belongs to its seed; the seed then sits
    // at a fixed offset, since the v2 layout for Ed25519 has no variable-length parts.
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8).map_err(|_| KeyError::SshPkcs8)?;
    let seed_end = PKCS8_V2_PREFIX.len() + ED25519_SEED_LEN;
    let (Some(prefix), Some(seed), Some(tag)) = (
        pkcs8.get(..PKCS8_V2_PREFIX.len()),
        pkcs8.get(PKCS8_V2_PREFIX.len()..seed_end),
        pkcs8.get(seed_end..seed_end + PKCS8_V2_PUBLIC_KEY_TAG.len()),
    ) else {
        return Err(KeyError::SshPkcs8);
    };
    if prefix != PKCS8_V2_PREFIX || tag != PKCS8_V2_PUBLIC_KEY_TAG {
        return Err(KeyError::SshPkcs8);
    }
    let seed: Zeroizing<[u8; ED25519_SEED_LEN]> =
        Zeroizing::new(seed.try_into().map_err(|_| KeyError::SshPkcs8)?);
    let public: [u8; 32] = pair
        .public_key()
        .as_ref()
        .try_into()
        .map_err(|_| KeyError::SshPkcs8)?;
    let keypair = Ed25519Keypair {
        public: Ed25519PublicKey(public),
        private: Ed25519PrivateKey::from_bytes(&seed),
    };
    PrivateKey::new(KeypairData::Ed25519(keypair), "")
        .and_then(|key| key.to_openssh(LineEnding::LF))
        .map_err(KeyError::SshEncode)
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

    #[test]
    fn openssh_private_key_holds_the_same_key() {
        let key = SshHostKey::generate().unwrap();
        let pem = key.openssh_private_key().unwrap();
        assert!(pem.starts_with("-----BEGIN OPENSSH PRIVATE KEY-----\n"));
        let parsed = PrivateKey::from_openssh(pem.as_bytes()).unwrap();
        assert_eq!(
            parsed.public_key().to_bytes().unwrap(),
            key.public_wire,
            "the private key file's public half is the key sent to the join service"
        );
        // The seed went through unchanged: aws-lc-rs makes the same public key from it.
        let seed = parsed.key_data().ed25519().unwrap().private.to_bytes();
        let pair = Ed25519KeyPair::from_seed_unchecked(&seed).unwrap();
        assert_eq!(&key.public_wire[19..], pair.public_key().as_ref());

        assert!(matches!(
            openssh_private_key(b"not pkcs8"),
            Err(KeyError::SshPkcs8)
        ));
    }
}
