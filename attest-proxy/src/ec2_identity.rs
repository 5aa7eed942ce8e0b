//! aws-nitro-tpm: what EC2 says about an image's TPM support, asked of the ec2-identity process
//! (which holds the AWS credential; this process holds none) and kept in a small bounded cache
//! shared by every join.
//!
//! The cache is the collateral cache ([`collateral::Cache`]) with the key
//! `ec2/{region}/{image}`, as gce_identity's is per instance: one call in flight per image, a
//! join waits at most `--ec2-identity-wait` for it, an answer is kept for `--ec2-identity-ttl`
//! (an image's `tpmSupport` is set when it is registered and cannot be changed; the image can
//! be deregistered), "not found" for at most [`NOT_FOUND_TTL`], and at most
//! `--ec2-identity-max-images` images are kept. A failed call backs off for
//! `--ec2-identity-backoff`, during which joins naming that image are told to retry at once. A
//! cluster's nodes share one image or a few, so after the first join of an image every later
//! one costs no EC2 call.
//!
//! Its metrics say how often EC2 was really asked: `ec2_identity_lookups_total{result}`,
//! `ec2_identity_hits_total` and `ec2_identity_unavailable_total`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use attestation::variants::aws_nitro_tpm::{Ec2ImageError, Ec2Images, ImageRef};
use collateral::{Cache, FetchError, FetchFuture, Fetched, Source};
use prometheus_client::registry::Registry;
use proto::ec2identity::GetImageTpmSupportRequest;
use proto::ec2identity::ec2_identity_client::Ec2IdentityClient;

/// How long "EC2 knows no such image" is believed.
pub const NOT_FOUND_TTL: Duration = Duration::from_secs(10);

/// The cached answer's first byte: a `tpmSupport` value follows, the image has none, or EC2
/// does not know it (its message follows).
const TPM: u8 = 2;
const NO_TPM: u8 = 1;
const NOT_FOUND: u8 = 0;

/// Asks ec2-identity over its Unix socket.
#[derive(Debug, Clone)]
pub struct Ec2IdentitySource {
    client: Ec2IdentityClient<tonic::transport::Channel>,
    ttl: Duration,
    timeout: Duration,
}

impl Ec2IdentitySource {
    /// A source asking the ec2-identity process on `socket`, which must run as `uid`.
    pub fn new(socket: &std::path::Path, uid: u32, ttl: Duration, timeout: Duration) -> Self {
        Ec2IdentitySource {
            client: Ec2IdentityClient::new(plumbing::unix::channel(socket, uid)),
            ttl,
            timeout,
        }
    }
}

fn image_of(key: &str) -> Option<GetImageTpmSupportRequest> {
    match key.split('/').collect::<Vec<_>>().as_slice() {
        ["ec2", region, image] => Some(GetImageTpmSupportRequest {
            region: (*region).to_owned(),
            image_id: (*image).to_owned(),
        }),
        _ => None,
    }
}

