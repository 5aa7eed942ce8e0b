//! Drives simulated nodes against a target: a fixed number of concurrent nodes (closed loop) for
//! a count or a duration, or nodes arriving at a target rate (open loop).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use node_client::{Backoff, ClientError};
use rand::Rng as _;
use tokio::time::Instant;

use crate::collateral::CollateralUse;
use crate::node::{Node, NodeError, Target, loopback_source, node_ip};
use crate::procstat::{self, ProcError, Watched};
use crate::report::{Failure, Outcome, ProcessReadings, Report};

/// Why a run could not be carried out (a node refused is not this; it is in the report).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("cannot make a simulated node")]
    Node(#[from] NodeError),
    #[error("cannot read a watched process (did it die during the run?)")]
    Proc(#[from] ProcError),
    #[error("a load task failed")]
    Task(#[from] tokio::task::JoinError),
    #[error("cannot read attest-proxy's collateral metrics")]
    Metrics(#[from] crate::collateral::MetricsError),
    #[error("cannot read the API server's request counters")]
    ApiServer(#[from] crate::apiserver::ApiServerError),
}

/// When a closed-loop run ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many nodes have joined (or failed to).
    Count(u64),
    /// No node starts after this long; those in flight finish.
    Duration(Duration),
}

/// How nodes arrive.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// `concurrency` nodes at a time, each starting as soon as one finishes.
    Closed { concurrency: usize, stop: Stop },
    /// `per_second` nodes start per second for `duration`, whatever the answers; at most
    /// `max_in_flight` at once (later ones wait, and their latency counts from when they were
    /// due, so a slow service shows in the percentiles instead of lowering the rate unseen).
    Open {
        per_second: f64,
        duration: Duration,
        max_in_flight: usize,
    },
}

impl Mode {
    /// How the report describes the mode.
    pub fn describe(&self) -> String {
        match self {
            Mode::Closed { concurrency, stop } => match stop {
                Stop::Count(n) => format!("concurrency {concurrency}, {n} joins"),
                Stop::Duration(d) => format!(
                    "concurrency {concurrency} for {}",
                    humantime::format_duration(*d)
                ),
            },
            Mode::Open {
                per_second,
                duration,
                max_in_flight,
            } => format!(
                "{per_second}/s for {} (at most {max_in_flight} in flight)",
                humantime::format_duration(*duration)
            ),
        }
    }
}

/// Durations in JSON reports: seconds, fractional.
pub(crate) fn seconds<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

/// A run's parameters.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    /// What the report calls the run.
    pub label: String,
    pub mode: Mode,
    /// Deadline of one attempt (connect, handshake, call).
    pub timeout: Duration,
    /// How nodes retry what the service asks them to retry (node-client's own policy:
    /// `ResourceExhausted`, `Unavailable`, `Aborted`, with full-jitter backoff); `None`: every
    /// failure is final.
    pub retry: Option<Backoff>,
    /// Prefix of the node names, so runs against one system do not reuse names.
    pub node_prefix: String,
    /// Against a loopback target, each node connects from its own 127.x.y.z address
    /// ([`crate::node::loopback_source`]) instead of all from 127.0.0.1.
    pub spread_sources: bool,
    /// Nodes whose identities (kubelet key and CSR, SSH host key, attestation key or client
    /// certificate) are made before the clock starts, as a real node makes its keys at boot,
    /// long before it joins. Later nodes make theirs when they start, inside the measured time.
    /// Either way each join still does its full handshake (a fresh certificate key and
    /// attestation document) inside the measured time.
    pub pregenerate: u64,
    /// attest-proxy's admin endpoint, to report how much SEV-SNP or TDX collateral the run fetched
    /// ([`crate::collateral`]); `None` for variants without collateral.
    pub collateral_metrics: Option<std::net::SocketAddr>,
    /// The Kubernetes API server behind the service, to report the requests the run made of it
    /// ([`crate::apiserver`]); `None` where there is none (A, B) or it is not reachable.
    pub api_server: Option<crate::apiserver::ApiServer>,
}

/// Node names (`<prefix>-<index>`) and addresses of one run, and the nodes made ahead of it.
#[derive(Debug)]
struct Namer {
    prefix: String,
    next: AtomicU64,
    spread_sources: bool,
    ready: std::sync::Mutex<std::collections::VecDeque<Node>>,
}

impl Namer {
    /// A new node with the next index.
    fn make(&self, target: &Target) -> Result<Node, NodeError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed);
        let source = (self.spread_sources && target.addr().ip().is_loopback())
            .then(|| loopback_source(index));
        target.node(&format!("{}-{index}", self.prefix), node_ip(index), source)
    }

    /// A node made ahead if one is left, else a new one.
    fn take(&self, target: &Target) -> Result<Node, NodeError> {
        let made = self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop_front();
        match made {
            Some(node) => Ok(node),
            None => self.make(target),
        }
    }

    /// Makes `count` nodes ahead, on every core (key generation is CPU work only).
    fn pregenerate(&self, target: &Target, count: u64) -> Result<(), NodeError> {
        let threads = std::thread::available_parallelism().map_or(1, usize::from) as u64;
        let per_thread = count.div_ceil(threads.max(1));
        let made: Vec<Result<Vec<Node>, NodeError>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    let n = per_thread.min(count.saturating_sub(t * per_thread));
                    scope.spawn(move || (0..n).map(|_| self.make(target)).collect())
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
                })
                .collect()
        });
        let mut ready = self
            .ready
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for nodes in made {
            ready.extend(nodes?);
        }
        Ok(())
    }
}

