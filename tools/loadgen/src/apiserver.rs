//! What joins cost the Kubernetes API server in requests: its own request counter
//! (`apiserver_request_total`, by verb, API group, resource and subresource, on its `/metrics`)
//! read before and after a run, with the admin kubeconfig local-cluster announces.
//!
//! The counter has no label for who asked. During a run token-issuer is the API server's only
//! client besides the API server itself, whose own loopback requests (its identity lease, the
//! `kubernetes` Service's endpoints) are left out: they come every ten seconds whatever the
//! joins, and none of them is a resource token-issuer touches.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

/// The API server's own periodic requests, left out of a run's count.
const OWN_RESOURCES: [&str; 3] = ["leases", "endpoints", "endpointslices"];

/// Why the API server's counters could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ApiServerError {
    #[error("reading the admin kubeconfig {path}")]
    Kubeconfig {
        path: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("a client for the API server")]
    Client(#[source] kube::Error),
    #[error("reading the API server's /metrics")]
    Metrics(#[source] kube::Error),
    #[error("the API server's /metrics has no apiserver_request_total")]
    Missing,
}

/// A client for the API server's `/metrics`.
#[derive(Clone)]
pub struct ApiServer(kube::Client);

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiServer")
    }
}

impl ApiServer {
    /// Connects with the kubeconfig at `path` (an identity allowed `get` on `/metrics`).
    pub async fn connect(path: &Path) -> Result<Self, ApiServerError> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|source| {
            ApiServerError::Kubeconfig {
                path: path.display().to_string(),
                source,
            }
        })?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .map_err(|source| ApiServerError::Kubeconfig {
                path: path.display().to_string(),
                source,
            })?;
        let client = kube::Client::try_from(config).map_err(ApiServerError::Client)?;
        Ok(Self(client))
    }

    /// The request counts now.
    pub async fn read(&self) -> Result<RequestCounts, ApiServerError> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| ApiServerError::Metrics(kube::Error::HttpError(e)))?;
        let text = self
            .0
            .request_text(request)
            .await
            .map_err(ApiServerError::Metrics)?;
        parse(&text).ok_or(ApiServerError::Missing)
    }
}

/// `apiserver_request_total` summed over response codes, scopes and versions, by verb and
/// resource (`group/resource/subresource`, the core group and empty parts left out).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RequestCounts(BTreeMap<(String, String), u64>);

/// The requests of one verb on one resource during a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Requests {
    pub verb: String,
    pub resource: String,
    pub count: u64,
    /// Per successful join; `None` without successful joins.
    pub per_join: Option<f64>,
}

/// What a run asked of the API server.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ApiUse {
    /// By verb and resource, in that order; only those the run made.
    pub requests: Vec<Requests>,
    /// All of them per successful join.
    pub per_join: Option<f64>,
}

impl ApiUse {
    /// The requests from `before` to `after` over a run with `succeeded` joins.
    pub fn between(before: &RequestCounts, after: &RequestCounts, succeeded: u64) -> Self {
        let per_join = |n: u64| (succeeded > 0).then(|| n as f64 / succeeded as f64);
        let requests: Vec<Requests> = after
            .0
            .iter()
            .filter_map(|((verb, resource), &n)| {
                let count = n.saturating_sub(
                    before
                        .0
                        .get(&(verb.clone(), resource.clone()))
                        .copied()
                        .unwrap_or(0),
                );
                (count > 0).then(|| Requests {
                    verb: verb.clone(),
                    resource: resource.clone(),
                    count,
                    per_join: per_join(count),
                })
            })
            .collect();
        let total = requests.iter().map(|r| r.count).sum();
        Self {
            requests,
            per_join: per_join(total),
        }
    }
}

