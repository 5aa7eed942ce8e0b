//! gcp-sev-snp and gcp-sev-es: which attestation key the GCE API vouches for an instance (and,
//! for gcp-sev-es, whether it is a confidential VM), asked of the gce-identity process (which
//! holds the cloud credential; this process holds none) and kept in a small bounded cache shared
//! by every join.
//!
//! The cache is the collateral cache ([`collateral::Cache`]) with the keys
//! `gce/{project}/{zone}/{instance}` (the signing key) and `gce-cc/{project}/{zone}/{instance}`
//! (`confidentialInstanceConfig`): one call in flight per instance and question, a join waits at
//! most `--gce-identity-wait` for it, an answer is kept for `--gce-identity-ttl` (an instance's
//! vTPM key does not change while it exists, but the instance can be deleted and its name
//! reused), "not found" for at most [`NOT_FOUND_TTL`], never served past that, and at most
//! `--gce-identity-max-instances` answers are kept (and as many back off, and as many calls are
//! in flight; a gcp-sev-es instance takes two). A failed call backs off for Google's `Retry-After` (or `--gce-identity-backoff`),
//! during which joins of that instance are told to retry at once; a `Retry-After` also holds the
//! calls for every other instance not cached (each key here is one a node names), so invented
//! instance names cannot spend Google's rate limit.
//!
//! Its metrics ([`register_metrics`]) say how often the API was really asked:
//! `gce_identity_lookups_total{result}` (calls to gce-identity), `gce_identity_hits_total`
//! (answered from the cache) and `gce_identity_unavailable_total` (joins told to retry). A new
//! instance costs one lookup (gcp-sev-es: two), its later joins none; a storm of new nodes shows
//! here first.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use attestation::gce::{ConfidentialCompute, GceIdentity, GceKeyError, InstanceRef};
use collateral::{Cache, FetchError, FetchFuture, Fetched, Source};
use prometheus_client::registry::Registry;
use proto::gceidentity::gce_identity_client::GceIdentityClient;
use proto::gceidentity::{GetConfidentialComputeRequest, GetSigningKeyRequest};

/// How long "the API knows no such instance" is believed.
pub const NOT_FOUND_TTL: Duration = Duration::from_secs(10);

/// The cached answer's first byte: a key follows, or the API said the instance is unknown.
const FOUND: u8 = 1;
const NOT_FOUND: u8 = 0;

/// Asks gce-identity over its Unix socket.
#[derive(Debug, Clone)]
pub struct GceIdentitySource {
    client: GceIdentityClient<tonic::transport::Channel>,
    ttl: Duration,
    timeout: Duration,
}

impl GceIdentitySource {
    /// A source asking the gce-identity process on `socket`, which must run as `uid`.
    pub fn new(socket: &std::path::Path, uid: u32, ttl: Duration, timeout: Duration) -> Self {
        GceIdentitySource {
            client: GceIdentityClient::new(plumbing::unix::channel(socket, uid)),
            ttl,
            timeout,
        }
    }
}

/// What a cache key asks of gce-identity.
#[derive(Debug, PartialEq, Eq)]
enum Question {
    SigningKey(GetSigningKeyRequest),
    ConfidentialCompute(GetConfidentialComputeRequest),
}

fn question_of(key: &str) -> Option<Question> {
    let parts = key.split('/').collect::<Vec<_>>();
    let (kind, project, zone, instance) = match parts.as_slice() {
        [kind, project, zone, instance] => (*kind, *project, *zone, *instance),
        _ => return None,
    };
    let (project, zone, instance) = (project.to_owned(), zone.to_owned(), instance.to_owned());
    match kind {
        "gce" => Some(Question::SigningKey(GetSigningKeyRequest {
            project,
            zone,
            instance,
        })),
        "gce-cc" => Some(Question::ConfidentialCompute(
            GetConfidentialComputeRequest {
                project,
                zone,
                instance,
            },
        )),
        _ => None,
    }
}

/// The cached form of a confidential-computing answer: `enabled` as a byte, then the type.
fn encode_confidential(config: &ConfidentialCompute) -> Vec<u8> {
    let mut bytes = vec![u8::from(config.enabled)];
    bytes.extend_from_slice(config.instance_type.as_bytes());
    bytes
}

fn decode_confidential(bytes: &[u8]) -> Option<ConfidentialCompute> {
    let (&enabled, kind) = bytes.split_first()?;
    Some(ConfidentialCompute {
        enabled: enabled == 1,
        instance_type: String::from_utf8(kind.to_vec()).ok()?,
    })
}

