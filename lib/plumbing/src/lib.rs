//! Plumbing shared by the three service processes.
//!
//! Inside the pod the processes talk over Unix sockets on a shared in-memory volume. A socket
//! file's permissions are one fence; the second is [`unix`]: every listener checks the peer
//! credentials (`SO_PEERCRED`) of each connecting process and drops any whose uid is not the one
//! intended peer's. attest-proxy → join-core and join-core → token-issuer both go through it.
//! [`identity`] names the headers attest-proxy vouches for; [`shutdown`] and [`telemetry`] are
//! what every `main` needs, and
//! [`admin`] is the health and metrics endpoint each process serves; [`https`] the client for
//! services outside the cluster.

pub mod admin;
pub mod https;
pub mod identity;
pub mod shutdown;
pub mod telemetry;
pub mod unix;
