//! gRPC definitions for the join service.
//!
//! - [`join`]: the public join API nodes call through attest-proxy (Constellation's `join.API`).
//! - [`kms`]: the key service API join-core calls (Constellation's `kms.API`).
//! - [`tokenissuer`]: the internal API between join-core and token-issuer.
//! - [`gceidentity`]: the internal API between attest-proxy and gce-identity (gcp-sev-snp).
//! - [`ec2identity`]: the internal API between attest-proxy and ec2-identity (aws-nitro-tpm).
//! - [`certifier`]: the internal API between attest-proxy and the certifier (the service's own
//!   attestation).
//! - [`components`]: Kubernetes component descriptors carried in join tickets.
//!
//! Package names, message names and field numbers match Constellation's, so the wire bytes do too.

#![allow(missing_debug_implementations)]

/// Constellation's `components` package.
pub mod components {
    tonic::include_proto!("components");
}

/// Constellation's public join API, `package join`.
pub mod join {
    tonic::include_proto!("join");
}

/// Constellation's key service API, `package kms`.
pub mod kms {
    tonic::include_proto!("kms");
}

/// The internal join-core ↔ token-issuer API.
pub mod tokenissuer {
    // Nested as the package name is, so generated paths to other packages
    // (`super::super::components`) resolve.
    pub mod v1 {
        tonic::include_proto!("tokenissuer.v1");
    }
    pub use v1::*;
}

/// The internal attest-proxy ↔ gce-identity API.
pub mod gceidentity {
    pub mod v1 {
        tonic::include_proto!("gceidentity.v1");
    }
    pub use v1::*;
}

/// The internal attest-proxy ↔ ec2-identity API (aws-nitro-tpm).
pub mod ec2identity {
    pub mod v1 {
        tonic::include_proto!("ec2identity.v1");
    }
    pub use v1::*;
}

/// The internal attest-proxy ↔ certifier API.
pub mod certifier {
    pub mod v1 {
        tonic::include_proto!("certifier.v1");
    }
    pub use v1::*;
}

/// Full gRPC method paths of the public join API, as attest-proxy's allowlist names them.
pub const JOIN_API_METHODS: &[&str] = &["/join.API/IssueJoinTicket", "/join.API/IssueRejoinTicket"];
