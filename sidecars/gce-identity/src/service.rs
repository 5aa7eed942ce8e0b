//! The GceIdentity gRPC service: checks the name, asks Google, and maps the outcome to a gRPC
//! status in one place (NOT_FOUND and FAILED_PRECONDITION refuse the node, UNAVAILABLE tells it
//! to retry, with `retry-after` when Google gave one).

use std::sync::Arc;

use attestation::snp::InstanceRef;
use attestation::snp::instance_info::GceInstance;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use proto::gceidentity::{GetSigningKeyRequest, GetSigningKeyResponse};
use tonic::{Request, Response, Status};

use crate::gce::{GceClient, GceError};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    result: &'static str,
}

/// Lookups by result, for `/metrics`.
pub type Lookups = Family<Labels, Counter>;

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    client: Arc<GceClient>,
    lookups: Lookups,
}

impl Service {
    pub fn new(client: Arc<GceClient>, lookups: Lookups) -> Self {
        Service { client, lookups }
    }

    fn count(&self, result: &'static str) {
        self.lookups.get_or_create(&Labels { result }).inc();
    }
}

/// The gRPC status for a failed lookup.
pub fn status(error: &GceError) -> Status {
    match error {
        GceError::NotFound(_) => Status::not_found(error.to_string()),
        GceError::NoSigningKey { .. } => Status::failed_precondition(error.to_string()),
        GceError::Unavailable { retry_after, .. } => {
            let mut status = Status::unavailable(error.to_string());
            if let Some(retry_after) = retry_after {
                status.metadata_mut().insert(
                    "retry-after",
                    tonic::metadata::MetadataValue::from(retry_after.as_secs()),
                );
            }
            status
        }
    }
}

#[tonic::async_trait]
impl proto::gceidentity::gce_identity_server::GceIdentity for Service {
    async fn get_signing_key(
        &self,
        request: Request<GetSigningKeyRequest>,
    ) -> Result<Response<GetSigningKeyResponse>, Status> {
        let request = request.into_inner();
        let instance = InstanceRef::from_instance_info(&GceInstance {
            project_id: request.project,
            zone: request.zone,
            instance_name: request.instance,
            ..GceInstance::default()
        })
        .map_err(|e| {
            self.count("invalid");
            Status::invalid_argument(e.to_string())
        })?;
        match self.client.signing_key(&instance).await {
            Ok(spki) => {
                self.count("ok");
                tracing::info!(%instance, "GCE vouched for a signing key");
                Ok(Response::new(GetSigningKeyResponse {
                    signing_key_spki: spki,
                }))
            }
            Err(error) => {
                self.count(match error {
                    GceError::NotFound(_) => "not_found",
                    GceError::NoSigningKey { .. } => "no_signing_key",
                    GceError::Unavailable { .. } => "unavailable",
                });
                match &error {
                    GceError::Unavailable {
                        google: Some(google),
                        ..
                    } => {
                        tracing::warn!(%instance, %error, google, "no signing key from the GCE API")
                    }
                    _ => tracing::warn!(%instance, %error, "no signing key from the GCE API"),
                }
                Err(status(&error))
            }
        }
    }
}
