//! The storm: a fleet of new nodes joining at once, per attestation variant, against the whole
//! system (`local-cluster`, as the benchmark's C), with the reference it is judged by measured in
//! the same run.
//!
//! For each variant: start local-cluster, warm it up, measure C's rate (a closed loop at
//! `rate_concurrency` for `rate_step`), then let `count` new nodes join with `concurrency` at
//! once (by default all of them), retrying as node-client does. The storm's time is compared
//! with `count ÷ C's rate`, the time the same joins take at C's pace; its collateral with the
//! items attest-proxy holds (a storm must fetch each item once, not once per node: the cache is
//! single-flight per item), and its cloud lookups with its joins.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use attestation::Variant;
use node_client::Backoff;
use serde::Serialize;
use soft_issuer::KeyType;

use crate::bench::{self, BenchConfig, Setup};
use crate::collateral::CollateralCounts;
use crate::procstat::Watched;
use crate::report::Report;
use crate::run::{self, LoadConfig, Mode, Stop};

/// How to run the storms.
#[derive(Clone, Debug)]
pub struct StormConfig {
    pub variants: Vec<Variant>,
    /// New nodes per storm.
    pub count: u64,
    /// Nodes joining at once during the storm.
    pub concurrency: usize,
    /// C's reference rate: this many nodes at a time ...
    pub rate_concurrency: usize,
    /// ... for this long.
    pub rate_step: Duration,
    /// Unmeasured load before the reference (as the benchmark's warm-up).
    pub warmup: Duration,
    /// Deadline of one attempt.
    pub timeout: Duration,
    /// How nodes retry (node-client's policy).
    pub retry: Backoff,
    /// qemu-vtpm's attestation keys.
    pub key_type: KeyType,
    /// Where storm.json and the processes' logs go.
    pub out_dir: PathBuf,
}

/// One variant's storm and its reference.
#[derive(Clone, Debug, Serialize)]
pub struct StormResult {
    pub variant: &'static str,
    /// C at `rate_concurrency`, just before the storm, on the same local-cluster.
    pub reference: Report,
    pub storm: Report,
    /// `count ÷ reference rate`, in seconds.
    pub count_over_rate_seconds: Option<f64>,
    /// The storm's time over `count_over_rate_seconds` (the target: at most 1.5).
    pub ratio: Option<f64>,
    /// attest-proxy's collateral and cloud counters since it started (every variant but
    /// qemu-vtpm).
    pub since_start: Option<CollateralCounts>,
    /// Collateral fetched (successfully) since attest-proxy started, per item it holds; `None`
    /// where it holds none.
    pub fetches_per_item: Option<f64>,
    /// Retried failures of the storm by gRPC code.
    pub retried_by_code: BTreeMap<String, u64>,
}