/// The request counts in the API server's Prometheus text exposition; `None` if it has none.
pub fn parse(exposition: &str) -> Option<RequestCounts> {
    let mut counts = BTreeMap::new();
    let mut found = false;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        found = true;
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let labels = labels_of(labels);
        let label = |name: &str| labels.get(name).map_or("", String::as_str);
        let resource = label("resource");
        // Non-resource requests (`/metrics`, `/readyz`) and the API server's own.
        if resource.is_empty() || OWN_RESOURCES.contains(&resource) {
            continue;
        }
        let name: Vec<&str> = [label("group"), resource, label("subresource")]
            .into_iter()
            .filter(|part| !part.is_empty())
            .collect();
        // A counter: a whole number, exposed as a float.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let value = value as u64;
        *counts
            .entry((label("verb").to_owned(), name.join("/")))
            .or_insert(0) += value;
    }
    found.then_some(RequestCounts(counts))
}

/// The labels of one series (`a="x",b="y"`), their values unescaped (`\\`, `\"`, `\n`).
fn labels_of(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').trim().to_owned(), value);
        rest = &after[end..];
    }
    labels
}

impl std::fmt::Display for ApiUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let per_join = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{v:.3}"));
        write!(f, "{} per join:", per_join(self.per_join))?;
        for r in &self.requests {
            write!(f, " {} {} {}", r.verb, r.resource, per_join(r.per_join))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests broken out for each verb, dry run value, group, version, resource, scope, component, and HTTP response code.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="POST",version="v1"} 10
apiserver_request_total{code="403",component="apiserver",dry_run="",group="",resource="secrets",scope="resource",subresource="",verb="POST",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="update.edgeless.systems",resource="joiningnodes",scope="cluster",subresource="",verb="APPLY",version="v1alpha1"} 7
apiserver_request_total{code="200",component="apiserver",dry_run="",group="update.edgeless.systems",resource="nodeversions",scope="cluster",subresource="status",verb="PATCH",version="v1alpha1"} 1
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 99
apiserver_request_total{code="200",component="",dry_run="",group="",resource="",scope="",subresource="/metrics",verb="GET",version=""} 4
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="weird\"name",scope="resource",subresource="",verb="GET",version="v1"} 3
"#;

    fn counts(pairs: &[(&str, &str, u64)]) -> RequestCounts {
        RequestCounts(
            pairs
                .iter()
                .map(|&(v, r, n)| ((v.to_owned(), r.to_owned()), n))
                .collect(),
        )
    }

    #[test]
    fn counts_are_summed_over_codes_and_named_by_group_resource_and_subresource() {
        assert_eq!(
            parse(EXPOSITION),
            Some(counts(&[
                ("APPLY", "update.edgeless.systems/joiningnodes", 7),
                ("GET", "weird\"name", 3),
                ("PATCH", "update.edgeless.systems/nodeversions/status", 1),
                ("POST", "secrets", 12),
            ])),
            "leases and non-resource requests are the API server's own or the reader's"
        );
        assert_eq!(parse("go_goroutines 12\n"), None);
    }

    #[test]
    fn a_run_is_what_grew_divided_by_its_joins() {
        let before = counts(&[("POST", "secrets", 10), ("GET", "nodeversions", 3)]);
        let after = counts(&[
            ("POST", "secrets", 14),
            ("GET", "nodeversions", 3),
            ("APPLY", "joiningnodes", 4),
        ]);
        let run = ApiUse::between(&before, &after, 4);
        assert_eq!(
            run.requests,
            vec![
                Requests {
                    verb: "APPLY".into(),
                    resource: "joiningnodes".into(),
                    count: 4,
                    per_join: Some(1.0)
                },
                Requests {
                    verb: "POST".into(),
                    resource: "secrets".into(),
                    count: 4,
                    per_join: Some(1.0)
                },
            ]
        );
        assert_eq!(run.per_join, Some(2.0));
        assert_eq!(
            run.to_string(),
            "2.000 per join: APPLY joiningnodes 1.000 POST secrets 1.000"
        );
        assert_eq!(ApiUse::between(&before, &after, 0).per_join, None);
    }
}
