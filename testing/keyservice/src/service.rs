//! The `kms.API` gRPC service over [`MasterSecret`].

use std::sync::Arc;

use proto::kms::api_server::{Api, ApiServer};
use proto::kms::{GetDataKeyRequest, GetDataKeyResponse};
use tonic::{Request, Response, Status};

use crate::derive::{DeriveError, MasterSecret};

/// The gRPC server for `kms.API`.
pub(crate) fn server(master: Arc<MasterSecret>) -> ApiServer<KeyService> {
    ApiServer::new(KeyService { master })
}

#[derive(Debug)]
pub(crate) struct KeyService {
    master: Arc<MasterSecret>,
}

#[tonic::async_trait]
impl Api for KeyService {
    async fn get_data_key(
        &self,
        request: Request<GetDataKeyRequest>,
    ) -> Result<Response<GetDataKeyResponse>, Status> {
        let GetDataKeyRequest {
            data_key_id,
            length,
        } = request.into_inner();
        // u32 always fits in usize on the 64-bit targets we build for; saturate rather than
        // assume, the length check below then refuses it.
        let len = usize::try_from(length).unwrap_or(usize::MAX);
        match self.master.derive_key(&data_key_id, len) {
            Ok(key) => {
                tracing::debug!(id = %data_key_id, length, "data key issued");
                // The response buffer leaves our hands for encoding and cannot be wiped; the
                // derived copy is.
                Ok(Response::new(GetDataKeyResponse {
                    data_key: key.to_vec(),
                }))
            }
            Err(error) => {
                tracing::warn!(id = %data_key_id, length, %error, "data key request refused");
                Err(to_status(error))
            }
        }
    }
}

/// Every derivation error is the caller's doing.
fn to_status(error: DeriveError) -> Status {
    match error {
        DeriveError::EmptyId | DeriveError::ZeroLength | DeriveError::TooLong { .. } => {
            Status::invalid_argument(error.to_string())
        }
    }
}