/// Runs a storm for every variant of `config`, printing each report as it comes.
pub async fn run(config: &StormConfig) -> anyhow::Result<Vec<StormResult>> {
    std::fs::create_dir_all(&config.out_dir)
        .with_context(|| format!("creating {}", config.out_dir.display()))?;
    println!(
        "load average {} at the start",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" ")
    );
    let bench_config = BenchConfig {
        setups: vec![Setup::C],
        concurrencies: vec![config.rate_concurrency],
        step: config.rate_step,
        warmup: config.warmup,
        timeout: config.timeout,
        retry: Some(config.retry),
        key_type: config.key_type,
        variants: config.variants.clone(),
        out_dir: config.out_dir.clone(),
    };
    let prefix = run::random_prefix();
    let mut results = Vec::new();
    for &variant in &config.variants {
        println!(
            "== storm {variant}: {} new nodes, {} at once",
            config.count, config.concurrency
        );
        let work = tempfile::Builder::new()
            .prefix("loadgen-storm-")
            .tempdir()?;
        let running = bench::start(Setup::C, variant, &bench_config, work.path())
            .await
            .with_context(|| format!("starting local-cluster for {variant}"))?;
        let mut watched = running.watched.clone();
        watched.push(Watched {
            name: "loadgen".to_owned(),
            pid: std::process::id(),
            server_side: false,
        });
        let load = |step: &str, mode: Mode, pregenerate: u64| LoadConfig {
            label: format!("{variant} {step}"),
            mode,
            timeout: config.timeout,
            retry: Some(config.retry),
            node_prefix: format!("{prefix}-{variant}-{step}"),
            spread_sources: true,
            pregenerate,
            collateral_metrics: running.collateral_metrics,
            api_server: running.api_server.clone(),
        };
        let logs = || format!("the end of its logs:\n{}", running.log_tails());
        if !config.warmup.is_zero() {
            let warm = load(
                "warm-up",
                Mode::Closed {
                    concurrency: 4,
                    stop: Stop::Duration(config.warmup),
                },
                0,
            );
            let report = run::run(running.target.clone(), &warm, &watched)
                .await
                .with_context(logs)?;
            if report.succeeded == 0 {
                bail!("{variant}: no join in the warm-up:\n{report}\n{}", logs());
            }
        }
        let reference = load(
            "reference",
            Mode::Closed {
                concurrency: config.rate_concurrency,
                stop: Stop::Duration(config.rate_step),
            },
            bench::pregenerate(0.0, config.rate_concurrency, config.rate_step),
        );
        let reference = run::run(running.target.clone(), &reference, &watched)
            .await
            .with_context(logs)?;
        println!("{reference}");
        let storm = load(
            "storm",
            Mode::Closed {
                concurrency: config.concurrency,
                stop: Stop::Count(config.count),
            },
            // Every node's keys made before the clock starts, as nodes make theirs at boot.
            config.count,
        );
        let storm = run::run(running.target.clone(), &storm, &watched)
            .await
            .with_context(logs)?;
        print!("{storm}");
        let since_start = match running.collateral_metrics {
            Some(admin) => Some(crate::collateral::read(admin).await?),
            None => None,
        };
        let result = judge(variant, config.count, reference, storm, since_start);
        println!("{}\n", line(&result));
        results.push(result);
        drop(running);
    }
    let json = config.out_dir.join("storm.json");
    std::fs::write(&json, serde_json::to_string_pretty(&results)?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("== storms");
    print!("{}", table(&results));
    println!("results: {}", json.display());
    Ok(results)
}

/// The storm against its reference.
pub fn judge(
    variant: Variant,
    count: u64,
    reference: Report,
    storm: Report,
    since_start: Option<CollateralCounts>,
) -> StormResult {
    let count_over_rate =
        (reference.joins_per_second > 0.0).then(|| count as f64 / reference.joins_per_second);
    let ratio = count_over_rate
        .filter(|&t| t > 0.0)
        .map(|t| storm.elapsed_seconds / t);
    let fetches_per_item = since_start
        .filter(|c| c.items > 0)
        .map(|c| c.fetches_ok as f64 / c.items as f64);
    let mut retried_by_code = BTreeMap::new();
    for e in &storm.retried_errors {
        *retried_by_code.entry(e.code.clone()).or_default() += e.count;
    }
    StormResult {
        variant: variant.name(),
        reference,
        storm,
        count_over_rate_seconds: count_over_rate,
        ratio,
        since_start,
        fetches_per_item,
        retried_by_code,
    }
}

fn cell(v: Option<f64>, precision: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.precision$}"))
}

/// The peak RSS of the storm's watched process `name`, in MiB.
fn peak(r: &StormResult, name: &str) -> Option<f64> {
    r.storm
        .processes
        .iter()
        .find(|p| p.name == name)
        .map(|p| p.peak_rss_mib)
}

