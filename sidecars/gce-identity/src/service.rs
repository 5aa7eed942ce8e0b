//! The GceIdentity gRPC service: checks the name, asks Google, and maps the outcome to a gRPC
//! status in one place (NOT_FOUND and FAILED_PRECONDITION refuse the node, UNAVAILABLE tells it
//! to retry, with `retry-after` when Google gave one). Both calls share the name check, the
//! lookup counter (`call` and `result` labels) and the log line.

use std::sync::Arc;

use attestation::gce::{GceInstance, InstanceRef};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use proto::gceidentity::{
    GetConfidentialComputeRequest, GetConfidentialComputeResponse, GetSigningKeyRequest,
    GetSigningKeyResponse,
};
use tonic::{Request, Response, Status};

use crate::gce::{GceClient, GceError};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    call: &'static str,
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

    fn count(&self, call: &'static str, result: &'static str) {
        self.lookups.get_or_create(&Labels { call, result }).inc();
    }

    /// The instance a request names, checked as the verifier checks it.
    fn instance(
        &self,
        call: &'static str,
        project: String,
        zone: String,
        instance: String,
    ) -> Result<InstanceRef, Status> {
        InstanceRef::from_instance_info(&GceInstance {
            project_id: project,
            zone,
            instance_name: instance,
            ..GceInstance::default()
        })
        .map_err(|e| {
            self.count(call, "invalid");
            Status::invalid_argument(e.to_string())
        })
    }

    /// Counts and logs a failed call, and gives its status.
    fn failed(&self, call: &'static str, instance: &InstanceRef, error: &GceError) -> Status {
        self.count(
            call,
            match error {
                GceError::NotFound(_) => "not_found",
                GceError::NoSigningKey { .. } => "no_signing_key",
                GceError::Unreadable { .. } => "unreadable",
                GceError::Unavailable { .. } => "unavailable",
            },
        );
        match error {
            GceError::Unavailable {
                google: Some(google),
                ..
            } => tracing::warn!(%instance, %error, google, call, "the GCE API gave no answer"),
            _ => tracing::warn!(%instance, %error, call, "the GCE API gave no answer"),
        }
        status(error)
    }
}

/// The gRPC status for a failed lookup.
pub fn status(error: &GceError) -> Status {
    match error {
        GceError::NotFound(_) => Status::not_found(error.to_string()),
        GceError::NoSigningKey { .. } | GceError::Unreadable { .. } => {
            Status::failed_precondition(error.to_string())
        }
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
        const CALL: &str = "getShieldedInstanceIdentity";
        let r = request.into_inner();
        let instance = self.instance(CALL, r.project, r.zone, r.instance)?;
        match self.client.signing_key(&instance).await {
            Ok(spki) => {
                self.count(CALL, "ok");
                tracing::info!(%instance, "GCE vouched for a signing key");
                Ok(Response::new(GetSigningKeyResponse {
                    signing_key_spki: spki,
                }))
            }
            Err(error) => Err(self.failed(CALL, &instance, &error)),
        }
    }

    async fn get_confidential_compute(
        &self,
        request: Request<GetConfidentialComputeRequest>,
    ) -> Result<Response<GetConfidentialComputeResponse>, Status> {
        const CALL: &str = "instances.get";
        let r = request.into_inner();
        let instance = self.instance(CALL, r.project, r.zone, r.instance)?;
        match self.client.confidential_compute(&instance).await {
            Ok(config) => {
                self.count(CALL, "ok");
                tracing::info!(%instance, %config, "GCE named the instance's confidential computing");
                Ok(Response::new(GetConfidentialComputeResponse {
                    enable_confidential_compute: config.enabled,
                    confidential_instance_type: config.instance_type,
                }))
            }
            Err(error) => Err(self.failed(CALL, &instance, &error)),
        }
    }
}
