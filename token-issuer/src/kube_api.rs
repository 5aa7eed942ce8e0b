//! What every Kubernetes call of token-issuer shares: one deadline per call and one error type
//! that sorts failures by what the caller can do about them.

use std::future::Future;
use std::time::Duration;

/// How a Kubernetes call failed.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// The API server answered with a failure `Status`.
    #[error("Kubernetes API answered {code} {reason}: {message}")]
    Api {
        /// HTTP status.
        code: u16,
        /// `Status.reason`.
        reason: String,
        /// `Status.message`.
        message: String,
        /// The client error (boxed: kube's error is large and travels in every `Result`).
        #[source]
        source: Box<kube::Error>,
    },
    /// No answer: connection, TLS or protocol failure.
    #[error("Kubernetes API unreachable")]
    Transport(#[source] Box<kube::Error>),
    /// No answer within the deadline.
    #[error("Kubernetes API did not answer within {0:?}")]
    Timeout(Duration),
}

impl KubeError {
    fn from_kube(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(ref s) => Self::Api {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
                source: Box::new(e),
            },
            other => Self::Transport(Box::new(other)),
        }
    }

    /// Whether the request may have been carried out although it reported failure, so the
    /// caller cannot know whether the object exists.
    pub fn outcome_unknown(&self) -> bool {
        match self {
            Self::Api { code, .. } => *code >= 500,
            Self::Transport(_) | Self::Timeout(_) => true,
        }
    }

    /// The HTTP status the API server answered, if it answered.
    pub fn code(&self) -> Option<u16> {
        match self {
            Self::Api { code, .. } => Some(*code),
            Self::Transport(_) | Self::Timeout(_) => None,
        }
    }

    /// 404: the object (or its namespace) does not exist.
    pub fn is_not_found(&self) -> bool {
        self.code() == Some(404)
    }

    /// 409 with reason `AlreadyExists` (a create of an existing name).
    pub fn is_already_exists(&self) -> bool {
        matches!(self, Self::Api { code: 409, reason, .. } if reason == "AlreadyExists")
    }
}

/// Runs one Kubernetes call with a deadline (kube-rs retries throttling answers on its own; the
/// deadline bounds those retries too), and times it under the metric label `name`.
pub(crate) async fn bounded<T>(
    name: &'static str,
    timeout: Duration,
    call: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, KubeError> {
    let started = std::time::Instant::now();
    let result = match tokio::time::timeout(timeout, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(KubeError::from_kube(e)),
        Err(_) => Err(KubeError::Timeout(timeout)),
    };
    crate::metrics::api_call(name, &result, started.elapsed());
    result
}
