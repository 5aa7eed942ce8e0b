//! Join ticket logic: disk keys from the KMS, Kubernetes credentials from token-issuer.
