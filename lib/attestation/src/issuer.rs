//! What RFC 5280 (6.1.4 (k), (n); 6.3.3 (f)) asks of a certificate that signs: a certificate
//! signer is a CA (BasicConstraints CA:TRUE) whose KeyUsage has keyCertSign; a CRL signer's
//! KeyUsage has cRLSign. Shared by the AMD chains ([`crate::snp`]) and the parts of Intel's
//! chains this crate walks itself ([`crate::tdx`]); each names the certificate in its own error.
//! A missing extension is refused: every AMD and Intel CA carries both.

use x509_parser::certificate::X509Certificate;
use x509_parser::x509::X509Name;

/// What an issuing certificate is used for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Usage {
    /// Signing certificates: BasicConstraints CA:TRUE and KeyUsage keyCertSign.
    Certificates,
    /// Signing CRLs: KeyUsage cRLSign.
    Crls,
}

/// Why `cert` may not sign for `usage`, if it may not.
pub fn may_sign(cert: &X509Certificate<'_>, usage: Usage) -> Result<(), String> {
    if usage == Usage::Certificates {
        let constraints = cert
            .basic_constraints()
            .map_err(|e| format!("has unreadable BasicConstraints: {e}"))?;
        if !constraints.is_some_and(|c| c.value.ca) {
            return Err(
                "is not a CA (no BasicConstraints CA:TRUE), so it may not sign certificates"
                    .to_owned(),
            );
        }
    }
    let key_usage = cert
        .key_usage()
        .map_err(|e| format!("has an unreadable KeyUsage: {e}"))?;
    let (allowed, bit, what) = match usage {
        Usage::Certificates => (
            key_usage.is_some_and(|k| k.value.key_cert_sign()),
            "keyCertSign",
            "certificates",
        ),
        Usage::Crls => (
            key_usage.is_some_and(|k| k.value.crl_sign()),
            "cRLSign",
            "CRLs",
        ),
    };
    if !allowed {
        return Err(format!("has no KeyUsage {bit}, so it may not sign {what}"));
    }
    Ok(())
}

/// The first common name of `name` (a subject or an issuer), empty if it has none: how the
/// vendors' certificates and CRLs are named in checks and errors.
pub fn common_name<'a>(name: &'a X509Name<'_>) -> &'a str {
    name.iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
}
