//! The emergency SSH certificate authority: a host certificate for each joining node.
//!
//! Constellation gives every node an SSH host certificate so that an operator who has lost the
//! Kubernetes API can still reach nodes over SSH and know they are talking to a real node. The
//! CA is the Ed25519 key whose 32-byte seed the key service derives for the id
//! `ca_emergency_ssh`, so every join-core replica (and Constellation's own join service) signs
//! with the same CA without storing it. The ticket carries the CA's public key as an
//! `authorized_keys` line (`authorized_ca_public_key`) and the node's certificate as an OpenSSH
//! certificate line (`host_certificate`).
//!
//! Decisions, and why:
//!
//! - **Principals** are those the node asked for, then the API server's cert SANs from the
//!   kubeadm ClusterConfiguration ([`crate::kubeadm`]); when there are no SANs, the node's
//!   address as attest-proxy saw it instead. Duplicates are dropped, order is kept.
//! - **Requested principals are not checked against an allow-list**, as in Constellation: the
//!   node has just proved by attestation that it runs the cluster's measured image, and that
//!   image asks for its own interface addresses and hostname, which join-core has no source of
//!   truth for. They are bounded instead: at most [`MAX_REQUESTED_PRINCIPALS`], each 1 to
//!   [`MAX_PRINCIPAL_LEN`] printable ASCII characters without spaces or commas (OpenSSH's list
//!   separator), and without the pattern characters `*`, `?` and `!`, so no node can obtain a
//!   wildcard certificate that would vouch for every host. Anything else is refused with
//!   `InvalidArgument`, never silently dropped.
//! - **Host key types**: Ed25519 (what Constellation nodes send) and ECDSA on NIST P-256,
//!   P-384 and P-521 (what stock OpenSSH hosts also carry). RSA, DSA, security-key and
//!   certificate keys are refused: Constellation never sends them, and RSA would need a modulus
//!   policy for no gain.
//! - **Validity**: from five minutes before issuance (the SSH client's clock may lag the
//!   control plane's) for a configurable lifetime, one year by default, like the kubelet
//!   certificate. A bounded lifetime, unlike Constellation's, means a leaked host key stops
//!   being vouched for; a node that lives longer re-joins after a reinstall anyway.
//! - **Key id** is the disk UUID (the node's identity in the join protocol, which sshd logs
//!   show); the **serial** is random, so one certificate can be revoked in a KRL.
//! - **Signing uses aws-lc-rs.** The `ssh-key` crate parses the node's untrusted host key, but its
//!   certificate builder re-verifies every signature in debug builds, which would need its
//!   second Ed25519 implementation (ed25519-dalek). The certificate's few fixed fields
//!   (PROTOCOL.certkeys) are therefore encoded here and signed with aws-lc-rs's Ed25519.

use std::net::IpAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{Ed25519KeyPair, KeyPair};
use base64::Engine;
use ssh_key::public::KeyData;
use ssh_key::{Algorithm, PublicKey};

use crate::error::{RequestError, SshError};

/// Most principals a node may ask for. Constellation nodes ask for their interface addresses
/// and hostname: a handful.
pub const MAX_REQUESTED_PRINCIPALS: usize = 64;
/// Longest principal: a DNS name is at most 253 characters.
pub const MAX_PRINCIPAL_LEN: usize = 255;
/// Largest host key accepted; an ECDSA P-521 key, the largest accepted type, is 172 bytes.
pub const MAX_HOST_KEY_LEN: usize = 1024;
/// Default lifetime of a host certificate.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 60 * 60);
/// How far before issuance a certificate is already valid.
const BACKDATE: Duration = Duration::from_secs(5 * 60);

/// OpenSSH's certificate type for host certificates (PROTOCOL.certkeys).
const SSH_CERT_TYPE_HOST: u32 = 2;
const ED25519: &str = "ssh-ed25519";

