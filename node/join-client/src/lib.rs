//! The node side of a join: what a Constellation node's bootstrapper does, as a library and a CLI.
//!
//! It dials the join service over aTLS, attesting with the node's TPM (qemu-vtpm), with the
//! TPM and the guest's SEV-SNP report (aws-sev-snp, `tpm_issuer::aws_sev_snp`), or with the TD's
//! quote alone (qemu-tdx, `tdx-issuer`), sends a kubelet CSR and an SSH host key, and writes the
//! ticket's parts where a node needs them. Operators can point it at a cluster to check that joins
//! work, or save the document a node attests with (`join-client attest`) to derive a policy from
//! it offline (`attest-tool policy --document`); the tests use it as the joining node.

pub mod client;
pub mod keys;
pub mod retry;
pub mod service_policy;
pub mod ticket;

pub use client::{Client, ClientError};
pub use retry::Backoff;
pub use service_policy::{ServicePolicy, ServicePolicyError};
