//! The report of one load run: throughput, latency percentiles, errors by status, and the CPU and
//! memory each watched process spent.

use std::collections::HashMap;
use std::fmt;
use std::time::Duration;

use serde::Serialize;

use crate::collateral::CollateralUse;
use crate::procstat::{self, Sample, Watched};

/// Why one attempt at a join failed, reduced to what a report groups by.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    /// The gRPC status code the node saw. A connection or handshake that failed is
    /// `Unavailable`, as gRPC clients report it; the class says which.
    pub code: tonic::Code,
    /// The message with its variable parts (numbers, hashes) masked, so equal causes count
    /// together.
    pub class: String,
}

impl Failure {
    /// A failure whose class is `message`, masked.
    pub fn new(code: tonic::Code, message: &str) -> Self {
        Self {
            code,
            class: message_class(message),
        }
    }
}

/// Longest message class kept; the rest of a long error chain rarely tells causes apart.
const MAX_CLASS_LEN: usize = 120;

/// Masks what varies between occurrences of one cause: runs of digits become `#`, and long
/// hexadecimal strings (digests, key ids) become `<hex>`.
pub fn message_class(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(MAX_CLASS_LEN));
    let chars: Vec<char> = message.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_ascii_hexdigit() {
            let end = chars[i..]
                .iter()
                .position(|c| !c.is_ascii_hexdigit())
                .map_or(chars.len(), |n| i + n);
            let run = &chars[i..end];
            // A word such as "cafe" or "added" is hex too; only long runs or runs with digits
            // are masked.
            if run.len() >= 16 {
                out.push_str("<hex>");
                i = end;
                continue;
            }
            if c.is_ascii_digit() {
                let digits_end = chars[i..]
                    .iter()
                    .position(|c| !c.is_ascii_digit())
                    .map_or(chars.len(), |n| i + n);
                out.push('#');
                i = digits_end;
                continue;
            }
        }
        out.push(c);
        i += 1;
    }
    if out.chars().count() > MAX_CLASS_LEN {
        out = out.chars().take(MAX_CLASS_LEN).collect::<String>() + "…";
    }
    out
}

/// How one simulated node's join ended.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// From the first attempt (or, at a target rate, from when the join was due) to the answer.
    pub latency: Duration,
    /// The final result.
    pub result: Result<(), Failure>,
    /// The failures that were retried before that result.
    pub retried: Vec<Failure>,
}

/// The value at quantile `q` (0..=1) of ascending `sorted`, by nearest rank: the smallest value
/// that at least `q` of all values do not exceed. `None` when empty.
pub fn percentile(sorted: &[Duration], q: f64) -> Option<Duration> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.max(1) - 1).copied()
}

/// Latency of the successful joins, in milliseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Latency {
    pub count: usize,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

impl Latency {
    /// Summarizes `latencies` (any order).
    pub fn of(mut latencies: Vec<Duration>) -> Self {
        latencies.sort_unstable();
        let ms = |d: Option<Duration>| d.map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let total: Duration = latencies.iter().sum();
        Self {
            count: latencies.len(),
            mean_ms: if latencies.is_empty() {
                0.0
            } else {
                total.as_secs_f64() * 1e3 / latencies.len() as f64
            },
            p50_ms: ms(percentile(&latencies, 0.50)),
            p95_ms: ms(percentile(&latencies, 0.95)),
            p99_ms: ms(percentile(&latencies, 0.99)),
            max_ms: ms(latencies.last().copied()),
        }
    }
}

/// How often one cause occurred.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ErrorCount {
    /// gRPC status code name (`ResourceExhausted`, `Unavailable`, ...).
    pub code: String,
    pub class: String,
    pub count: u64,
}

