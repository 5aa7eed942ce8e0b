//! Attested TLS (aTLS): per-connection nonce in the CertificateRequest, attestation in the client certificate.