/// One storm in a line, as the table has it.
fn line(r: &StormResult) -> String {
    let retried = if r.retried_by_code.is_empty() {
        "none".to_owned()
    } else {
        r.retried_by_code
            .iter()
            .map(|(code, n)| format!("{n} {code}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let collateral = match r.since_start {
        Some(c) if c.collateral_cache => format!(
            "{} fetches ({} failed) for {} items: {}",
            c.fetches_ok,
            c.fetches_failed,
            c.items,
            cell(r.fetches_per_item, 2)
        ),
        _ => "no collateral".to_owned(),
    };
    let cloud = r.storm.collateral.and_then(|c| {
        let lookups: u64 = [c.counts.gce, c.counts.ec2]
            .iter()
            .flatten()
            .map(|l| l.ok + l.failed)
            .sum();
        let api = match (c.counts.gce, c.counts.ec2) {
            (Some(_), _) => "GCE",
            (None, Some(_)) => "EC2",
            (None, None) => return None,
        };
        Some(format!("{lookups} {api} lookups"))
    });
    format!(
        "{:<19} | {:>5}/{:<5} | {:>7} | {:>7} | {:>5} | {:<24} | {:<40} | {:<16} | {:>6} {:>6}",
        r.variant,
        r.storm.succeeded,
        r.storm.joins,
        format!("{:.1}", r.storm.elapsed_seconds),
        cell(r.count_over_rate_seconds, 1),
        cell(r.ratio, 2),
        retried,
        collateral,
        cloud.unwrap_or_else(|| "none".to_owned()),
        cell(peak(r, "attest-proxy"), 0),
        cell(peak(r, "loadgen"), 0),
    )
}

/// Every storm, one line each.
pub fn table(results: &[StormResult]) -> String {
    let mut out = format!(
        "{:<19} | {:>11} | {:>7} | {:>7} | {:>5} | {:<24} | {:<40} | {:<16} | {:>13}\n",
        "variant",
        "joined",
        "time s",
        "n÷rate",
        "ratio",
        "retried by code",
        "collateral since start, per item",
        "cloud (storm)",
        "peak MiB ap lg"
    );
    for r in results {
        out.push_str(&line(r));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{ErrorCount, ProcessReadings};

    fn report(joins_per_second: f64, elapsed: f64, retried: Vec<ErrorCount>) -> Report {
        let mut r = Report::new(
            "x",
            "y",
            Some(1),
            Duration::from_secs(1),
            &[],
            &ProcessReadings {
                watched: vec![],
                before: vec![],
                after: vec![],
                ticks_per_second: 100,
            },
        );
        r.joins_per_second = joins_per_second;
        r.elapsed_seconds = elapsed;
        r.retried_errors = retried;
        r
    }

    #[test]
    fn a_storm_is_judged_by_count_over_the_reference_rate_and_its_collateral_per_item() {
        let retried = |code: &str, class: &str, count| ErrorCount {
            code: code.into(),
            class: class.into(),
            count,
        };
        let storm = report(
            0.0,
            15.0,
            vec![
                retried("Unavailable", "tcp connect", 10),
                retried("Unavailable", "tls handshake", 5),
                retried("ResourceExhausted", "busy", 2),
            ],
        );
        let counts = CollateralCounts {
            fetches_ok: 6,
            items: 6,
            collateral_cache: true,
            ..CollateralCounts::default()
        };
        let r = judge(
            Variant::AwsSevSnp,
            5000,
            report(500.0, 10.0, vec![]),
            storm,
            Some(counts),
        );
        assert_eq!(r.count_over_rate_seconds, Some(10.0));
        assert_eq!(r.ratio, Some(1.5));
        assert_eq!(r.fetches_per_item, Some(1.0));
        assert_eq!(
            r.retried_by_code.into_iter().collect::<Vec<_>>(),
            vec![
                ("ResourceExhausted".to_owned(), 2),
                ("Unavailable".to_owned(), 15)
            ]
        );
        // No reference rate (nothing joined): no ratio rather than a division by zero.
        let none = judge(
            Variant::QemuVtpm,
            10,
            report(0.0, 1.0, vec![]),
            report(0.0, 1.0, vec![]),
            None,
        );
        assert_eq!(
            (
                none.count_over_rate_seconds,
                none.ratio,
                none.fetches_per_item
            ),
            (None, None, None)
        );
        let text = table(&[none]);
        assert!(text.contains("no collateral"), "{text}");
    }
}