impl Source for GceIdentitySource {
    fn fetch(&self, key: &str) -> FetchFuture {
        let mut client = self.client.clone();
        let (ttl, timeout) = (self.ttl, self.timeout);
        let question = question_of(key);
        let key = key.to_owned();
        Box::pin(async move {
            let question =
                question.ok_or_else(|| FetchError::new(format!("{key} names no instance")))?;
            let call = async {
                match question {
                    Question::SigningKey(request) => client
                        .get_signing_key(request)
                        .await
                        .map(|a| a.into_inner().signing_key_spki),
                    Question::ConfidentialCompute(request) => {
                        client.get_confidential_compute(request).await.map(|a| {
                            let a = a.into_inner();
                            encode_confidential(&ConfidentialCompute {
                                enabled: a.enable_confidential_compute,
                                instance_type: a.confidential_instance_type,
                            })
                        })
                    }
                }
            };
            let answer = tokio::time::timeout(timeout, call).await.map_err(|_| {
                FetchError::new(format!("gce-identity did not answer within {timeout:?}"))
            })?;
            let now = SystemTime::now();
            let (bytes, lifetime) = match answer {
                Ok(answer) => {
                    let mut bytes = vec![FOUND];
                    bytes.extend_from_slice(&answer);
                    (bytes, ttl)
                }
                // A definite answer about the instance: the node is refused, not told to retry.
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::NotFound | tonic::Code::FailedPrecondition
                    ) =>
                {
                    let mut bytes = vec![NOT_FOUND];
                    bytes.extend_from_slice(status.message().as_bytes());
                    (bytes, ttl.min(NOT_FOUND_TTL))
                }
                Err(status) => {
                    let retry_after = status
                        .metadata()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<u64>().ok())
                        .map(Duration::from_secs);
                    return Err(FetchError {
                        reason: format!("gce-identity: {}", status.message()),
                        retry_after,
                    });
                }
            };
            Ok(Fetched {
                bytes,
                refresh_after: now + lifetime,
                stale_after: now + lifetime,
            })
        })
    }
}

/// The verifier's view: the cached answer for an instance.
#[derive(Debug, Clone)]
pub struct CachedGceIdentity {
    cache: Cache,
}

