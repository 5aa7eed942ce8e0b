//! `POST /dry-run` on the admin endpoint: the body is an attestation config; the answer says
//! which of the nodes whose evidence is kept ([`crate::evidence`]) its policy would refuse, and
//! why, by check ([`attestation::dry_run`]), as `attest-tool dry-run` does offline. Nothing is
//! applied.
//!
//! Who can call it is who can reach the admin port: the NetworkPolicy opens it to the
//! monitoring namespace (and the kubelet's probes come from the node). What a caller gets is
//! what the audit log already says about each node (peer, time, decision, check) plus how a
//! policy of its choosing would decide; it cannot change what is enforced. What it costs is
//! bounded: one dry run at a time (a second is answered 429), the body at most an attestation
//! config's size, and each re-decision of a record runs on behalf of the record's peer, so
//! collateral it makes the cache fetch counts against that peer's share as its join did.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use attestation::dry_run::Report;
use http::StatusCode;
use plumbing::admin::{Answer, AnswerFuture, PostRequest};

use crate::policy::Current;
use crate::status;

/// Where a posted config is said to come from in its errors.
const ORIGIN: &str = "the posted config";

/// The `/dry-run` handler over the policy in force (its variant and collateral sources) and
/// the evidence in `evidence_dir` (`None`: this proxy keeps none).
pub fn handler(
    policy: Arc<Current>,
    evidence_dir: Option<PathBuf>,
) -> impl Fn(PostRequest) -> AnswerFuture + Send + Sync + 'static {
    let busy = Arc::new(tokio::sync::Semaphore::new(1));
    move |request: PostRequest| {
        let (policy, dir, busy) = (policy.clone(), evidence_dir.clone(), busy.clone());
        Box::pin(async move {
            let Ok(permit) = busy.try_acquire_owned() else {
                return text(
                    StatusCode::TOO_MANY_REQUESTS,
                    "a dry run is already running; try again when it is done".to_owned(),
                );
            };
            let json = request
                .query
                .as_deref()
                .is_some_and(|q| q.split('&').any(|p| p == "format=json"));
            // Re-deciding is CPU work and file I/O: off the runtime's threads.
            let result = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                dry_run(&policy, dir.as_deref(), &request.body)
            })
            .await;
            match result {
                Ok(Ok(report)) if json => match serde_json::to_string(&report) {
                    Ok(body) => Answer {
                        status: StatusCode::OK,
                        content_type: "application/json",
                        body,
                    },
                    Err(error) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("cannot encode the report: {error}"),
                    ),
                },
                Ok(Ok(report)) => text(StatusCode::OK, report.explain().to_string()),
                Ok(Err((status, message))) => text(status, message),
                Err(error) => text(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("the dry run failed: {error}"),
                ),
            }
        })
    }
}

/// Decides every kept record again under the policy `raw` describes.
fn dry_run(
    policy: &Current,
    dir: Option<&Path>,
    raw: &[u8],
) -> Result<Report, (StatusCode, String)> {
    let Some(dir) = dir else {
        return Err((
            StatusCode::CONFLICT,
            "this proxy keeps no evidence (neither --evidence-dir nor --collateral-dir is set)"
                .to_owned(),
        ));
    };
    let candidate = policy
        .build_candidate(Path::new(ORIGIN), raw)
        .map_err(|error| (StatusCode::BAD_REQUEST, status::chain(&error)))?;
    let read = attestation::evidence::read_dir(dir).map_err(|error| {
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "cannot read the evidence directory {}: {error}",
                dir.display()
            ),
        )
    })?;
    let mut report = redecide(&read.records, &candidate);
    report.skipped.extend(
        read.skipped
            .iter()
            .map(|(path, why)| format!("{}: {why}", path.display())),
    );
    Ok(report)
}

/// The dry run of `candidate` over `records`, each on behalf of its peer.
pub fn redecide(
    records: &[attestation::evidence::Record],
    candidate: &crate::policy::Active,
) -> Report {
    attestation::dry_run::run_within(
        records,
        candidate.validator.as_ref(),
        &candidate.digest,
        |record, redecide| match record.decision.peer.parse::<SocketAddr>() {
            Ok(peer) => collateral::for_peer(peer.ip(), redecide),
            Err(_) => redecide(),
        },
    )
}

fn text(status: StatusCode, mut body: String) -> Answer {
    if !body.ends_with('\n') {
        body.push('\n');
    }
    Answer {
        status,
        content_type: "text/plain; charset=utf-8",
        body,
    }
}