impl Source for Ec2IdentitySource {
    fn fetch(&self, key: &str) -> FetchFuture {
        let mut client = self.client.clone();
        let (ttl, timeout) = (self.ttl, self.timeout);
        let request = image_of(key);
        let key = key.to_owned();
        Box::pin(async move {
            let request =
                request.ok_or_else(|| FetchError::new(format!("{key} names no image")))?;
            let answer = tokio::time::timeout(timeout, client.get_image_tpm_support(request))
                .await
                .map_err(|_| {
                    FetchError::new(format!("ec2-identity did not answer within {timeout:?}"))
                })?;
            let now = SystemTime::now();
            let (bytes, lifetime) = match answer {
                Ok(answer) => match answer.into_inner().tpm_support {
                    Some(support) => {
                        let mut bytes = vec![TPM];
                        bytes.extend_from_slice(support.as_bytes());
                        (bytes, ttl)
                    }
                    None => (vec![NO_TPM], ttl),
                },
                // A definite answer about the image: the node is refused, not told to retry.
                Err(status) if status.code() == tonic::Code::NotFound => {
                    let mut bytes = vec![NOT_FOUND];
                    bytes.extend_from_slice(status.message().as_bytes());
                    (bytes, ttl.min(NOT_FOUND_TTL))
                }
                Err(status) => {
                    return Err(FetchError::new(format!(
                        "ec2-identity: {}",
                        status.message()
                    )));
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

/// The verifier's view: the cached answer for an image.
#[derive(Debug, Clone)]
pub struct CachedEc2Images {
    cache: Cache,
}

impl CachedEc2Images {
    pub fn new(cache: Cache) -> Self {
        CachedEc2Images { cache }
    }

    pub fn cache(&self) -> &Cache {
        &self.cache
    }
}

impl Ec2Images for CachedEc2Images {
    fn tpm_support(&self, image: &ImageRef) -> Result<Option<String>, Ec2ImageError> {
        let key = format!("ec2/{}/{}", image.region, image.image_id);
        let answer = self
            .cache
            .get(&key)
            .map_err(|e| Ec2ImageError::Unavailable(e.reason))?;
        match answer.split_first() {
            Some((&TPM, support)) => Ok(Some(String::from_utf8_lossy(support).into_owned())),
            Some((&NO_TPM, _)) => Ok(None),
            Some((&NOT_FOUND, message)) => Err(Ec2ImageError::NotFound(format!(
                "{image} ({})",
                String::from_utf8_lossy(message)
            ))),
            _ => Err(Ec2ImageError::Unavailable(format!(
                "a cached answer for {image} is unreadable"
            ))),
        }
    }
}

/// Registers the EC2 image cache's metrics (see the module docs).
pub fn register_metrics(registry: &mut Registry, cache: Cache) {
    registry.register_collector(Box::new(crate::sidecar_cache::Counters {
        cache,
        prefix: "ec2_identity",
        lookups_help: "Images asked of ec2-identity (and so of EC2's DescribeImages), by result; an image \
             EC2 does not know is an ok lookup",
        hits_help: "Images' TPM support answered from the cache",
        unavailable_help: "Joins whose image's TPM support could not be had in time: answered Unavailable",
    }));
}

/// The cache in front of ec2-identity, for `config`.
pub fn build(config: &crate::Config) -> Result<Option<Arc<CachedEc2Images>>, crate::Error> {
    if config.variant != attestation::Variant::AwsNitroTpm {
        return Ok(None);
    }
    let uid = config.ec2_identity_uid.ok_or_else(|| {
        crate::Error::Ec2Identity(
            "aws-nitro-tpm needs --ec2-identity-uid, the uid ec2-identity runs as".to_owned(),
        )
    })?;
    let source = Ec2IdentitySource::new(
        &config.ec2_identity_socket,
        uid,
        config.ec2_identity_ttl,
        // The call itself may take ec2-identity's own timeouts; the join waits less and retries.
        config.ec2_identity_wait.max(Duration::from_secs(15)),
    );
    let cache = crate::sidecar_cache::build(
        Arc::new(source),
        config.ec2_identity_wait,
        config.ec2_identity_backoff,
        config.ec2_identity_max_images,
    )
    .map_err(crate::Error::Ec2Identity)?;
    tracing::info!(
        socket = %config.ec2_identity_socket.display(),
        uid,
        "aws-nitro-tpm: EC2 is asked through ec2-identity"
    );
    Ok(Some(Arc::new(CachedEc2Images::new(cache))))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// EC2 as ec2-identity relays it: `ami-11111111` supports TPM 2.0, `ami-22222222` has no
    /// tpmSupport, `ami-33333333` is unknown, anything else cannot be asked just now.
    #[derive(Debug)]
    struct Api;

    impl Source for Api {
        fn fetch(&self, key: &str) -> FetchFuture {
            let key = key.to_owned();
            Box::pin(async move {
                let now = SystemTime::now();
                let bytes = match key.as_str() {
                    "ec2/r-1/ami-11111111" => b"\x02v2.0".to_vec(),
                    "ec2/r-1/ami-22222222" => vec![NO_TPM],
                    "ec2/r-1/ami-33333333" => vec![NOT_FOUND],
                    _ => return Err(FetchError::new("RequestLimitExceeded".to_owned())),
                };
                Ok(Fetched {
                    bytes,
                    refresh_after: now + Duration::from_secs(60),
                    stale_after: now + Duration::from_secs(60),
                })
            })
        }
    }

    fn image(id: &str) -> ImageRef {
        ImageRef::new("r-1", id).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_lookup_per_image_then_hits() {
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
        .unwrap_or_else(|e| panic!("{e}"));
        let mut registry = Registry::with_prefix("attest_proxy");
        register_metrics(&mut registry, cache.clone());
        let ec2 = CachedEc2Images::new(cache);
        let answers = tokio::task::spawn_blocking(move || {
            [
                ec2.tpm_support(&image("ami-11111111")),
                ec2.tpm_support(&image("ami-11111111")),
                ec2.tpm_support(&image("ami-11111111")),
                ec2.tpm_support(&image("ami-22222222")),
                ec2.tpm_support(&image("ami-33333333")),
                ec2.tpm_support(&image("ami-44444444")),
                ec2.tpm_support(&image("ami-44444444")),
            ]
        })
        .await
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answers[0], Ok(Some("v2.0".to_owned())));
        assert_eq!(answers[3], Ok(None));
        assert!(matches!(answers[4], Err(Ec2ImageError::NotFound(_))));
        assert!(matches!(answers[5], Err(Ec2ImageError::Unavailable(_))));
        assert!(matches!(answers[6], Err(Ec2ImageError::Unavailable(_))));

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry)
            .unwrap_or_else(|e| panic!("{e}"));
        for line in [
            "attest_proxy_ec2_identity_lookups_total{result=\"ok\"} 3",
            "attest_proxy_ec2_identity_lookups_total{result=\"failed\"} 1",
            "attest_proxy_ec2_identity_hits_total 2",
            "attest_proxy_ec2_identity_unavailable_total 2",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in\n{text}");
        }
    }

    #[test]
    fn keys_name_an_image() {
        let r = image_of("ec2/us-east-1/ami-12345678").unwrap_or_default();
        assert_eq!(
            (r.region.as_str(), r.image_id.as_str()),
            ("us-east-1", "ami-12345678")
        );
        assert!(image_of("ec2/us-east-1").is_none());
        assert!(image_of("gce/a/b/c").is_none());
    }
}
