//! Errors by layer, and the one place they become gRPC statuses for the node.
//!
//! - [`RequestError`]: the request itself is refused, before any backend is asked.
//! - [`CallError`]: one call to a backend (key service or token-issuer) failed.
//! - [`KmsError`], [`TokenIssuerError`]: a backend's answer was unusable.
//! - [`KubeadmConfigError`]: the mounted kubeadm ClusterConfiguration is unusable.
//! - [`TicketError`]: what a join or rejoin failed on, naming the step.
//!
//! [`TicketError::to_status`] chooses the code the node sees:
//!
//! | failure | code | why |
//! |---|---|---|
//! | no or bad identity headers | `Unauthenticated` | the request did not pass attest-proxy |
//! | bad disk UUID, CSR, host key or principals | `InvalidArgument` | the node's fault; nothing was asked |
//! | key service unreachable, `Unavailable`, or no answer by the deadline (after retries) | `Unavailable`, naming the key service | fetching keys changes nothing: the node may simply retry |
//! | key service refuses with any other code (e.g. `InvalidArgument`) or returns a wrong-size key | `Internal` | join-core's requests are fixed, so this is a fault on our side, not the node's |
//! | kubeadm ClusterConfiguration unreadable | `Internal` | an operator fault the node cannot fix |
//! | SSH host certificate cannot be signed | `Internal` | not the node's fault; nothing was created |
//! | token-issuer unreachable | `Unavailable` | nothing was created |
//! | token-issuer too slow | `DeadlineExceeded` | it may have created a token (it cleans up after itself) |
//! | token-issuer refuses | its own code, prefixed with the step | token-issuer chose it on purpose |

use std::error::Error as _;
use std::path::PathBuf;
use std::time::Duration;

use tonic::{Code, Status};

/// A request refused on its own merits, before the key service or token-issuer is asked.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// An identity header attest-proxy always sets is missing: the request did not come
    /// through the proxy's verified path.
    #[error("not forwarded by attest-proxy: no {header} header")]
    NotForwarded { header: &'static str },
    /// An identity header is present but unreadable.
    #[error("not forwarded by attest-proxy: malformed {header} header")]
    MalformedIdentity { header: &'static str },
    /// The disk UUID cannot name a state disk key.
    #[error("invalid disk_uuid: {reason}")]
    DiskUuid { reason: String },
    /// The kubelet CSR is missing or cannot be one.
    #[error("invalid certificate_request: {reason}")]
    CertificateRequest { reason: String },
    /// The SSH host key is missing, malformed or of a type join-core does not certify.
    #[error("invalid host_public_key: {reason}")]
    HostPublicKey { reason: String },
    /// A requested host certificate principal is unusable, or there are too many.
    #[error("invalid host_certificate_principals: {reason}")]
    Principals { reason: String },
}

/// One call to a backend failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// No answer could be had: the connection failed or broke (the status was made locally).
    #[error("unreachable")]
    Unreachable(#[source] Status),
    /// The per-call deadline passed first.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The backend answered with an error status.
    #[error("answered with an error")]
    Refused(#[source] Status),
}

impl CallError {
    /// Sorts a client-side status by where it came from.
    pub(crate) fn from_status(status: Status, deadline: Duration) -> Self {
        let timeout_message = tonic::TimeoutExpired(()).to_string();
        let local_timeout = status.code() == Code::Cancelled && status.message() == timeout_message;
        if status.code() == Code::DeadlineExceeded || local_timeout {
            // We send our deadline as grpc-timeout; tonic's client enforces it locally
            // (Cancelled, "Timeout expired") and a server that gives up first answers
            // DeadlineExceeded.
            CallError::Timeout(deadline)
        } else if status.code() == Code::Cancelled || status.source().is_some() {
            // Any other Cancelled is the connection or the peer going away mid-call (a backend
            // draining on SIGTERM resets its streams): join-core never cancels a call itself.
            // tonic attaches the underlying error to statuses it makes itself (connect
            // failures, broken connections); statuses the server sent carry none.
            CallError::Unreachable(status)
        } else {
            CallError::Refused(status)
        }
    }
}

/// Which key join-core was fetching.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyName {
    /// The node's state disk key (key id = disk UUID).
    StateDiskKey,
    /// The cluster's measurement secret (key id `measurementSecret`).
    MeasurementSecret,
    /// The seed of the emergency SSH CA (key id `ca_emergency_ssh`).
    SshCaSeed,
}

impl std::fmt::Display for KeyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KeyName::StateDiskKey => "state disk key",
            KeyName::MeasurementSecret => "measurement secret",
            KeyName::SshCaSeed => "emergency SSH CA seed",
        })
    }
}

