//! The benchmark's figures as Markdown, one table per attestation variant, as the README shows
//! them (`results.md` beside `results.json`).

use std::fmt::Write as _;

use attestation::Variant;

use crate::Report;
use crate::bench::{BenchResults, Setup};

/// One table per variant B and C ran for, each row a concurrency: throughput, the server side's
/// CPU per operation, p99 latency, the ratios to A, and what the joins cost in collateral fetches
/// and cloud lookups (where the variant has any).
pub fn markdown(results: &BenchResults) -> String {
    let mut out = String::new();
    let m = &results.machine;
    let _ = writeln!(
        out,
        "{} CPUs ({}), the load generator on the same cores; CPU is the server-side processes' per successful operation.\n",
        m.cpus, m.cpu_model
    );
    for &variant in &results.config.variants {
        let _ = writeln!(out, "### {}\n", variant.name());
        let lookups = results
            .config
            .concurrencies
            .iter()
            .any(|&c| lookup_cell(step(results, Setup::C, Some(variant), c)).is_some());
        let _ = write!(
            out,
            "| nodes at once | joins/s (C) | ops/s A / B | CPU ms/op A / B / C | p99 ms A / B / C | B/A CPU | C/A CPU |"
        );
        let _ = writeln!(
            out,
            "{}",
            if lookups {
                " fetches and lookups per join (C) | failed |"
            } else {
                " failed |"
            }
        );
        let columns = if lookups { 9 } else { 8 };
        let _ = writeln!(out, "|{}", "---|".repeat(columns));
        for &c in &results.config.concurrencies {
            let a = step(results, Setup::A, None, c);
            let b = step(results, Setup::B, Some(variant), c);
            let cc = step(results, Setup::C, Some(variant), c);
            if b.is_none() && cc.is_none() {
                continue;
            }
            let failed: u64 = [a, b, cc].into_iter().flatten().map(|r| r.failed).sum();
            let _ = write!(
                out,
                "| {c} | {} | {} / {} | {} / {} / {} | {} / {} / {} | {} | {} |",
                num(cc.map(|r| r.joins_per_second), 0),
                num(a.map(|r| r.joins_per_second), 0),
                num(b.map(|r| r.joins_per_second), 0),
                num(a.and_then(|r| r.server_cpu_ms_per_join), 3),
                num(b.and_then(|r| r.server_cpu_ms_per_join), 3),
                num(cc.and_then(|r| r.server_cpu_ms_per_join), 3),
                num(a.map(|r| r.latency.p99_ms), 1),
                num(b.map(|r| r.latency.p99_ms), 1),
                num(cc.map(|r| r.latency.p99_ms), 1),
                num(ratio(b, a), 2),
                num(ratio(cc, a), 2),
            );
            if lookups {
                let _ = write!(
                    out,
                    " {} |",
                    lookup_cell(cc).unwrap_or_else(|| "-".to_owned())
                );
            }
            let _ = writeln!(out, " {failed} |");
        }
        out.push('\n');
    }
    out
}

fn step(
    results: &BenchResults,
    setup: Setup,
    variant: Option<Variant>,
    concurrency: usize,
) -> Option<&Report> {
    results
        .setups
        .iter()
        .find(|s| s.setup == setup && (setup == Setup::A || s.variant == variant))?
        .steps
        .iter()
        .find(|r| r.concurrency == Some(concurrency))
}

/// Server CPU per operation of `over` divided by `under`'s.
fn ratio(over: Option<&Report>, under: Option<&Report>) -> Option<f64> {
    let (over, under) = (
        over?.server_cpu_ms_per_join?,
        under?.server_cpu_ms_per_join?,
    );
    (under > 0.0).then(|| over / under)
}

/// The step's collateral fetches and cloud lookups per join, where the variant has them.
fn lookup_cell(report: Option<&Report>) -> Option<String> {
    let used = report?.collateral?;
    let mut parts = Vec::new();
    if let Some(fetches) = used.fetches_per_join {
        parts.push(format!("collateral {fetches:.3}"));
    }
    if let Some(cloud) = used.cloud_lookups_per_join {
        parts.push(format!("cloud API {cloud:.3}"));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn num(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}