fn tally<'a>(failures: impl Iterator<Item = &'a Failure>) -> Vec<ErrorCount> {
    let mut counts: HashMap<&Failure, u64> = HashMap::new();
    for failure in failures {
        *counts.entry(failure).or_default() += 1;
    }
    let mut out: Vec<ErrorCount> = counts
        .into_iter()
        .map(|(f, count)| ErrorCount {
            code: format!("{:?}", f.code),
            class: f.class.clone(),
            count,
        })
        .collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.code.cmp(&b.code))
            .then_with(|| a.class.cmp(&b.class))
    });
    out
}

/// What one process spent during the run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessCost {
    pub name: String,
    pub pid: u32,
    /// Counted in the service's CPU per join (false for the load generator itself).
    pub server_side: bool,
    /// utime + stime during the run.
    pub cpu_seconds: f64,
    /// `cpu_seconds` per successful join, in milliseconds; `None` without successful joins.
    pub cpu_ms_per_join: Option<f64>,
    /// `VmHWM` at the end of the run: the process's peak resident set since it started.
    pub peak_rss_mib: f64,
    /// `VmRSS` at the end of the run.
    pub rss_mib: f64,
}

/// Readings of the watched processes before and after a run.
#[derive(Clone, Debug)]
pub struct ProcessReadings {
    pub watched: Vec<Watched>,
    pub before: Vec<Sample>,
    pub after: Vec<Sample>,
    pub ticks_per_second: u64,
}

impl ProcessReadings {
    fn costs(&self, succeeded: u64) -> Vec<ProcessCost> {
        const MIB: f64 = 1024.0 * 1024.0;
        self.watched
            .iter()
            .zip(self.before.iter().zip(&self.after))
            .map(|(w, (before, after))| {
                let cpu_seconds = procstat::cpu_seconds(before, after, self.ticks_per_second);
                ProcessCost {
                    name: w.name.clone(),
                    pid: w.pid,
                    server_side: w.server_side,
                    cpu_seconds,
                    cpu_ms_per_join: per_join(cpu_seconds, succeeded),
                    peak_rss_mib: after.memory.peak_rss as f64 / MIB,
                    rss_mib: after.memory.rss as f64 / MIB,
                }
            })
            .collect()
    }
}

fn per_join(cpu_seconds: f64, succeeded: u64) -> Option<f64> {
    (succeeded > 0).then(|| cpu_seconds * 1e3 / succeeded as f64)
}

/// The report of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// What was loaded (e.g. `C: full joins`).
    pub label: String,
    /// How (e.g. `concurrency 64 for 5s`).
    pub mode: String,
    /// Closed-loop concurrency, if that was the mode.
    pub concurrency: Option<usize>,
    /// From the first join started to the last one answered.
    pub elapsed_seconds: f64,
    /// Simulated nodes that tried to join.
    pub joins: u64,
    pub succeeded: u64,
    pub failed: u64,
    /// Attempts beyond each node's first.
    pub retries: u64,
    /// Successful joins per second of `elapsed_seconds`.
    pub joins_per_second: f64,
    /// Of successful joins, retries and backoff included.
    pub latency: Latency,
    /// Final failures by status and message class.
    pub errors: Vec<ErrorCount>,
    /// Failures that were retried, by status and message class.
    pub retried_errors: Vec<ErrorCount>,
    /// Every watched process: the service's and the load generator's own.
    pub processes: Vec<ProcessCost>,
    /// Summed over the server-side processes but the control plane's, per successful join.
    pub server_cpu_ms_per_join: Option<f64>,
    /// Summed over kube-apiserver and etcd, per successful join; `None` where none is watched.
    pub control_plane_cpu_ms_per_join: Option<f64>,
    /// The requests the run made of the API server, when asked for.
    pub api: Option<crate::apiserver::ApiUse>,
    /// The SEV-SNP or TDX collateral the run looked up and fetched, and the cloud API lookups
    /// (GCE, EC2) it cost (attest-proxy's metrics), when asked for.
    pub collateral: Option<CollateralUse>,
}