/// The key service's answer was unusable.
#[derive(Debug, thiserror::Error)]
pub enum KmsError {
    /// The call failed for good: a refusal, or transient failures until the retries or the
    /// deadline ran out.
    #[error("gave up after {attempts} attempt(s)")]
    Call {
        attempts: u32,
        #[source]
        source: CallError,
    },
    /// The key service returned a key of the wrong size.
    #[error("returned {got} bytes instead of {expected}")]
    WrongLength { expected: usize, got: usize },
}

/// token-issuer's answer was unusable.
#[derive(Debug, thiserror::Error)]
pub enum TokenIssuerError {
    /// The call failed.
    #[error(transparent)]
    Call(#[from] CallError),
    /// A field every ticket needs came back empty.
    #[error("answered without {field}")]
    Incomplete { field: &'static str },
}

/// The kubeadm ClusterConfiguration (the source of the API server's cert SANs) is unusable.
#[derive(Debug, thiserror::Error)]
pub enum KubeadmConfigError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file is not YAML of the expected shape.
    #[error("{path} is not a kubeadm ClusterConfiguration")]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_yaml::Error,
    },
    /// The file holds another kubeadm document (e.g. an InitConfiguration).
    #[error("{path} holds kind {kind}, not ClusterConfiguration")]
    WrongKind { path: PathBuf, kind: String },
    /// A SAN cannot be an SSH principal.
    #[error("{path}: apiServer.certSANs entry {san:?} {reason}")]
    BadSan {
        path: PathBuf,
        san: String,
        reason: String,
    },
}

/// The SSH host certificate could not be made.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    /// The key service's seed cannot be an Ed25519 key.
    #[error("the CA seed is {len} bytes; an Ed25519 seed is 32")]
    CaSeed { len: usize },
    /// The system random source failed.
    #[error("no randomness for the certificate nonce and serial")]
    Random,
    /// No principals: the certificate would be valid for every host.
    #[error("no principals to certify")]
    NoPrincipals,
}

