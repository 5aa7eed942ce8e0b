//! Logging setup shared by every binary.

use std::io::Write as _;
use std::sync::OnceLock;

use tracing_subscriber::EnvFilter;

/// The format [`init`] installed, for [`audit`].
static FORMAT: OnceLock<LogFormat> = OnceLock::new();

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Installs the global tracing subscriber. The filter comes from `RUST_LOG` (default `info`; the TSS library's per-call chatter is kept to warnings).
pub fn init(format: LogFormat) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,tss_esapi=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour())
        .with_writer(std::io::stderr);
    let _ = FORMAT.set(format);
    // A second init (tests starting several services in one process) is harmless.
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}

/// Whether log lines may carry ANSI colour: only on a terminal, and not under `NO_COLOR`. A
/// container runtime, a file or a pipe gets plain text.
pub fn colour() -> bool {
    use std::io::IsTerminal as _;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Writes one audit record (`record`: a JSON object in canonical form) on the `audit` target:
/// in text logs as the line's message, in JSON logs as the line's `audit` object, not as an
/// escaped string, so a log collector indexes its fields. `accepted` lines are INFO, the rest
/// WARN. A JSON line is written whole to stderr, beside the subscriber's own lines; the filter
/// does not apply to it (an audit record is never filtered out).
pub fn audit(accepted: bool, record: &str) {
    if FORMAT.get() == Some(&LogFormat::Json) {
        let line = format!(
            "{{\"timestamp\":\"{}\",\"level\":\"{}\",\"target\":\"audit\",\"audit\":{record}}}\n",
            humantime::format_rfc3339_micros(std::time::SystemTime::now()),
            if accepted { "INFO" } else { "WARN" },
        );
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    } else if accepted {
        tracing::info!(target: "audit", "{record}");
    } else {
        tracing::warn!(target: "audit", "{record}");
    }
}