/// A node's SSH host public key, checked and ready to be certified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostKey {
    algorithm: Algorithm,
    /// The key's fields in SSH wire format without the leading algorithm name: exactly what a
    /// certificate carries after its nonce.
    fields: Vec<u8>,
}

impl HostKey {
    /// Parses `host_public_key` (SSH wire format) and refuses types join-core does not certify.
    pub fn parse(wire: &[u8]) -> Result<Self, RequestError> {
        let refuse = |reason: String| Err(RequestError::HostPublicKey { reason });
        if wire.is_empty() {
            return refuse("empty".into());
        }
        if wire.len() > MAX_HOST_KEY_LEN {
            return refuse(format!(
                "{} bytes long; at most {MAX_HOST_KEY_LEN} allowed",
                wire.len()
            ));
        }
        let key = match PublicKey::from_bytes(wire) {
            Ok(key) => key,
            Err(error) => return refuse(format!("not an SSH public key in wire format ({error})")),
        };
        match key.key_data() {
            KeyData::Ed25519(_) | KeyData::Ecdsa(_) => {}
            _ => {
                return refuse(format!(
                    "key type {} is not certified; send ssh-ed25519 or ecdsa-sha2-nistp256/384/521",
                    key.algorithm()
                ));
            }
        }
        // Re-encoded by the parser, so the certificate carries a canonical key whatever the
        // node sent; the leading algorithm name is dropped (the certificate names its own type).
        let canonical = key.to_bytes().map_err(|e| RequestError::HostPublicKey {
            reason: format!("cannot be re-encoded ({e})"),
        })?;
        let fields = skip_string(&canonical)
            .ok_or_else(|| RequestError::HostPublicKey {
                reason: "cannot be re-encoded".into(),
            })?
            .to_vec();
        Ok(Self {
            algorithm: key.algorithm(),
            fields,
        })
    }

    /// The certificate type for this key, e.g. `ssh-ed25519-cert-v01@openssh.com`.
    pub fn certificate_type(&self) -> String {
        self.algorithm.to_certificate_type()
    }
}

/// The bytes after the first SSH string of `wire`, or `None` if `wire` does not start with one.
fn skip_string(wire: &[u8]) -> Option<&[u8]> {
    let len = u32::from_be_bytes(wire.get(..4)?.try_into().ok()?);
    wire.get(4usize.checked_add(usize::try_from(len).ok()?)?..)
}

/// Whether `principal` can be written into a certificate at all: what join-core requires of
/// the SANs it reads from the ClusterConfiguration too. Returns the reason if not.
pub fn check_principal_syntax(principal: &str) -> Result<(), String> {
    if principal.is_empty() {
        return Err("is empty".into());
    }
    if principal.len() > MAX_PRINCIPAL_LEN {
        return Err(format!(
            "is {} bytes long; at most {MAX_PRINCIPAL_LEN} allowed",
            principal.len()
        ));
    }
    if let Some(bad) = principal
        .chars()
        .find(|c| !c.is_ascii_graphic() || *c == ',')
    {
        return Err(format!(
            "contains {bad:?}; only printable ASCII without spaces or commas is allowed"
        ));
    }
    Ok(())
}

/// Checks the principals a node asked for; see the module docs for the rules.
pub fn check_requested_principals(requested: &[String]) -> Result<(), RequestError> {
    if requested.len() > MAX_REQUESTED_PRINCIPALS {
        return Err(RequestError::Principals {
            reason: format!(
                "{} principals; at most {MAX_REQUESTED_PRINCIPALS} allowed",
                requested.len()
            ),
        });
    }
    for (index, principal) in requested.iter().enumerate() {
        let reason = check_principal_syntax(principal).err().or_else(|| {
            principal
                .chars()
                .find(|c| matches!(c, '*' | '?' | '!'))
                .map(|c| format!("contains the pattern character {c:?}"))
        });
        if let Some(reason) = reason {
            // The principal itself is node input: shown escaped and cut short.
            let shown: String = principal.chars().take(64).collect();
            return Err(RequestError::Principals {
                reason: format!("principal {index} ({shown:?}) {reason}"),
            });
        }
    }
    Ok(())
}