/// A short random prefix for node names, lowercase as Kubernetes node names must be.
pub fn random_prefix() -> String {
    let bytes: [u8; 3] = rand::rng().random();
    format!("lg{}", hex::encode(bytes))
}

/// Runs `config` against `target`, watching `watched` for CPU and memory.
pub async fn run(
    target: Arc<Target>,
    config: &LoadConfig,
    watched: &[Watched],
) -> Result<Report, RunError> {
    let ticks = procstat::clock_ticks_per_second();
    let namer = Arc::new(Namer {
        prefix: config.node_prefix.clone(),
        next: AtomicU64::new(0),
        spread_sources: config.spread_sources,
        ready: std::sync::Mutex::default(),
    });
    if config.pregenerate > 0 {
        let (target, namer, count) = (target.clone(), namer.clone(), config.pregenerate);
        tokio::task::spawn_blocking(move || namer.pregenerate(&target, count)).await??;
    }
    let collateral_before = match config.collateral_metrics {
        Some(admin) => Some(crate::collateral::read(admin).await?),
        None => None,
    };
    let api_before = match &config.api_server {
        Some(api) => Some(api.read().await?),
        None => None,
    };
    let before = procstat::sample(watched)?;
    let start = Instant::now();
    let outcomes = match config.mode {
        Mode::Closed { concurrency, stop } => {
            closed(target, config, namer, concurrency.max(1), stop, start).await?
        }
        Mode::Open {
            per_second,
            duration,
            max_in_flight,
        } => {
            open(
                target,
                config,
                namer,
                per_second,
                duration,
                max_in_flight,
                start,
            )
            .await?
        }
    };
    let elapsed = start.elapsed();
    let after = procstat::sample(watched)?;
    let concurrency = match config.mode {
        Mode::Closed { concurrency, .. } => Some(concurrency),
        Mode::Open { .. } => None,
    };
    let mut report = Report::new(
        &config.label,
        &config.mode.describe(),
        concurrency,
        elapsed,
        &outcomes,
        &ProcessReadings {
            watched: watched.to_vec(),
            before,
            after,
            ticks_per_second: ticks,
        },
    );
    if let (Some(admin), Some(before)) = (config.collateral_metrics, collateral_before) {
        let after = crate::collateral::read(admin).await?;
        report.collateral = Some(CollateralUse::between(before, after, report.succeeded));
    }
    if let (Some(api), Some(before)) = (&config.api_server, api_before) {
        let after = api.read().await?;
        report.api = Some(crate::apiserver::ApiUse::between(
            &before,
            &after,
            report.succeeded,
        ));
    }
    Ok(report)
}

