//! The Certifier gRPC service: one call, mapped to a gRPC status in one place.

use std::sync::Arc;
use std::time::SystemTime;

use atls::CertifyError;
use atls::server_evidence::{Window, certify};
use attestation::Issuer;
use proto::certifier::{CertifyRequest, CertifyResponse};
use tonic::{Request, Response, Status};

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    issuer: Arc<dyn Issuer>,
}

impl Service {
    pub fn new(issuer: Arc<dyn Issuer>) -> Self {
        Service { issuer }
    }
}

/// The gRPC status for a refused or failed certification.
pub fn status(error: &CertifyError) -> Status {
    let text = attestation::audit::chain(error);
    match error {
        CertifyError::MalformedKey | CertifyError::WindowLength { .. } => {
            Status::invalid_argument(text)
        }
        CertifyError::NotCurrent { .. } => Status::failed_precondition(text),
        CertifyError::Issue(_) => Status::unavailable(text),
    }
}

#[tonic::async_trait]
impl proto::certifier::certifier_server::Certifier for Service {
    async fn certify(
        &self,
        request: Request<CertifyRequest>,
    ) -> Result<Response<CertifyResponse>, Status> {
        let request = request.into_inner();
        let window = Window {
            not_before: request.not_before,
            not_after: request.not_after,
        };
        let issuer = self.issuer.clone();
        // A quote blocks (a TPM takes its time); keep it off the runtime's workers.
        let result = tokio::task::spawn_blocking(move || {
            certify(issuer.as_ref(), &request.spki, window, SystemTime::now())
        })
        .await
        .map_err(|e| Status::internal(format!("the certification task failed: {e}")))?;
        match result {
            Ok(document) => {
                tracing::info!(%window, "certified a server key");
                Ok(Response::new(CertifyResponse {
                    variant: self.issuer.variant().name().to_owned(),
                    document,
                }))
            }
            Err(error) => {
                tracing::warn!(%window, error = %attestation::audit::chain(&error), "refused to certify");
                Err(status(&error))
            }
        }
    }
}
