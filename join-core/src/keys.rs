//! The key service client: state disk keys, the measurement secret and the emergency SSH CA seed.
//!
//! Every key is fetched under a [`RetryPolicy`]: a key service that is restarting (connection
//! refused, `Unavailable`) or slow is asked again after a jittered pause, and the whole fetch
//! ends by one deadline, so the node always hears back in bounded time. A join's keys are
//! fetched concurrently and before token-issuer is asked, so a key service failure creates
//! nothing in Kubernetes.

use std::time::{Duration, Instant};

use proto::kms::GetDataKeyRequest;
use proto::kms::api_client::ApiClient;
use tonic::transport::{Channel, Endpoint, Uri};
use zeroize::Zeroizing;

use crate::call;
use crate::error::{KeyName, KmsError, TicketError};
use crate::metrics::{Backend, Metrics};
use crate::retry::{self, RetryPolicy};

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

/// What a join needs from the key service.
#[derive(Debug)]
pub struct JoinKeys {
    /// The keys a rejoin gets too.
    pub node: NodeKeys,
    /// The seed of the emergency SSH CA's Ed25519 key.
    pub ssh_ca_seed: Zeroizing<Vec<u8>>,
}

/// Fetches keys over one HTTP/2 channel made at startup and shared by every request
/// (Constellation dials the key service anew for each key).
#[derive(Clone, Debug)]
pub struct KeyClient {
    client: ApiClient<Channel>,
    policy: RetryPolicy,
    metrics: Metrics,
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
        }
    }

    /// Times every attempt at the key service in `metrics`.
    pub fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The state disk key for `disk_uuid` and the measurement secret, fetched concurrently.
    /// `disk_uuid` must have passed [`crate::request::check_disk_uuid`].
    pub async fn node_keys(&self, disk_uuid: &str) -> Result<NodeKeys, TicketError> {
        let (state_disk_key, measurement_secret) = tokio::try_join!(
            self.key(KeyName::StateDiskKey, disk_uuid),
            self.key(KeyName::MeasurementSecret, MEASUREMENT_SECRET_ID),
        )?;
        Ok(NodeKeys {
            state_disk_key,
            measurement_secret,
        })
    }

    /// [`Self::node_keys`] and the SSH CA seed, all three fetched concurrently. The first
    /// failure ends the fetch.
    pub async fn join_keys(&self, disk_uuid: &str) -> Result<JoinKeys, TicketError> {
        let (node, ssh_ca_seed) = tokio::try_join!(
            self.node_keys(disk_uuid),
            self.key(KeyName::SshCaSeed, SSH_CA_SEED_ID),
        )?;
        Ok(JoinKeys { node, ssh_ca_seed })
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
