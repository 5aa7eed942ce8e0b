//! Retrying a join the service asked the node to retry, with jittered exponential backoff.
//!
//! The service answers `ResourceExhausted` when it sheds load, `Unavailable` when a backend is
//! down or restarting (nothing was created), and `Aborted` when another control-plane node is
//! joining right now. All three mean "the same request will likely work later". Every other
//! code is final: retrying a refused attestation or a malformed request cannot help.
//!
//! The pause before attempt n+1 is drawn uniformly from [0, min(max, initial * 2^n)] ("full
//! jitter"), so thousands of nodes released by a healed partition do not retry in lockstep.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use crate::ClientError;

/// How long and how often to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// Upper bound of the first pause.
    pub initial: Duration,
    /// Upper bound of every pause.
    pub max: Duration,
    /// No new attempt starts after this much time since the first one.
    pub give_up_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(10),
            give_up_after: Duration::from_secs(300),
        }
    }
}

/// Whether a failure is worth retrying (see the module docs).
pub fn is_retryable(error: &ClientError) -> bool {
    match error {
        ClientError::Status(status) => matches!(
            status.code(),
            Code::ResourceExhausted | Code::Unavailable | Code::Aborted
        ),
        ClientError::Endpoint(..) => false,
        // The same server would be refused again; a genuine one cannot be reached by waiting
        // out an impostor, and the operator must see this at once.
        ClientError::ServerRefused { .. } => false,
    }
}

/// What a retried call came to.
#[derive(Debug)]
pub struct Retried<T> {
    /// The last attempt's result.
    pub result: Result<T, ClientError>,
    /// How many attempts failed retryably before it.
    pub retries: u32,
}

impl Backoff {
    /// The upper bound of the pause after `failures` failed attempts.
    fn ceiling(&self, failures: u32) -> Duration {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(30));
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Runs `attempt` until it succeeds, fails for good, or the time is up.
    pub async fn run<T, F, Fut>(&self, mut attempt: F) -> Retried<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let started = Instant::now();
        let mut retries = 0;
        loop {
            let result = attempt().await;
            let retry = matches!(&result, Err(error) if is_retryable(error));
            if !retry {
                return Retried { result, retries };
            }
            let pause = self.ceiling(retries + 1).mul_f64(rand::random::<f64>());
            if started.elapsed() + pause >= self.give_up_after {
                return Retried { result, retries };
            }
            if let Err(error) = &result {
                tracing::info!(%error, ?pause, attempt = retries + 1, "join service asked to retry");
            }
            tokio::time::sleep(pause).await;
            retries += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn status(code: Code) -> ClientError {
        ClientError::Status(tonic::Status::new(code, "test"))
    }

    #[test]
    fn ceilings_double_up_to_the_max() {
        let backoff = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(1),
            give_up_after: Duration::from_secs(60),
        };
        let ceilings: Vec<_> = (1..=6).map(|n| backoff.ceiling(n).as_millis()).collect();
        assert_eq!(ceilings, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.ceiling(u32::MAX), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_shed_and_unavailable_answers_until_success() {
        let calls = Cell::new(0);
        let retried = Backoff::default()
            .run(|| {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    match n {
                        1 => Err(status(Code::ResourceExhausted)),
                        2 => Err(status(Code::Unavailable)),
                        3 => Err(status(Code::Aborted)),
                        _ => Ok(n),
                    }
                }
            })
            .await;
        assert_eq!(retried.result.unwrap(), 4);
        assert_eq!(retried.retries, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn final_answers_are_not_retried() {
        for code in [
            Code::Unauthenticated,
            Code::InvalidArgument,
            Code::PermissionDenied,
            Code::Internal,
            Code::DeadlineExceeded,
        ] {
            let calls = Cell::new(0);
            let retried = Backoff::default()
                .run(|| {
                    calls.set(calls.get() + 1);
                    async move { Err::<(), _>(status(code)) }
                })
                .await;
            assert_eq!((calls.get(), retried.retries), (1, 0), "{code:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn gives_up_when_the_time_is_up() {
        let backoff = Backoff {
            initial: Duration::from_secs(1),
            max: Duration::from_secs(4),
            give_up_after: Duration::from_secs(30),
        };
        let started = Instant::now();
        let retried = backoff
            .run(|| async { Err::<(), _>(status(Code::Unavailable)) })
            .await;
        assert!(retried.result.is_err());
        assert!(
            retried.retries >= 7,
            "pauses of at most 4 s: {}",
            retried.retries
        );
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
