//! Load generator and benchmark for the join service.
//!
//! The load generator ([`run::run`]) simulates nodes joining a running system: each node has its
//! own keys (a kubelet CSR with its own key, an SSH host key, its own software attestation key
//! from `soft-issuer`), dials a new connection per join with a full aTLS handshake (a fresh
//! certificate key and attestation document per handshake, as a Constellation node does) and
//! calls `IssueJoinTicket`. Nodes can make their identities before the measured window, as a
//! node makes its keys at boot ([`run::LoadConfig::pregenerate`]). It reports joins per second, latency percentiles, errors by gRPC
//! status and message, and for each of the service's processes the CPU seconds per join and the
//! peak resident memory ([`report::Report`]).
//!
//! The benchmark ([`mod@bench`]) runs its setups side by side on one machine: a plain mutual-TLS
//! floor (A), aTLS with attestation through attest-proxy to a trivial upstream (B), full joins
//! through the whole system (C), and C with mutual attestation (C-mutual: the service attests
//! itself and every node verifies it, [`Target::Atls`]'s `server_policy`), and writes the
//! figures as JSON and SVG. The storm ([`mod@storm`]) lets thousands of new nodes join at once,
//! per variant, and judges the time by C's rate measured just before.
//!
//! Nothing here is part of the service; `soft-issuer` documents prove nothing and are accepted
//! only because the qemu-vtpm variant trusts the attestation key as presented.

#![forbid(unsafe_code)]

pub mod apiserver;
pub mod bench;
pub mod collateral;
pub mod crowd;
pub mod mtls;
pub mod node;
pub mod plot;
pub mod procstat;
pub mod report;
pub mod run;
pub mod storm;
pub mod tables;
pub mod trivial;

pub use node::{NodeAttestation, SoftAttestation, Target};
pub use report::Report;
pub use run::{LoadConfig, Mode, Stop};