async fn closed(
    target: Arc<Target>,
    config: &LoadConfig,
    namer: Arc<Namer>,
    concurrency: usize,
    stop: Stop,
    start: Instant,
) -> Result<Vec<Outcome>, RunError> {
    let claimed = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (target, namer, claimed) = (target.clone(), namer.clone(), claimed.clone());
        let (timeout, retry) = (config.timeout, config.retry);
        workers.spawn(async move {
            let mut outcomes = Vec::new();
            loop {
                let more = match stop {
                    Stop::Count(n) => claimed.fetch_add(1, Ordering::Relaxed) < n,
                    Stop::Duration(d) => start.elapsed() < d,
                };
                if !more {
                    break;
                }
                outcomes.push(one_node(&target, &namer, timeout, retry, None).await?);
            }
            Ok::<_, RunError>(outcomes)
        });
    }
    let mut outcomes = Vec::new();
    while let Some(done) = workers.join_next().await {
        outcomes.extend(done??);
    }
    Ok(outcomes)
}

#[allow(clippy::too_many_arguments)]
async fn open(
    target: Arc<Target>,
    config: &LoadConfig,
    namer: Arc<Namer>,
    per_second: f64,
    duration: Duration,
    max_in_flight: usize,
    start: Instant,
) -> Result<Vec<Outcome>, RunError> {
    let slots = Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1)));
    let interval = Duration::from_secs_f64(1.0 / per_second.max(1e-3));
    let mut tasks = tokio::task::JoinSet::new();
    let mut outcomes = Vec::new();
    for i in 0u32.. {
        let due = start + interval.saturating_mul(i);
        if due.duration_since(start) >= duration {
            break;
        }
        tokio::time::sleep_until(due).await;
        let (target, namer, slots) = (target.clone(), namer.clone(), slots.clone());
        let (timeout, retry) = (config.timeout, config.retry);
        tasks.spawn(async move {
            // The semaphore is never closed, so acquiring only waits.
            let _slot = slots.acquire_owned().await;
            one_node(&target, &namer, timeout, retry, Some(due)).await
        });
        // Collect finished tasks as we go so a long run does not hold every result twice.
        while let Some(done) = tasks.try_join_next() {
            outcomes.push(done??);
        }
    }
    while let Some(done) = tasks.join_next().await {
        outcomes.push(done??);
    }
    Ok(outcomes)
}

/// Takes the next node (made ahead, or made now) and joins it, retrying as `retry` says.
/// Latency counts from `due` if given, else from the first attempt (the node's keys are made
/// before).
async fn one_node(
    target: &Target,
    namer: &Namer,
    timeout: Duration,
    retry: Option<Backoff>,
    due: Option<Instant>,
) -> Result<Outcome, RunError> {
    let node = namer.take(target)?;
    let started = due.unwrap_or_else(Instant::now);
    let Some(backoff) = retry else {
        let result = node.join(timeout).await;
        return Ok(Outcome {
            latency: started.elapsed(),
            result,
            retried: vec![],
        });
    };
    // node-client's retry loop decides what to retry and when; every failure is noted here, so
    // the report can say what was retried.
    let failures = std::sync::Mutex::new(Vec::<Failure>::new());
    let (node, noted) = (&node, &failures);
    let retried = backoff
        .run(move || async move {
            node.join(timeout).await.map_err(|failure| {
                let status = tonic::Status::new(failure.code, failure.class.clone());
                noted
                    .lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push(failure);
                ClientError::Status(status)
            })
        })
        .await;
    let latency = started.elapsed();
    let mut failures = failures
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let result = match retried.result {
        Ok(()) => Ok(()),
        // The last failure noted is the one returned.
        Err(_) => Err(failures
            .pop()
            .unwrap_or_else(|| Failure::new(tonic::Code::Unknown, "failed without a status"))),
    };
    Ok(Outcome {
        latency,
        result,
        retried: failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_describe_themselves() {
        let closed = Mode::Closed {
            concurrency: 64,
            stop: Stop::Duration(Duration::from_secs(5)),
        };
        assert_eq!(closed.describe(), "concurrency 64 for 5s");
        let count = Mode::Closed {
            concurrency: 1,
            stop: Stop::Count(10),
        };
        assert_eq!(count.describe(), "concurrency 1, 10 joins");
        assert!(random_prefix().starts_with("lg"));
    }
}