/// The principals a node's host certificate is valid for: the requested ones, then the API
/// server's SANs, or the node's address when there are no SANs. First occurrence wins.
pub fn principals(requested: &[String], api_server_sans: &[String], peer: IpAddr) -> Vec<String> {
    let fallback = [peer.to_canonical().to_string()];
    let extra = if api_server_sans.is_empty() {
        &fallback[..]
    } else {
        api_server_sans
    };
    let mut all: Vec<String> = Vec::with_capacity(requested.len() + extra.len());
    for principal in requested.iter().chain(extra) {
        if !all.contains(principal) {
            all.push(principal.clone());
        }
    }
    all
}

/// The emergency SSH CA. Its public key's encodings are made once, with the key pair: every
/// certificate and every ticket carries them.
#[derive(Debug)]
pub struct SshCa {
    pair: Ed25519KeyPair,
    public_key_wire: Vec<u8>,
}

impl SshCa {
    /// The CA whose Ed25519 private key is `seed` (32 bytes from the key service).
    pub fn from_seed(seed: &[u8]) -> Result<Self, SshError> {
        let pair = Ed25519KeyPair::from_seed_unchecked(seed)
            .map_err(|_| SshError::CaSeed { len: seed.len() })?;
        let mut public_key_wire = Vec::with_capacity(51);
        put_string(&mut public_key_wire, ED25519.as_bytes());
        put_string(&mut public_key_wire, pair.public_key().as_ref());
        Ok(Self {
            pair,
            public_key_wire,
        })
    }

    /// The CA public key in SSH wire format.
    pub fn public_key_wire(&self) -> &[u8] {
        &self.public_key_wire
    }

    /// The CA public key as an `authorized_keys` / `known_hosts` key line, newline-terminated
    /// (as Go's `ssh.MarshalAuthorizedKey` writes it).
    pub fn authorized_key_line(&self) -> Vec<u8> {
        key_line(ED25519, &self.public_key_wire)
    }

    /// A host certificate for `host_key`, valid for `principals` from five minutes ago for
    /// `validity`, as a newline-terminated OpenSSH certificate line.
    ///
    /// `principals` must not be empty: an empty list would make the certificate valid for every
    /// host name.
    pub fn host_certificate(
        &self,
        host_key: &HostKey,
        principals: &[String],
        key_id: &str,
        validity: Duration,
    ) -> Result<Vec<u8>, SshError> {
        if principals.is_empty() {
            return Err(SshError::NoPrincipals);
        }
        let rng = SystemRandom::new();
        let mut nonce = [0u8; 32];
        let mut serial = [0u8; 8];
        rng.fill(&mut nonce).map_err(|_| SshError::Random)?;
        rng.fill(&mut serial).map_err(|_| SshError::Random)?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let valid_after = now.saturating_sub(BACKDATE).as_secs();
        let valid_before = now.saturating_add(validity).as_secs();

        let certificate_type = host_key.certificate_type();
        let mut cert = Vec::with_capacity(512);
        put_string(&mut cert, certificate_type.as_bytes());
        put_string(&mut cert, &nonce);
        cert.extend_from_slice(&host_key.fields);
        cert.extend_from_slice(&serial);
        cert.extend_from_slice(&SSH_CERT_TYPE_HOST.to_be_bytes());
        put_string(&mut cert, key_id.as_bytes());
        let mut list = Vec::new();
        for principal in principals {
            put_string(&mut list, principal.as_bytes());
        }
        put_string(&mut cert, &list);
        cert.extend_from_slice(&valid_after.to_be_bytes());
        cert.extend_from_slice(&valid_before.to_be_bytes());
        // Host certificates carry no critical options and no extensions; reserved is empty.
        put_string(&mut cert, b"");
        put_string(&mut cert, b"");
        put_string(&mut cert, b"");
        put_string(&mut cert, &self.public_key_wire);

        let signature = self.pair.sign(&cert);
        let mut signature_blob = Vec::with_capacity(83);
        put_string(&mut signature_blob, ED25519.as_bytes());
        put_string(&mut signature_blob, signature.as_ref());
        put_string(&mut cert, &signature_blob);
        Ok(key_line(&certificate_type, &cert))
    }
}