impl Report {
    /// Builds the report of a run that took `elapsed`.
    pub fn new(
        label: &str,
        mode: &str,
        concurrency: Option<usize>,
        elapsed: Duration,
        outcomes: &[Outcome],
        readings: &ProcessReadings,
    ) -> Self {
        let succeeded = outcomes.iter().filter(|o| o.result.is_ok()).count() as u64;
        let joins = outcomes.len() as u64;
        let retries = outcomes.iter().map(|o| o.retried.len() as u64).sum();
        let latency = Latency::of(
            outcomes
                .iter()
                .filter(|o| o.result.is_ok())
                .map(|o| o.latency)
                .collect(),
        );
        let processes = readings.costs(succeeded);
        let control_plane = |p: &&ProcessCost| procstat::CONTROL_PLANE.contains(&p.name.as_str());
        let server_cpu: f64 = processes
            .iter()
            .filter(|p| p.server_side && !control_plane(p))
            .map(|p| p.cpu_seconds)
            .sum();
        let control_plane_cpu: f64 = processes
            .iter()
            .filter(control_plane)
            .map(|p| p.cpu_seconds)
            .sum();
        let any_server = processes.iter().any(|p| p.server_side);
        let any_control_plane = processes.iter().any(|p| control_plane(&p));
        let seconds = elapsed.as_secs_f64();
        Self {
            label: label.to_owned(),
            mode: mode.to_owned(),
            concurrency,
            elapsed_seconds: seconds,
            joins,
            succeeded,
            failed: joins - succeeded,
            retries,
            joins_per_second: if seconds > 0.0 {
                succeeded as f64 / seconds
            } else {
                0.0
            },
            latency,
            errors: tally(outcomes.iter().filter_map(|o| o.result.as_ref().err())),
            retried_errors: tally(outcomes.iter().flat_map(|o| &o.retried)),
            processes,
            server_cpu_ms_per_join: if any_server {
                per_join(server_cpu, succeeded)
            } else {
                None
            },
            control_plane_cpu_ms_per_join: if any_control_plane {
                per_join(control_plane_cpu, succeeded)
            } else {
                None
            },
            api: None,
            collateral: None,
        }
    }
}

