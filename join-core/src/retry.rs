//! Retrying idempotent backend calls: bounded, jittered exponential backoff inside one overall
//! deadline.
//!
//! Only the key service is called through here. `GetDataKey` derives and changes nothing, so
//! asking again is always safe; token-issuer creates objects and is never retried by join-core.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use crate::error::CallError;

/// How a call is retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Everything, attempts and pauses together, ends by this deadline.
    pub deadline: Duration,
    /// One attempt gets at most this long (and never more than what is left of `deadline`), so a
    /// hung connection cannot eat the whole budget.
    pub attempt_timeout: Duration,
    /// The pause before the first retry; it doubles after each retry.
    pub initial_backoff: Duration,
    /// The pause never grows beyond this.
    pub max_backoff: Duration,
    /// At most this many attempts, even when the deadline would allow more.
    pub max_attempts: u32,
}

impl RetryPolicy {
    /// The policy for key service calls under `deadline`, each attempt capped at
    /// `attempt_timeout`.
    pub fn new(deadline: Duration, attempt_timeout: Duration) -> Self {
        Self {
            deadline,
            attempt_timeout,
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(1),
            max_attempts: 8,
        }
    }

    /// The pause after `retries` retries so far, with "equal jitter": half the exponential step
    /// is fixed, half random, so many join-core replicas that lost the key service at once do not
    /// come back in lockstep.
    fn backoff(&self, retries: u32) -> Duration {
        let step = self
            .initial_backoff
            .saturating_mul(1u32 << retries.min(16))
            .min(self.max_backoff);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }
}

/// Whether another attempt may succeed where this one failed.
fn is_transient(error: &CallError) -> bool {
    match error {
        // Connection refused or broken, or no answer in time: the key service may be
        // restarting or briefly overloaded.
        CallError::Unreachable(_) | CallError::Timeout(_) => true,
        CallError::Refused(status) => status.code() == Code::Unavailable,
    }
}

/// A call that failed for good, with how many attempts were made.
#[derive(Debug)]
pub struct GaveUp {
    /// Attempts made, the failed last one included.
    pub attempts: u32,
    /// Why the last attempt failed.
    pub last: CallError,
}

/// Runs `attempt` (given the time it may take) until it succeeds, fails with a non-transient
/// error, the attempts run out, or the next pause would end past the deadline.
pub async fn retry<T, F, Fut>(policy: RetryPolicy, mut attempt: F) -> Result<T, GaveUp>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, CallError>>,
{
    let deadline = Instant::now() + policy.deadline;
    let mut attempts = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let timeout = policy.attempt_timeout.min(left);
        attempts += 1;
        let error = match attempt(timeout).await {
            Ok(value) => return Ok(value),
            Err(error) => error,
        };
        let pause = policy.backoff(attempts - 1);
        let next_start = Instant::now() + pause;
        // A retry that would start with (almost) nothing left cannot succeed; report the real
        // failure now rather than a deadline later.
        let worth_it = next_start + Duration::from_millis(10) < deadline;
        if !is_transient(&error) || attempts >= policy.max_attempts || !worth_it {
            // A last attempt cut short by the overall deadline is the deadline's doing.
            let last = match error {
                CallError::Timeout(_) if timeout < policy.attempt_timeout => {
                    CallError::Timeout(policy.deadline)
                }
                other => other,
            };
            return Err(GaveUp { attempts, last });
        }
        tracing::debug!(attempts, ?pause, error = %error, "retrying key service call");
        tokio::time::sleep_until(next_start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use tonic::Status;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            deadline: Duration::from_secs(10),
            attempt_timeout: Duration::from_secs(2),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(800),
            max_attempts: 5,
        }
    }

    #[test]
    fn backoff_doubles_is_jittered_and_capped() {
        let p = policy();
        for _ in 0..100 {
            let first = p.backoff(0);
            assert!(first >= Duration::from_millis(50) && first <= Duration::from_millis(100));
            let third = p.backoff(2);
            assert!(third >= Duration::from_millis(200) && third <= Duration::from_millis(400));
            let late = p.backoff(30);
            assert!(late >= Duration::from_millis(400) && late <= Duration::from_millis(800));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn transient_failures_are_retried_until_success() {
        let calls = AtomicU32::new(0);
        let value = retry(policy(), |_| async {
            match calls.fetch_add(1, Ordering::SeqCst) {
                0 => Err(CallError::Refused(Status::unavailable("starting"))),
                1 => Err(CallError::Timeout(Duration::from_secs(2))),
                _ => Ok(7),
            }
        })
        .await
        .unwrap();
        assert_eq!(value, 7);
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_are_not_retried() {
        let calls = AtomicU32::new(0);
        let gave_up = retry(policy(), |_| async {
            calls.fetch_add(1, Ordering::SeqCst);
            Err::<(), _>(CallError::Refused(Status::invalid_argument("bad id")))
        })
        .await
        .unwrap_err();
        assert_eq!(gave_up.attempts, 1);
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn attempts_are_bounded() {
        let gave_up = retry(policy(), |_| async {
            Err::<(), _>(CallError::Refused(Status::unavailable("down")))
        })
        .await
        .unwrap_err();
        assert_eq!(gave_up.attempts, 5);
    }

    #[tokio::test(start_paused = true)]
    async fn the_overall_deadline_holds() {
        let started = Instant::now();
        let mut p = policy();
        p.deadline = Duration::from_secs(3);
        p.max_attempts = 100;
        let mut timeouts = Vec::new();
        let gave_up = retry(p, |timeout| {
            timeouts.push(timeout);
            async move {
                tokio::time::sleep(timeout).await;
                Err::<(), _>(CallError::Timeout(timeout))
            }
        })
        .await
        .unwrap_err();
        assert!(
            started.elapsed() <= Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        assert!(matches!(gave_up.last, CallError::Timeout(d) if d == Duration::from_secs(3)));
        assert_eq!(timeouts[0], Duration::from_secs(2));
        assert!(timeouts[1] < Duration::from_secs(1), "{timeouts:?}");
    }
}
