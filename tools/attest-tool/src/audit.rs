//! `attest-tool audit verify`: checks the hash chains of the audit records in a log.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use attestation::audit_trail::{self, ChainSummary};

use crate::Outcome;

#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Check that no audit record in a log was altered, removed or inserted: each record's
    /// `prev` must be the SHA-256 of the record before it, its `seq` one more. Reads text or
    /// JSON logs of attest-proxy or join-client (other lines are skipped); each process start
    /// begins a new chain. Exit code 0: every chain intact, 1: a break (named by line).
    Verify {
        /// The log file (`-` for standard input).
        file: PathBuf,
    },
}

pub fn run(command: AuditCommand, out: &mut dyn Write) -> anyhow::Result<Outcome> {
    match command {
        AuditCommand::Verify { file } => {
            let text = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading standard input")?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?
            };
            match audit_trail::verify(text.lines()) {
                Ok(chains) if chains.is_empty() => {
                    writeln!(out, "no audit records in {}", file.display())?;
                    Ok(Outcome::Rejected)
                }
                Ok(chains) => {
                    for chain in &chains {
                        writeln!(out, "{}", describe(chain))?;
                    }
                    writeln!(
                        out,
                        "intact: {} chain(s), {} record(s); records cut off the end of a log cannot be detected",
                        chains.len(),
                        chains.iter().map(|c| c.records).sum::<u64>()
                    )?;
                    Ok(Outcome::Success)
                }
                Err(broken) => {
                    writeln!(out, "BROKEN at {broken}")?;
                    Ok(Outcome::Rejected)
                }
            }
        }
    }
}

fn describe(chain: &ChainSummary) -> String {
    let start = match &chain.start {
        Some(start) => format!(
            "chain of {} (pid {}) started {}",
            start["process"].as_str().unwrap_or("?"),
            start["pid"],
            start["time"].as_str().unwrap_or("?"),
        ),
        None => "chain whose start is not in this log".to_owned(),
    };
    format!(
        "line {}: {start}: {} record(s)",
        chain.first_line, chain.records
    )
}