impl CachedGceIdentity {
    pub fn new(cache: Cache) -> Self {
        CachedGceIdentity { cache }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

impl CachedGceIdentity {
    /// The cached answer to `kind` about `instance`: what followed [`FOUND`].
    fn answer(&self, kind: &str, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError> {
        let key = format!(
            "{kind}/{}/{}/{}",
            instance.project, instance.zone, instance.instance
        );
        let answer = self
            .cache
            .get(&key)
            .map_err(|e| GceKeyError::Unavailable(e.reason))?;
        match answer.split_first() {
            Some((&FOUND, found)) => Ok(found.to_vec()),
            Some((&NOT_FOUND, message)) => Err(GceKeyError::NotFound(format!(
                "{instance} ({})",
                String::from_utf8_lossy(message)
            ))),
            _ => Err(unreadable(instance)),
        }
    }
}

fn unreadable(instance: &InstanceRef) -> GceKeyError {
    GceKeyError::Unavailable(format!("a cached answer for {instance} is unreadable"))
}

impl GceIdentity for CachedGceIdentity {
    fn signing_key(&self, instance: &InstanceRef) -> Result<Vec<u8>, GceKeyError> {
        self.answer("gce", instance)
    }

    fn confidential_compute(
        &self,
        instance: &InstanceRef,
    ) -> Result<ConfidentialCompute, GceKeyError> {
        let bytes = self.answer("gce-cc", instance)?;
        decode_confidential(&bytes).ok_or_else(|| unreadable(instance))
    }
}

/// Registers the GCE key cache's metrics (see the module docs).
pub fn register_metrics(registry: &mut Registry, cache: Cache) {
    registry.register_collector(Box::new(crate::sidecar_cache::Counters {
        cache,
        prefix: "gce_identity",
        lookups_help: "Instances' keys (and, for gcp-sev-es, confidential-computing configs) asked of \
             gce-identity (and so of the GCE API), by result; an instance the API does not \
             know is an ok lookup",
        hits_help: "Instances' keys and configs answered from the cache",
        unavailable_help: "Joins whose instance's key could not be had in time: answered Unavailable",
    }));
}

/// The cache in front of gce-identity, for `config`.
pub fn build(config: &crate::Config) -> Result<Option<Arc<CachedGceIdentity>>, crate::Error> {
    use attestation::Variant;
    if !matches!(config.variant, Variant::GcpSevSnp | Variant::GcpSevEs) {
        return Ok(None);
    }
    let uid = config.gce_identity_uid.ok_or_else(|| {
        crate::Error::GceIdentity(format!(
            "{} needs --gce-identity-uid, the uid gce-identity runs as",
            config.variant
        ))
    })?;
    let source = GceIdentitySource::new(
        &config.gce_identity_socket,
        uid,
        config.gce_identity_ttl,
        // The call itself may take gce-identity's own timeout; the join waits less and retries.
        config.gce_identity_wait.max(Duration::from_secs(10)),
    );
    let cache = crate::sidecar_cache::build(
        Arc::new(source),
        config.gce_identity_wait,
        config.gce_identity_backoff,
        config.gce_identity_max_instances,
    )
    .map_err(crate::Error::GceIdentity)?;
    tracing::info!(
        socket = %config.gce_identity_socket.display(),
        uid,
        variant = %config.variant,
        "the GCE API is asked through gce-identity"
    );
    Ok(Some(Arc::new(CachedGceIdentity::new(cache))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GCE API as gce-identity relays it: `known` has a key, `gone` was deleted, and any
    /// other instance cannot be asked just now.
    #[derive(Debug)]
    struct Api;

    impl Source for Api {
        fn fetch(&self, key: &str) -> FetchFuture {
            let key = key.to_owned();
            Box::pin(async move {
                let now = SystemTime::now();
                let bytes = match key.as_str() {
                    "gce/p/z/known" => vec![FOUND, 0x30, 0x01],
                    "gce/p/z/gone" => vec![NOT_FOUND],
                    _ => return Err(FetchError::new("503 from the API".to_owned())),
                };
                Ok(Fetched {
                    bytes,
                    refresh_after: now + Duration::from_secs(60),
                    stale_after: now + Duration::from_secs(60),
                })
            })
        }
    }

    fn instance(name: &str) -> InstanceRef {
        InstanceRef {
            project: "p".to_owned(),
            zone: "z".to_owned(),
            instance: name.to_owned(),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn metrics_count_lookups_hits_and_joins_told_to_retry() {
        let cache = Cache::new(
            Arc::new(Api),
            collateral::CacheConfig {
                dir: None,
                max_stale: Duration::ZERO,
                wait: Duration::from_secs(2),
                backoff: Duration::from_secs(60),
                max_entries: Some(16),
                ..collateral::CacheConfig::default()
            },
            tokio::runtime::Handle::current(),
        )
        .unwrap();
        let mut registry = Registry::with_prefix("attest_proxy");
        register_metrics(&mut registry, cache.clone());
        let gce = CachedGceIdentity::new(cache);
        // The cache waits for its fetch by blocking: off the runtime's workers.
        let answers = tokio::task::spawn_blocking(move || {
            [
                gce.signing_key(&instance("known")),
                gce.signing_key(&instance("known")),
                gce.signing_key(&instance("known")),
                gce.signing_key(&instance("gone")),
                gce.signing_key(&instance("down")),
                // Backing off: not asked again, told to retry at once.
                gce.signing_key(&instance("down")),
            ]
        })
        .await
        .unwrap();
        assert_eq!(answers[0].as_deref().ok(), Some(&[0x30, 0x01][..]));
        assert!(matches!(answers[3], Err(GceKeyError::NotFound(_))));
        assert!(matches!(answers[4], Err(GceKeyError::Unavailable(_))));
        assert!(matches!(answers[5], Err(GceKeyError::Unavailable(_))));

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        for line in [
            "attest_proxy_gce_identity_lookups_total{result=\"ok\"} 2",
            "attest_proxy_gce_identity_lookups_total{result=\"failed\"} 1",
            "attest_proxy_gce_identity_hits_total 2",
            "attest_proxy_gce_identity_unavailable_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn keys_name_an_instance_and_a_question() {
        assert_eq!(
            question_of("gce/my-project/us-east1-b/w-1"),
            Some(Question::SigningKey(GetSigningKeyRequest {
                project: "my-project".to_owned(),
                zone: "us-east1-b".to_owned(),
                instance: "w-1".to_owned(),
            }))
        );
        assert_eq!(
            question_of("gce-cc/my-project/us-east1-b/w-1"),
            Some(Question::ConfidentialCompute(
                GetConfidentialComputeRequest {
                    project: "my-project".to_owned(),
                    zone: "us-east1-b".to_owned(),
                    instance: "w-1".to_owned(),
                }
            ))
        );
        assert!(question_of("gce/a/b").is_none());
        assert!(question_of("crl/Milan").is_none());
        assert!(question_of("vcek/Milan/a/b").is_none());
    }

    #[test]
    fn confidential_answers_survive_the_cache() {
        for config in [
            ConfidentialCompute::default(),
            ConfidentialCompute {
                enabled: true,
                instance_type: "SEV".to_owned(),
            },
        ] {
            assert_eq!(
                decode_confidential(&encode_confidential(&config)),
                Some(config)
            );
        }
        assert_eq!(decode_confidential(&[]), None);
    }
}
