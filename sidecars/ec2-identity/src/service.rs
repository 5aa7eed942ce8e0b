//! The Ec2Identity gRPC service: checks the name, asks EC2, and maps the outcome to a gRPC
//! status in one place (NOT_FOUND refuses the node, UNAVAILABLE tells it to retry).

use std::sync::Arc;

use attestation::variants::aws_nitro_tpm::ImageRef;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use proto::ec2identity::{GetImageTpmSupportRequest, GetImageTpmSupportResponse};
use tonic::{Request, Response, Status};

use crate::ec2::{Ec2Client, Ec2Error};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Labels {
    result: &'static str,
}

/// Lookups by result, for `/metrics`.
pub type Lookups = Family<Labels, Counter>;

/// The service.
#[derive(Debug, Clone)]
pub struct Service {
    client: Arc<Ec2Client>,
    lookups: Lookups,
}

impl Service {
    pub fn new(client: Arc<Ec2Client>, lookups: Lookups) -> Self {
        Service { client, lookups }
    }

    fn count(&self, result: &'static str) {
        self.lookups.get_or_create(&Labels { result }).inc();
    }
}

/// The gRPC status for a failed lookup.
pub fn status(error: &Ec2Error) -> Status {
    match error {
        Ec2Error::NotFound(_) => Status::not_found(error.to_string()),
        Ec2Error::Unavailable { .. } => Status::unavailable(error.to_string()),
    }
}

#[tonic::async_trait]
impl proto::ec2identity::ec2_identity_server::Ec2Identity for Service {
    async fn get_image_tpm_support(
        &self,
        request: Request<GetImageTpmSupportRequest>,
    ) -> Result<Response<GetImageTpmSupportResponse>, Status> {
        let request = request.into_inner();
        let image = ImageRef::new(&request.region, &request.image_id).map_err(|e| {
            self.count("invalid");
            Status::invalid_argument(e.to_string())
        })?;
        match self.client.tpm_support(&image).await {
            Ok(tpm_support) => {
                self.count("ok");
                tracing::info!(%image, tpm_support = tpm_support.as_deref().unwrap_or("none"), "EC2 described an image");
                Ok(Response::new(GetImageTpmSupportResponse { tpm_support }))
            }
            Err(error) => {
                self.count(match error {
                    Ec2Error::NotFound(_) => "not_found",
                    Ec2Error::Unavailable { .. } => "unavailable",
                });
                match &error {
                    Ec2Error::Unavailable { aws: Some(aws), .. } => {
                        tracing::warn!(%image, %error, aws, "no answer from EC2")
                    }
                    _ => tracing::warn!(%image, %error, "no answer from EC2"),
                }
                Err(status(&error))
            }
        }
    }
}
