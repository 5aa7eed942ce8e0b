//! AMD's certificate revocation lists for one product, signed by that product's ARK (the only AMD
//! key with cRLSign): KDS `/vcek/v1/{product}/crl` for ASK-certified chains and
//! `/vlek/v1/{product}/crl` for ASVK-certified ones, the URLs the ASK's and the ASVK's CRL
//! distribution points name. The caller picks the list by the report's signing-key kind.
//!
//! x509-parser parses it and aws-lc-rs verifies its signature (once per CRL and ARK, see
//! [`crate::signature_memo::SignatureMemo`]); checked on every call here: the issuer is the ARK
//! the chain ends in and its KeyUsage has cRLSign, the signature is AMD's RSA-PSS, the list is current at the verification
//! time (thisUpdate ≤ time < nextUpdate + the staleness the caller allows, so a list past that is
//! refused rather than trusted), and
//! neither the intermediate (ASK or ASVK) nor the signer (VCEK or VLEK) is on it.
//!
//! AMD issues VCEKs and VLEKs with serial 0, which names no single key: a signer is looked up
//! only when its serial is not zero, so an entry for serial 0 cannot revoke every chip at once.
//! Revoking an intermediate revokes every signer under it.

use x509_parser::revocation_list::CertificateRevocationList;
use x509_parser::time::ASN1Time;

use super::SnpError;
use super::certs::{Cert, verify_pss};

/// A CRL, DER, parsed on demand.
#[derive(Clone, Debug)]
pub struct Crl {
    der: Vec<u8>,
}

fn parse(der: &[u8]) -> Result<CertificateRevocationList<'_>, SnpError> {
    match x509_parser::parse_x509_crl(der) {
        Ok(([], crl)) => Ok(crl),
        Ok((rest, _)) => Err(SnpError::Crl(format!("{} bytes after the CRL", rest.len()))),
        Err(e) => Err(SnpError::Crl(format!("not an X.509 CRL: {e}"))),
    }
}

impl Crl {
    pub fn from_der(der: Vec<u8>) -> Result<Crl, SnpError> {
        let crl = parse(&der)?;
        if crl.next_update().is_none() {
            return Err(SnpError::Crl("the CRL has no nextUpdate".to_owned()));
        }
        Ok(Crl { der })
    }

    pub fn der(&self) -> &[u8] {
        &self.der
    }

    fn parsed(&self) -> CertificateRevocationList<'_> {
        parse(&self.der).unwrap_or_else(|_| unreachable!("checked in Crl::from_der"))
    }

    /// When the list must be replaced (seconds since the epoch).
    pub fn next_update(&self) -> i64 {
        self.parsed()
            .next_update()
            .map(|t| t.timestamp())
            .unwrap_or(i64::MIN)
    }

    pub fn this_update(&self) -> i64 {
        self.parsed().last_update().timestamp()
    }

    /// Checks the list against `ark` at `at`, accepting it up to `max_stale` seconds past its
    /// `nextUpdate`, then that neither `intermediate` nor `signer` is revoked.
    pub fn check(
        &self,
        ark: &Cert,
        intermediate: &Cert,
        signer: &Cert,
        at: i64,
        max_stale: i64,
    ) -> Result<(), SnpError> {
        let crl = self.parsed();
        let ark_parsed = ark.parsed();
        if crl.issuer().as_raw() != ark_parsed.subject().as_raw() {
            return Err(SnpError::Crl(format!(
                "the CRL is issued by {}, not by {}",
                crl.issuer(),
                ark.common_name()
            )));
        }
        super::certs::issuer_may_sign(&ark_parsed, "CRL issuer", super::certs::Usage::Crls)
            .map_err(|e| SnpError::Crl(e.to_string()))?;
        // The signature depends on the two encodings alone: verified once per CRL and ARK.
        super::certs::SIGNATURES
            .check(&[&self.der], ark.der(), || {
                verify_pss(
                    &crl.signature_algorithm,
                    crl.tbs_cert_list.as_ref(),
                    crl.signature_value.data.as_ref(),
                    &ark_parsed,
                )
            })
            .map_err(|reason| SnpError::Crl(format!("its signature: {reason}")))?;
        let time = ASN1Time::from_timestamp(at)
            .map_err(|e| SnpError::Crl(format!("verification time {at}: {e}")))?;
        let next = crl.next_update().unwrap_or(time);
        let accepted_until = ASN1Time::from_timestamp(next.timestamp().saturating_add(max_stale))
            .map_err(|e| SnpError::Crl(format!("nextUpdate {next}: {e}")))?;
        if time < crl.last_update() || time >= accepted_until {
            return Err(SnpError::CrlNotCurrent {
                this_update: crl.last_update().to_string(),
                next_update: next.to_string(),
            });
        }
        let signer_serial = signer.parsed().raw_serial().to_vec();
        let named = signer_serial.iter().any(|&b| b != 0);
        let chain = if named {
            vec![intermediate, signer]
        } else {
            vec![intermediate]
        };
        for cert in chain {
            let parsed = cert.parsed();
            let serial = parsed.raw_serial();
            if crl
                .iter_revoked_certificates()
                .any(|r| r.raw_serial() == serial)
            {
                return Err(SnpError::Revoked {
                    which: cert.common_name().to_owned(),
                    serial: hex::encode(serial),
                });
            }
        }
        Ok(())
    }
}