/// Why a join or rejoin ticket was not issued.
#[derive(Debug, thiserror::Error)]
pub enum TicketError {
    /// The request was refused before any backend was asked.
    #[error(transparent)]
    Request(#[from] RequestError),
    /// Fetching a key from the key service failed.
    #[error("key service GetDataKey ({key})")]
    Kms {
        key: KeyName,
        #[source]
        source: KmsError,
    },
    /// The API server's cert SANs could not be read for the SSH host certificate.
    #[error("reading the kubeadm ClusterConfiguration")]
    KubeadmConfig(#[source] KubeadmConfigError),
    /// Signing the SSH host certificate failed.
    #[error("signing the SSH host certificate")]
    Ssh(#[source] SshError),
    /// Getting Kubernetes credentials from token-issuer failed.
    #[error("token-issuer IssueNodeCredentials")]
    TokenIssuer(#[source] TokenIssuerError),
}

impl TicketError {
    /// The status the node sees. The only place a [`TicketError`] becomes a [`Status`].
    ///
    /// Messages name the failed step but not internal addresses; the log line has the detail.
    pub fn to_status(&self) -> Status {
        match self {
            TicketError::Request(
                e @ (RequestError::NotForwarded { .. } | RequestError::MalformedIdentity { .. }),
            ) => Status::unauthenticated(e.to_string()),
            TicketError::Request(
                e @ (RequestError::DiskUuid { .. }
                | RequestError::CertificateRequest { .. }
                | RequestError::HostPublicKey { .. }
                | RequestError::Principals { .. }),
            ) => Status::invalid_argument(e.to_string()),

            // Key fetches change nothing, so every failure the node can wait out is Unavailable,
            // including a missed deadline: retrying is safe and the right move. join-core has
            // already retried within its deadline; the message says so.
            TicketError::Kms { key, source } => match source {
                KmsError::Call {
                    attempts,
                    source: CallError::Unreachable(_),
                } => Status::unavailable(format!(
                    "key service unreachable while fetching the {key} ({attempts} attempt(s))"
                )),
                KmsError::Call {
                    source: CallError::Timeout(after),
                    ..
                } => Status::unavailable(format!(
                    "key service did not answer within {after:?} while fetching the {key}"
                )),
                KmsError::Call {
                    attempts,
                    source: CallError::Refused(status),
                } if status.code() == Code::Unavailable => Status::unavailable(format!(
                    "key service unavailable while fetching the {key} ({attempts} attempt(s)): {}",
                    status.message()
                )),
                // join-core's key requests are fixed; any other refusal (InvalidArgument for a
                // length or id it should never send, PermissionDenied, ...) is a server-side
                // fault the node cannot fix by retrying.
                KmsError::Call {
                    source: CallError::Refused(status),
                    ..
                } => Status::internal(format!(
                    "key service refused the {key} request ({:?})",
                    status.code()
                )),
                KmsError::WrongLength { .. } => {
                    Status::internal(format!("key service returned a malformed {key}"))
                }
            },

            // The operator's configuration is broken; the node cannot fix that, and nothing
            // was created (the file is read before token-issuer is asked).
            TicketError::KubeadmConfig(_) => Status::internal(
                "join-core cannot read the kubeadm ClusterConfiguration for the SSH host certificate",
            ),

            TicketError::Ssh(_) => {
                Status::internal("join-core could not sign the SSH host certificate")
            }

            TicketError::TokenIssuer(source) => match source {
                TokenIssuerError::Call(CallError::Unreachable(_)) => {
                    Status::unavailable("token-issuer unreachable (IssueNodeCredentials)")
                }
                // Not Unavailable: token-issuer may have created the bootstrap token before the
                // deadline passed, so the outcome is unknown, which is what DeadlineExceeded says.
                TokenIssuerError::Call(CallError::Timeout(after)) => Status::deadline_exceeded(
                    format!("token-issuer IssueNodeCredentials did not answer within {after:?}"),
                ),
                // token-issuer validates the CSR itself; its verdict and code reach the node.
                TokenIssuerError::Call(CallError::Refused(status)) => Status::new(
                    status.code(),
                    format!("token-issuer IssueNodeCredentials: {}", status.message()),
                ),
                TokenIssuerError::Incomplete { field } => Status::internal(format!(
                    "token-issuer IssueNodeCredentials answered without {field}"
                )),
            },
        }
    }
}

/// Why join-core could not start or stopped serving.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The measurement salt file could not be read.
    #[error("cannot read the measurement salt from {path}")]
    ReadSalt {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The kubeadm ClusterConfiguration is unusable.
    #[error("unusable kubeadm ClusterConfiguration")]
    KubeadmConfig(#[source] KubeadmConfigError),
    /// The measurement salt has the wrong size.
    #[error("the measurement salt in {path} is {len} bytes; it must be {expected}")]
    SaltLength {
        path: PathBuf,
        len: usize,
        expected: usize,
    },
    /// The join.API socket could not be set up.
    #[error("cannot serve on the join-core socket")]
    Socket(#[source] plumbing::unix::Error),
    /// The gRPC server failed.
    #[error("join.API server failed")]
    Serve(#[source] tonic::transport::Error),
    /// The admin endpoint could not be bound.
    #[error("cannot bind the admin endpoint on {addr}")]
    Admin {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// An error and its sources on one line, for logs. A [`Status`] prints its own source.
pub(crate) fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = error.to_string();
    let mut next = if error.is::<Status>() {
        None
    } else {
        error.source()
    };
    while let Some(cause) = next {
        line.push_str(": ");
        line.push_str(&cause.to_string());
        next = if cause.is::<Status>() {
            None
        } else {
            cause.source()
        };
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelled_is_a_timeout_only_when_our_deadline_fired() {
        let deadline = Duration::from_secs(2);
        let local_timeout = Status::cancelled(tonic::TimeoutExpired(()).to_string());
        assert!(matches!(
            CallError::from_status(local_timeout, deadline),
            CallError::Timeout(_)
        ));
        assert!(matches!(
            CallError::from_status(Status::deadline_exceeded("server gave up"), deadline),
            CallError::Timeout(_)
        ));
        // A backend resetting its streams while it drains: gone, not slow.
        assert!(matches!(
            CallError::from_status(Status::cancelled("stream reset"), deadline),
            CallError::Unreachable(_)
        ));
        assert!(matches!(
            CallError::from_status(Status::permission_denied("no"), deadline),
            CallError::Refused(_)
        ));
    }

    #[test]
    fn codes_are_chosen_per_layer() {
        let kms = |source| TicketError::Kms {
            key: KeyName::StateDiskKey,
            source,
        };
        let kms_call = |source| {
            kms(KmsError::Call {
                attempts: 1,
                source,
            })
        };
        let local = Status::from_error("connection refused".into());
        assert!(local.source().is_some());
        let cases = [
            (
                TicketError::Request(RequestError::NotForwarded { header: "x" }),
                Code::Unauthenticated,
            ),
            (
                TicketError::Request(RequestError::DiskUuid { reason: "r".into() }),
                Code::InvalidArgument,
            ),
            (
                TicketError::Request(RequestError::HostPublicKey { reason: "r".into() }),
                Code::InvalidArgument,
            ),
            (
                TicketError::Request(RequestError::Principals { reason: "r".into() }),
                Code::InvalidArgument,
            ),
            (
                kms_call(CallError::from_status(local, Duration::ZERO)),
                Code::Unavailable,
            ),
            (
                kms_call(CallError::Timeout(Duration::ZERO)),
                Code::Unavailable,
            ),
            (
                kms_call(CallError::from_status(
                    Status::unavailable("x"),
                    Duration::ZERO,
                )),
                Code::Unavailable,
            ),
            (
                kms_call(CallError::from_status(
                    Status::invalid_argument("x"),
                    Duration::ZERO,
                )),
                Code::Internal,
            ),
            (
                kms_call(CallError::from_status(
                    Status::permission_denied("x"),
                    Duration::ZERO,
                )),
                Code::Internal,
            ),
            (
                TicketError::KubeadmConfig(KubeadmConfigError::WrongKind {
                    path: "f".into(),
                    kind: "InitConfiguration".into(),
                }),
                Code::Internal,
            ),
            (
                kms(KmsError::WrongLength {
                    expected: 32,
                    got: 1,
                }),
                Code::Internal,
            ),
            (
                TicketError::TokenIssuer(CallError::Timeout(Duration::ZERO).into()),
                Code::DeadlineExceeded,
            ),
            (
                TicketError::TokenIssuer(
                    CallError::from_status(Status::permission_denied("no"), Duration::ZERO).into(),
                ),
                Code::PermissionDenied,
            ),
            (
                TicketError::TokenIssuer(
                    CallError::from_status(Status::deadline_exceeded("late"), Duration::ZERO)
                        .into(),
                ),
                Code::DeadlineExceeded,
            ),
        ];
        for (error, code) in cases {
            assert_eq!(error.to_status().code(), code, "{error:?}");
        }
    }

    #[test]
    fn chain_names_every_layer_once() {
        let error = TicketError::Kms {
            key: KeyName::MeasurementSecret,
            source: KmsError::Call {
                attempts: 1,
                source: CallError::Refused(Status::not_found("gone")),
            },
        };
        assert_eq!(
            chain(&error),
            "key service GetDataKey (measurement secret): gave up after 1 attempt(s): \
             answered with an error: \
             code: 'Some requested entity was not found', message: \"gone\""
        );
    }
}
