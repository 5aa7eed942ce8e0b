//! The key service client: state disk keys and the measurement secret.

use std::time::Duration;

use proto::kms::GetDataKeyRequest;
use proto::kms::api_client::ApiClient;
use tonic::transport::{Channel, Endpoint, Uri};
use zeroize::Zeroizing;

use crate::call;
use crate::error::{KeyName, KmsError, TicketError};

/// Key id of the cluster's measurement secret.
pub const MEASUREMENT_SECRET_ID: &str = "measurementSecret";
/// Length of the measurement secret and of state disk keys, as Constellation asks for them.
pub const KEY_LEN: usize = 32;

/// A state disk key and the measurement secret, wiped from memory unless handed on.
#[derive(Debug)]
pub struct NodeKeys {
    /// The node's state disk key.
    pub state_disk_key: Zeroizing<Vec<u8>>,
    /// The cluster's measurement secret.
    pub measurement_secret: Zeroizing<Vec<u8>>,
}

/// Fetches keys over one HTTP/2 channel made at startup and shared by every request
/// (Constellation dials the key service anew for each key).
#[derive(Clone, Debug)]
pub struct KeyClient {
    client: ApiClient<Channel>,
    deadline: Duration,
}

impl KeyClient {
    /// A client for the key service at `endpoint`; connects on first use and reconnects by
    /// itself.
    pub fn new(endpoint: Uri, deadline: Duration) -> Self {
        let channel = Endpoint::from(endpoint)
            .connect_timeout(deadline)
            .connect_lazy();
        Self {
            client: ApiClient::new(channel),
            deadline,
        }
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

    async fn key(&self, key: KeyName, id: &str) -> Result<Zeroizing<Vec<u8>>, TicketError> {
        let fail = |source| TicketError::Kms { key, source };
        let message = GetDataKeyRequest {
            data_key_id: id.to_owned(),
            length: KEY_LEN as u32,
        };
        let mut client = self.client.clone();
        let response = call::with_deadline(
            self.deadline,
            client.get_data_key(call::request(message, self.deadline)),
        )
        .await
        .map_err(|e| fail(e.into()))?;
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