fn opt_ms(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} ({})", self.label, self.mode)?;
        writeln!(
            f,
            "  joins      {} ok, {} failed, {} retries, in {:.2}s: {:.1} joins/s",
            self.succeeded, self.failed, self.retries, self.elapsed_seconds, self.joins_per_second
        )?;
        let l = &self.latency;
        writeln!(
            f,
            "  latency    p50 {:.2} ms  p95 {:.2} ms  p99 {:.2} ms  max {:.2} ms  (mean {:.2} ms)",
            l.p50_ms, l.p95_ms, l.p99_ms, l.max_ms, l.mean_ms
        )?;
        if let Some(c) = &self.collateral {
            let per_join = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.4}"));
            if c.counts.collateral_cache {
                writeln!(
                    f,
                    "  collateral {} fetched, {} fetches failed, {} cache hits ({} stale), {} unavailable: {} fetches per join",
                    c.counts.fetches_ok,
                    c.counts.fetches_failed,
                    c.counts.hits_fresh + c.counts.hits_stale,
                    c.counts.hits_stale,
                    c.counts.unavailable,
                    per_join(c.fetches_per_join)
                )?;
            }
            for (name, lookups) in [("gce keys", c.counts.gce), ("ec2 images", c.counts.ec2)] {
                if let Some(g) = lookups {
                    writeln!(
                        f,
                        "  {name:<10} {} looked up, {} lookups failed, {} cache hits, {} unavailable: {} lookups per join",
                        g.ok,
                        g.failed,
                        g.hits,
                        g.unavailable,
                        per_join(c.cloud_lookups_per_join)
                    )?;
                }
            }
            if !c.counts.collateral_cache && c.counts.gce.is_none() && c.counts.ec2.is_none() {
                writeln!(
                    f,
                    "  lookups    none: attest-proxy fetches no collateral and asks no cloud API for this variant"
                )?;
            }
        }
        if let Some(api) = &self.api {
            writeln!(f, "  api server {api}")?;
        }
        for (title, errors) in [("errors", &self.errors), ("retried", &self.retried_errors)] {
            for (i, e) in errors.iter().enumerate() {
                let head = if i == 0 { title } else { "" };
                writeln!(f, "  {head:<10} {:>6} × {}: {}", e.count, e.code, e.class)?;
            }
        }
        if !self.processes.is_empty() {
            writeln!(
                f,
                "  {:<28} {:>8} {:>10} {:>12} {:>10} {:>9}",
                "process", "pid", "cpu s", "cpu ms/join", "peak MiB", "rss MiB"
            )?;
            for p in &self.processes {
                let name = if p.server_side {
                    p.name.clone()
                } else {
                    format!("{} (client)", p.name)
                };
                writeln!(
                    f,
                    "  {:<28} {:>8} {:>10.3} {:>12} {:>10.1} {:>9.1}",
                    name,
                    p.pid,
                    p.cpu_seconds,
                    opt_ms(p.cpu_ms_per_join),
                    p.peak_rss_mib,
                    p.rss_mib
                )?;
            }
            writeln!(
                f,
                "  service CPU per join: {} ms",
                opt_ms(self.server_cpu_ms_per_join)
            )?;
            if self.control_plane_cpu_ms_per_join.is_some() {
                writeln!(
                    f,
                    "  control plane (kube-apiserver, etcd) CPU per join: {} ms",
                    opt_ms(self.control_plane_cpu_ms_per_join)
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procstat::Memory;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let sorted: Vec<Duration> = (1..=100).map(ms).collect();
        assert_eq!(percentile(&sorted, 0.50), Some(ms(50)));
        assert_eq!(percentile(&sorted, 0.95), Some(ms(95)));
        assert_eq!(percentile(&sorted, 0.99), Some(ms(99)));
        assert_eq!(percentile(&sorted, 1.0), Some(ms(100)));
        assert_eq!(percentile(&sorted, 0.0), Some(ms(1)));
        // Few samples: p99 of ten values is the largest, p50 the fifth.
        let ten: Vec<Duration> = (1..=10).map(ms).collect();
        assert_eq!(percentile(&ten, 0.99), Some(ms(10)));
        assert_eq!(percentile(&ten, 0.50), Some(ms(5)));
        assert_eq!(percentile(&[ms(7)], 0.95), Some(ms(7)));
        assert_eq!(percentile(&[], 0.5), None);
    }

    #[test]
    fn latency_summary_sorts_first() {
        let l = Latency::of(vec![ms(30), ms(10), ms(20), ms(40)]);
        assert_eq!(l.count, 4);
        assert_eq!((l.p50_ms, l.p95_ms, l.max_ms), (20.0, 40.0, 40.0));
        assert!((l.mean_ms - 25.0).abs() < 1e-9);
        assert_eq!(Latency::of(vec![]), Latency::default());
    }

    #[test]
    fn message_classes_mask_what_varies() {
        assert_eq!(
            message_class("attestation verification queue is full (256 waiting); retry later"),
            "attestation verification queue is full (# waiting); retry later"
        );
        assert_eq!(
            message_class(&format!(
                "measurement 9: expected {}, got {}",
                "ab".repeat(32),
                "cd".repeat(32)
            )),
            "measurement #: expected <hex>, got <hex>"
        );
        // Words made of hex letters stay.
        assert_eq!(message_class("a bad decade"), "a bad decade");
        let long = "x".repeat(500);
        assert_eq!(message_class(&long).chars().count(), MAX_CLASS_LEN + 1);
    }

    #[test]
    fn report_counts_rates_and_cpu_per_join() {
        let busy = Failure::new(tonic::Code::ResourceExhausted, "queue full (256 waiting)");
        let down = Failure::new(tonic::Code::Unavailable, "join-core is unreachable");
        let ok = |latency, retried: Vec<Failure>| Outcome {
            latency,
            result: Ok(()),
            retried,
        };
        let outcomes = vec![
            ok(ms(10), vec![]),
            ok(ms(20), vec![busy.clone(), busy.clone()]),
            ok(ms(30), vec![down.clone()]),
            ok(ms(40), vec![]),
            Outcome {
                latency: ms(5000),
                result: Err(down.clone()),
                retried: vec![down.clone()],
            },
        ];
        let sample = |ticks, hwm_mib: u64| Sample {
            cpu_ticks: ticks,
            memory: Memory {
                peak_rss: hwm_mib << 20,
                rss: (hwm_mib / 2) << 20,
            },
        };
        let readings = ProcessReadings {
            watched: vec![
                Watched {
                    name: "attest-proxy".into(),
                    pid: 10,
                    server_side: true,
                },
                Watched {
                    name: "join-core".into(),
                    pid: 11,
                    server_side: true,
                },
                Watched {
                    name: "loadgen".into(),
                    pid: 12,
                    server_side: false,
                },
            ],
            before: vec![sample(100, 10), sample(50, 8), sample(0, 4)],
            after: vec![sample(140, 12), sample(70, 8), sample(400, 6)],
            ticks_per_second: 100,
        };
        let report = Report::new(
            "C",
            "count 5",
            Some(2),
            Duration::from_secs(2),
            &outcomes,
            &readings,
        );
        assert_eq!((report.joins, report.succeeded, report.failed), (5, 4, 1));
        assert_eq!(report.retries, 4);
        assert!((report.joins_per_second - 2.0).abs() < 1e-9);
        // The failed join's latency is not a latency of a join.
        assert_eq!(report.latency.max_ms, 40.0);
        assert_eq!(
            report.errors,
            vec![ErrorCount {
                code: "Unavailable".into(),
                class: "join-core is unreachable".into(),
                count: 1
            }]
        );
        assert_eq!(report.retried_errors.len(), 2);
        assert_eq!(report.retried_errors[0].code, "ResourceExhausted");
        assert_eq!(report.retried_errors[0].class, "queue full (# waiting)");
        assert_eq!(report.retried_errors[0].count, 2);
        // attest-proxy: 40 ticks = 0.4 s over 4 joins = 100 ms each.
        let proxy = &report.processes[0];
        assert!((proxy.cpu_seconds - 0.4).abs() < 1e-9);
        assert!((proxy.cpu_ms_per_join.unwrap() - 100.0).abs() < 1e-9);
        assert_eq!(proxy.peak_rss_mib, 12.0);
        assert_eq!(proxy.rss_mib, 6.0);
        // Service total: proxy 0.4 s + join-core 0.2 s; the client's 4 s are not in it.
        assert!((report.server_cpu_ms_per_join.unwrap() - 150.0).abs() < 1e-9);
        let text = report.to_string();
        assert!(text.contains("4 ok, 1 failed, 4 retries"), "{text}");
        assert!(text.contains("loadgen (client)"), "{text}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["latency"]["p50_ms"], 20.0);
        assert_eq!(json["errors"][0]["code"], "Unavailable");
    }

    #[test]
    fn nothing_succeeded_means_no_cost_per_join() {
        let readings = ProcessReadings {
            watched: vec![Watched {
                name: "p".into(),
                pid: 1,
                server_side: true,
            }],
            before: vec![Sample::default()],
            after: vec![Sample::default()],
            ticks_per_second: 100,
        };
        let outcomes = vec![Outcome {
            latency: ms(1),
            result: Err(Failure::new(tonic::Code::Unauthenticated, "no")),
            retried: vec![],
        }];
        let report = Report::new("x", "y", None, ms(100), &outcomes, &readings);
        assert_eq!(report.server_cpu_ms_per_join, None);
        assert_eq!(report.processes[0].cpu_ms_per_join, None);
        assert_eq!(report.joins_per_second, 0.0);
    }
}
