//! The key service client: state disk keys, the measurement secret and the emergency SSH CA seed.
//!
//! Every key is fetched under a [`RetryPolicy`]: a key service that is restarting (connection
//! refused, `Unavailable`) or slow is asked again after a jittered pause, and the whole fetch
//! ends by one deadline, so the node always hears back in bounded time. A join's keys are
//! fetched concurrently and before token-issuer is asked, so a key service failure creates
//! nothing in Kubernetes.
//!
//! The state disk key is the node's own and is fetched for every join. The measurement secret
//! and the SSH CA seed are the same for every node (the key service derives them from its master
//! secret, fixed when the cluster is created), so they are kept as [`ClusterKeys`] for
//! `max_age` after a fetch, the CA key pair made from the seed once: a join with kept cluster
//! keys asks the key service one question instead of three. This keeps nothing from join-core
//! that it could not have anyway, since it may ask the key service for both at any moment; what
//! the keeping changes is how long they sit in its memory, at most about twice `max_age` after
//! the last fetch ([`KeyClient::sweep`] drops them once expired, even when no join comes).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use proto::kms::GetDataKeyRequest;
use proto::kms::api_client::ApiClient;
use tonic::transport::{Channel, Endpoint, Uri};
use zeroize::Zeroizing;

use crate::call;
use crate::error::{KeyName, KmsError, TicketError};
use crate::metrics::{Backend, Metrics};
use crate::retry::{self, RetryPolicy};
use crate::ssh::SshCa;

/// Key id of the cluster's measurement secret.
pub const MEASUREMENT_SECRET_ID: &str = "measurementSecret";
/// Key id of the seed of the emergency SSH certificate authority (an Ed25519 key).
pub const SSH_CA_SEED_ID: &str = "ca_emergency_ssh";
/// Length of every key join-core asks for: state disk keys, the measurement secret and the
/// SSH CA seed are all 32 bytes in Constellation.
pub const KEY_LEN: usize = 32;

/// A state disk key and the measurement secret, wiped from memory unless handed on.
#[derive(Debug)]
pub struct NodeKeys {
    /// The node's state disk key.
    pub state_disk_key: Zeroizing<Vec<u8>>,
    /// The cluster's measurement secret.
    pub measurement_secret: Zeroizing<Vec<u8>>,
}

/// The keys every join gets alike, kept between joins.
///
/// The measurement secret is wiped once neither the keeper nor a join holds it. The CA key pair
/// is aws-lc-rs's, held by AWS-LC, which clears an allocation when it frees it; the seed it was
/// made from is wiped at once.
#[derive(Debug)]
pub struct ClusterKeys {
    /// The cluster's measurement secret.
    pub measurement_secret: Zeroizing<Vec<u8>>,
    /// The emergency SSH CA, made from the seed the key service gave.
    pub ssh_ca: SshCa,
    fetched: Instant,
}

/// What a join needs from the key service.
#[derive(Debug)]
pub struct JoinKeys {
    /// The node's state disk key.
    pub state_disk_key: Zeroizing<Vec<u8>>,
    /// The measurement secret and the SSH CA, fetched for this join or kept from an earlier one.
    pub cluster: Arc<ClusterKeys>,
}

/// The kept [`ClusterKeys`] and how long they may be used.
#[derive(Debug)]
struct Kept {
    max_age: Duration,
    keys: Mutex<Option<Arc<ClusterKeys>>>,
}

impl Kept {
    fn current(&self) -> Option<Arc<ClusterKeys>> {
        let mut kept = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match kept.as_ref() {
            Some(keys) if keys.fetched.elapsed() < self.max_age => Some(keys.clone()),
            Some(_) => {
                *kept = None;
                None
            }
            None => None,
        }
    }

    fn keep(&self, keys: &Arc<ClusterKeys>) {
        if self.max_age.is_zero() {
            return;
        }
        let mut kept = self
            .keys
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Concurrent first joins may each fetch; the newest fetch wins, all are equal.
        if kept.as_ref().is_none_or(|old| old.fetched <= keys.fetched) {
            *kept = Some(keys.clone());
        }
    }
}

/// Fetches keys over one HTTP/2 channel made at startup and shared by every request
/// (Constellation dials the key service anew for each key).
#[derive(Clone, Debug)]
pub struct KeyClient {
    client: ApiClient<Channel>,
    policy: RetryPolicy,
    metrics: Metrics,
    kept: Arc<Kept>,
}

impl KeyClient {
    /// A client for the key service at `endpoint`; connects on first use and reconnects by
    /// itself. Each key fetch ends within `policy.deadline`, retries included.
    pub fn new(endpoint: Uri, policy: RetryPolicy) -> Self {
        let channel = Endpoint::from(endpoint)
            .connect_timeout(policy.attempt_timeout)
            .connect_lazy();
        Self {
            client: ApiClient::new(channel),
            policy,
            metrics: Metrics::default(),
            kept: Arc::new(Kept {
                max_age: Duration::ZERO,
                keys: Mutex::new(None),
            }),
        }
    }