/// `<type> <base64 blob>\n`, the authorized_keys form of a key or certificate.
fn key_line(key_type: &str, blob: &[u8]) -> Vec<u8> {
    let mut line = format!(
        "{key_type} {}",
        base64::engine::general_purpose::STANDARD.encode(blob)
    )
    .into_bytes();
    line.push(b'\n');
    line
}

/// Appends an SSH `string`: a u32 length, then the bytes. Every caller passes fields bounded
/// far below 4 GiB (principals, keys and nonces are checked or fixed-size).
fn put_string(out: &mut Vec<u8>, bytes: &[u8]) {
    let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;
    use ssh_key::Certificate;
    use ssh_key::certificate::CertType;

    const SEED: [u8; 32] = [7; 32];

    fn ed25519_host_key() -> (Ed25519KeyPair, Vec<u8>) {
        let pair = Ed25519KeyPair::from_seed_unchecked(&[9; 32]).unwrap();
        let mut wire = Vec::new();
        put_string(&mut wire, b"ssh-ed25519");
        put_string(&mut wire, pair.public_key().as_ref());
        (pair, wire)
    }

    fn ecdsa_p256_host_key() -> Vec<u8> {
        let rng = SystemRandom::new();
        let pkcs8 = aws_lc_rs::signature::EcdsaKeyPair::generate_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            &rng,
        )
        .unwrap();
        let pair = aws_lc_rs::signature::EcdsaKeyPair::from_pkcs8(
            &aws_lc_rs::signature::ECDSA_P256_SHA256_FIXED_SIGNING,
            pkcs8.as_ref(),
        )
        .unwrap();
        let mut wire = Vec::new();
        put_string(&mut wire, b"ecdsa-sha2-nistp256");
        put_string(&mut wire, b"nistp256");
        put_string(&mut wire, pair.public_key().as_ref());
        wire
    }

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    #[test]
    fn certificate_parses_and_says_what_was_asked() {
        let ca = SshCa::from_seed(&SEED).unwrap();
        let (_, wire) = ed25519_host_key();
        let host_key = HostKey::parse(&wire).unwrap();
        let principals = strings(&["node-1", "10.0.0.7"]);
        let line = ca
            .host_certificate(&host_key, &principals, "disk-1", DEFAULT_VALIDITY)
            .unwrap();
        let text = String::from_utf8(line).unwrap();
        assert!(text.ends_with('\n'));
        assert!(text.starts_with("ssh-ed25519-cert-v01@openssh.com "));
        let cert = Certificate::from_openssh(&text).unwrap();
        assert_eq!(cert.cert_type(), CertType::Host);
        assert_eq!(cert.valid_principals(), &principals[..]);
        assert_eq!(cert.key_id(), "disk-1");
        assert_eq!(
            PublicKey::from(cert.public_key().clone())
                .to_bytes()
                .unwrap(),
            wire
        );
        assert_eq!(
            PublicKey::from(cert.signature_key().clone())
                .to_bytes()
                .unwrap(),
            ca.public_key_wire()
        );
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        assert!(cert.valid_after() <= now && cert.valid_after() + 301 >= now);
        assert_eq!(
            cert.valid_before() - cert.valid_after(),
            (DEFAULT_VALIDITY + BACKDATE).as_secs()
        );
        assert!(cert.critical_options().is_empty());
        assert!(cert.extensions().is_empty());

        let ca_line = String::from_utf8(ca.authorized_key_line()).unwrap();
        let ca_key = PublicKey::from_openssh(ca_line.trim_end()).unwrap();
        assert_eq!(ca_key.to_bytes().unwrap(), ca.public_key_wire());
    }

    #[test]
    fn ecdsa_host_keys_are_certified() {
        let ca = SshCa::from_seed(&SEED).unwrap();
        let wire = ecdsa_p256_host_key();
        let host_key = HostKey::parse(&wire).unwrap();
        let line = ca
            .host_certificate(&host_key, &strings(&["h"]), "d", DEFAULT_VALIDITY)
            .unwrap();
        let cert = Certificate::from_openssh(std::str::from_utf8(&line).unwrap()).unwrap();
        assert_eq!(
            cert.algorithm(),
            Algorithm::Ecdsa {
                curve: ssh_key::EcdsaCurve::NistP256
            }
        );
    }

    #[test]
    fn unsupported_or_malformed_host_keys_are_refused() {
        let (_, good) = ed25519_host_key();
        let mut trailing = good.clone();
        trailing.push(0);
        let mut rsa = Vec::new();
        put_string(&mut rsa, b"ssh-rsa");
        put_string(&mut rsa, &[1, 0, 1]);
        put_string(&mut rsa, &[0x00, 0xc1, 0x23, 0x45]);
        let mut dss = Vec::new();
        put_string(&mut dss, b"ssh-dss");
        for _ in 0..4 {
            put_string(&mut dss, &[1]);
        }
        let cases: [(&[u8], &str); 6] = [
            (&[], "empty"),
            (&good[..20], "wire format"),
            (&trailing, "wire format"),
            (&rsa, "ssh-rsa is not certified"),
            (&dss, "is not certified"),
            (&[0u8; MAX_HOST_KEY_LEN + 1], "at most"),
        ];
        for (wire, mentions) in cases {
            let error = HostKey::parse(wire).unwrap_err().to_string();
            assert!(
                error.contains(mentions),
                "{error:?} should mention {mentions:?}"
            );
        }
    }

    #[test]
    fn requested_principals_are_bounded() {
        check_requested_principals(&strings(&["node-1", "10.0.0.7", "fe80::1", "a_b.c"])).unwrap();
        check_requested_principals(&[]).unwrap();
        let too_long = "a".repeat(MAX_PRINCIPAL_LEN + 1);
        for bad in [
            "",
            "a b",
            "a,b",
            "*",
            "*.example.com",
            "host?",
            "!host",
            "ü",
            "a\n",
            &too_long,
        ] {
            assert!(
                check_requested_principals(&strings(&["ok", bad])).is_err(),
                "{bad:?}"
            );
        }
        let many = vec!["h".to_owned(); MAX_REQUESTED_PRINCIPALS + 1];
        assert!(check_requested_principals(&many).is_err());
    }

    #[test]
    fn principals_are_requested_then_sans_or_the_peer() {
        let peer: IpAddr = "192.0.2.7".parse().unwrap();
        assert_eq!(
            principals(
                &strings(&["n", "10.0.0.1"]),
                &strings(&["10.0.0.1", "api"]),
                peer
            ),
            strings(&["n", "10.0.0.1", "api"])
        );
        assert_eq!(
            principals(&strings(&["n"]), &[], peer),
            strings(&["n", "192.0.2.7"])
        );
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(principals(&[], &[], mapped), strings(&["192.0.2.7"]));
    }

    #[test]
    fn no_principals_no_certificate() {
        let ca = SshCa::from_seed(&SEED).unwrap();
        let (_, wire) = ed25519_host_key();
        let host_key = HostKey::parse(&wire).unwrap();
        assert!(matches!(
            ca.host_certificate(&host_key, &[], "d", DEFAULT_VALIDITY),
            Err(SshError::NoPrincipals)
        ));
        assert!(matches!(
            SshCa::from_seed(&[1; 31]),
            Err(SshError::CaSeed { len: 31 })
        ));
    }
}