    /// Keeps the measurement secret and the SSH CA for `max_age` after each fetch; zero fetches
    /// them for every join.
    pub fn keeping_cluster_keys(mut self, max_age: Duration) -> Self {
        self.kept = Arc::new(Kept {
            max_age,
            keys: Mutex::new(None),
        });
        self
    }

    /// Drops the kept cluster keys once they are older than their `max_age`, checking every
    /// `max_age` until the client is gone; spawn it on the runtime. Without it, expired keys
    /// stay in memory until the next join replaces them.
    pub fn sweep(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let kept: Weak<Kept> = Arc::downgrade(&self.kept);
        let period = self.kept.max_age;
        async move {
            if period.is_zero() {
                return;
            }
            loop {
                tokio::time::sleep(period).await;
                match kept.upgrade() {
                    Some(kept) => drop(kept.current()),
                    None => return,
                }
            }
        }
    }

    /// Times every attempt at the key service in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The state disk key for `disk_uuid` and the measurement secret (kept or fetched
    /// concurrently). `disk_uuid` must have passed [`crate::request::check_disk_uuid`].
    pub async fn node_keys(&self, disk_uuid: &str) -> Result<NodeKeys, TicketError> {
        if let Some(cluster) = self.kept.current() {
            let state_disk_key = self.key(KeyName::StateDiskKey, disk_uuid).await?;
            return Ok(NodeKeys {
                state_disk_key,
                measurement_secret: Zeroizing::new(cluster.measurement_secret.to_vec()),
            });
        }
        // A rejoin needs no SSH CA, so nothing is kept from here.
        let (state_disk_key, measurement_secret) = tokio::try_join!(
            self.key(KeyName::StateDiskKey, disk_uuid),
            self.key(KeyName::MeasurementSecret, MEASUREMENT_SECRET_ID),
        )?;
        Ok(NodeKeys {
            state_disk_key,
            measurement_secret,
        })
    }

    /// The state disk key for `disk_uuid` and the cluster keys, kept or fetched concurrently
    /// with it. The first failure ends the fetch.
    pub async fn join_keys(&self, disk_uuid: &str) -> Result<JoinKeys, TicketError> {
        if let Some(cluster) = self.kept.current() {
            let state_disk_key = self.key(KeyName::StateDiskKey, disk_uuid).await?;
            return Ok(JoinKeys {
                state_disk_key,
                cluster,
            });
        }
        let (state_disk_key, cluster) = tokio::try_join!(
            self.key(KeyName::StateDiskKey, disk_uuid),
            self.cluster_keys(),
        )?;
        Ok(JoinKeys {
            state_disk_key,
            cluster,
        })
    }

    /// Fetches the measurement secret and the SSH CA seed, makes the CA and keeps both.
    async fn cluster_keys(&self) -> Result<Arc<ClusterKeys>, TicketError> {
        let (measurement_secret, ssh_ca_seed) = tokio::try_join!(
            self.key(KeyName::MeasurementSecret, MEASUREMENT_SECRET_ID),
            self.key(KeyName::SshCaSeed, SSH_CA_SEED_ID),
        )?;
        let ssh_ca = SshCa::from_seed(&ssh_ca_seed).map_err(TicketError::Ssh)?;
        let keys = Arc::new(ClusterKeys {
            measurement_secret,
            ssh_ca,
            fetched: Instant::now(),
        });
        self.kept.keep(&keys);
        Ok(keys)
    }

    async fn key(&self, key: KeyName, id: &str) -> Result<Zeroizing<Vec<u8>>, TicketError> {
        let fail = |source| TicketError::Kms { key, source };
        let response = retry::retry(self.policy, |timeout: Duration| {
            let mut client = self.client.clone();
            let message = GetDataKeyRequest {
                data_key_id: id.to_owned(),
                length: KEY_LEN as u32,
            };
            let metrics = &self.metrics;
            async move {
                let started = Instant::now();
                let result = call::with_deadline(
                    timeout,
                    client.get_data_key(call::request(message, timeout)),
                )
                .await;
                metrics.backend_call(
                    Backend::KeyService,
                    call::outcome(&result),
                    started.elapsed(),
                );
                result
            }
        })
        .await
        .map_err(|gave_up| {
            fail(KmsError::Call {
                attempts: gave_up.attempts,
                source: gave_up.last,
            })
        })?;
        let data_key = Zeroizing::new(response.data_key);
        if data_key.len() != KEY_LEN {
            return Err(fail(KmsError::WrongLength {
                expected: KEY_LEN,
                got: data_key.len(),
            }));
        }
        Ok(data_key)
    }
}
