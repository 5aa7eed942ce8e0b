//! attest-proxy's own attestation: keeps its aTLS server key certified by the certifier, so nodes
//! with a service policy can tell the real join service from an impostor (ARCHITECTURE.md, "The
//! service attests itself").
//!
//! attest-proxy never reaches the attestation device. Every [`Schedule::rotate_every`] it makes
//! a new key, asks a [`Certifier`] for evidence over it and its window, and installs the
//! certified key with [`atls::Acceptor::rotate`]; connections already in their handshake keep
//! the key they started with, and the previous certificate stays valid for its own window. When
//! the certifier fails it retries with doubling waits; only when the key in use would expire
//! before the next try does it fall back to an uncertified key, because an expired certificate
//! would also break Go nodes (they check the dates), while an uncertified one only makes nodes
//! with a service policy refuse, which is the truth: the service cannot prove itself then.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use atls::{Acceptor, ServerCredential, ServerKey, Window};
use attestation::Variant;
use futures::future::BoxFuture;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use proto::certifier::CertifyRequest;
use proto::certifier::certifier_client::CertifierClient;

/// Why the certifier did not certify a key.
#[derive(Debug, thiserror::Error)]
pub enum CertifierError {
    /// It could not be reached or did not answer in time: try again later.
    #[error("the certifier is unavailable: {0}")]
    Unavailable(String),
    /// It answered with a refusal (a window it will not certify, a device failure).
    #[error("the certifier refused: {0}")]
    Refused(String),
}

/// Obtains evidence for a server key: the certifier process behind its socket, in production.
pub trait Certifier: Send + Sync + fmt::Debug {
    /// The variant and document certifying `spki` for `window`.
    fn certify<'a>(
        &'a self,
        spki: &'a [u8],
        window: Window,
    ) -> BoxFuture<'a, Result<(Variant, Vec<u8>), CertifierError>>;
}

/// Why a rotation did not produce a certified key.
#[derive(Debug, thiserror::Error)]
pub enum RotationError {
    /// A key or certificate could not be made.
    #[error("cannot make the server key")]
    Key(#[source] atls::SetupError),
    /// The certifier failed.
    #[error("cannot certify the server key")]
    Certifier(#[source] CertifierError),
    /// The certifier answered with evidence of another variant than the proxy's own.
    #[error("the certifier answered with {actual} evidence; this service attests as {expected}")]
    Variant { expected: Variant, actual: Variant },
    /// The vendor collateral nodes need to check the evidence is not available (yet): evidence
    /// nodes cannot check is not served.
    #[error("no vendor collateral for the certified evidence, so nodes could not check it")]
    Collateral(#[source] atls::server_collateral::GatherError),
    /// The collateral task failed.
    #[error("the collateral task failed: {0}")]
    Task(String),
}

/// The vendor collateral sources attest-proxy runs to verify nodes; they also serve what nodes
/// need to check the service's own SEV-SNP or TDX evidence, which goes into its certificate.
#[derive(Clone, Debug, Default)]
pub struct OwnCollateral {
    pub amd: Option<Arc<dyn attestation::snp::SnpCollateral>>,
    pub intel: Option<Arc<dyn attestation::tdx::TdxCollateral>>,
}

impl OwnCollateral {
    /// What nodes need beside `document`; `None` for variants that need nothing from a vendor.
    /// Runs off the runtime's workers: the sources wait (boundedly) for a fetch.
    async fn gather(
        &self,
        variant: Variant,
        document: Arc<Vec<u8>>,
    ) -> Result<Option<atls::server_collateral::ServerCollateral>, RotationError> {
        let sources = self.clone();
        tokio::task::spawn_blocking(move || {
            atls::server_collateral::gather(
                variant,
                &document,
                sources.amd.as_deref(),
                sources.intel.as_deref(),
            )
        })
        .await
        .map_err(|e| RotationError::Task(e.to_string()))?
        .map_err(RotationError::Collateral)
    }
}

/// The certifier process, asked over its Unix socket (after checking it runs as its uid).
#[derive(Debug, Clone)]
pub struct GrpcCertifier {
    client: CertifierClient<tonic::transport::Channel>,
    timeout: Duration,
}

impl GrpcCertifier {
    /// Asks the certifier on `socket`, which must run as `uid`; each call gets `timeout`.
    pub fn new(socket: &std::path::Path, uid: u32, timeout: Duration) -> Self {
        Self {
            client: CertifierClient::new(plumbing::unix::channel(socket, uid)),
            timeout,
        }
    }
}

impl Certifier for GrpcCertifier {
    fn certify<'a>(
        &'a self,
        spki: &'a [u8],
        window: Window,
    ) -> BoxFuture<'a, Result<(Variant, Vec<u8>), CertifierError>> {
        Box::pin(async move {
            let mut client = self.client.clone();
            let request = CertifyRequest {
                spki: spki.to_vec(),
                not_before: window.not_before,
                not_after: window.not_after,
            };
            let answer = tokio::time::timeout(self.timeout, client.certify(request))
                .await
                .map_err(|_| CertifierError::Unavailable("no answer in time".to_owned()))?
                .map_err(|status| match status.code() {
                    tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                        CertifierError::Refused(status.message().to_owned())
                    }
                    _ => CertifierError::Unavailable(format!(
                        "{:?}: {}",
                        status.code(),
                        status.message()
                    )),
                })?
                .into_inner();
            let variant = answer.variant.parse::<Variant>().map_err(|_| {
                CertifierError::Refused(format!("unknown variant {:?}", answer.variant))
            })?;
            Ok((variant, answer.document))
        })
    }
}

/// When to rotate and how to retry.
#[derive(Clone, Copy, Debug)]
pub struct Schedule {
    /// How long a certified key serves before the next is certified.
    pub rotate_every: Duration,
    /// The first wait after a failed certification; it doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
}

impl Default for Schedule {
    fn default() -> Self {
        Self {
            rotate_every: Duration::from_secs(60 * 60),
            retry_min: Duration::from_secs(5),
            retry_max: Duration::from_secs(5 * 60),
        }
    }
}

/// What one step did, for logs, metrics and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A newly certified key is in use.
    Certified,
    /// Certification failed; the key in use stays (it is valid beyond the next try).
    Kept,
    /// Certification failed and the key in use would expire: an uncertified key is in use.
    FellBack,
}

/// Keeps one acceptor's key certified.
#[derive(Debug)]
pub struct Rotator {
    certifier: Arc<dyn Certifier>,
    variant: Variant,
    collateral: OwnCollateral,
    schedule: Schedule,
    /// The wait after the next failure.
    retry: Duration,
    /// The wait before the next step, as the last step decided (none before the first).
    next: Duration,
    /// 1 while the key in use is certified.
    certified: Gauge,
    /// When the certificate in use expires, Unix seconds.
    not_after: Gauge,
}

impl Rotator {
    pub fn new(certifier: Arc<dyn Certifier>, variant: Variant, schedule: Schedule) -> Self {
        Self {
            certifier,
            variant,
            collateral: OwnCollateral::default(),
            schedule,
            retry: schedule.retry_min,
            next: Duration::ZERO,
            certified: Gauge::default(),
            not_after: Gauge::default(),
        }
    }

    /// Takes the vendor collateral for the certified documents from `collateral`; a rotation
    /// whose collateral cannot be had fails as a certifier failure does.
    pub fn with_collateral(mut self, collateral: OwnCollateral) -> Self {
        self.collateral = collateral;
        self
    }

    /// Registers `server_key_certified` (1 while nodes with a service policy can verify this
    /// service) and `server_key_not_after_seconds` (when the certificate in use expires).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register(
            "server_key_certified",
            "1 while the aTLS server key in use is certified by the certifier",
            self.certified.clone(),
        );
        registry.register(
            "server_key_not_after_seconds",
            "When the aTLS server certificate in use expires, Unix seconds",
            self.not_after.clone(),
        );
    }

    /// A key certified at `now`.
    pub async fn certified(&self, now: SystemTime) -> Result<ServerCredential, RotationError> {
        let key = ServerKey::generate(Window::for_rotation_at(now)).map_err(RotationError::Key)?;
        let (variant, document) = self
            .certifier
            .certify(key.spki(), key.window())
            .await
            .map_err(RotationError::Certifier)?;
        if variant != self.variant {
            return Err(RotationError::Variant {
                expected: self.variant,
                actual: variant,
            });
        }
        let document = Arc::new(document);
        let collateral = self.collateral.gather(variant, document.clone()).await?;
        let document = Arc::unwrap_or_clone(document);
        match collateral {
            Some(collateral) => key.with_evidence_and_collateral(variant, document, &collateral),
            None => key.with_evidence(variant, document),
        }
        .map_err(RotationError::Key)
    }

    /// Tries to certify a new key at `now` and installs what the outcome calls for; returns
    /// what it did and how long to wait before the next step.
    pub async fn step(&mut self, acceptor: &Acceptor, now: SystemTime) -> (Step, Duration) {
        let (step, wait) = self.try_step(acceptor, now).await;
        self.next = wait;
        let current = acceptor.current();
        self.certified.set(i64::from(current.variant().is_some()));
        self.not_after.set(current.window().not_after);
        (step, wait)
    }

    async fn try_step(&mut self, acceptor: &Acceptor, now: SystemTime) -> (Step, Duration) {
        match self.certified(now).await {
            Ok(credential) => {
                tracing::info!(window = %credential.window(), variant = %self.variant, "server key certified");
                acceptor.rotate(credential);
                self.retry = self.schedule.retry_min;
                (Step::Certified, self.schedule.rotate_every)
            }
            Err(error) => {
                let wait = self.retry;
                self.retry = (self.retry * 2).min(self.schedule.retry_max);
                let current = acceptor.current();
                let next_try = now + wait;
                // Any key valid beyond the next try is better kept than replaced by an
                // uncertified one (a certified key, or the uncertified one already in use).
                let step = if current.window().contains(next_try) {
                    Step::Kept
                } else {
                    match ServerKey::generate(Window::for_rotation_at(now))
                        .and_then(ServerKey::unattested)
                    {
                        Ok(unattested) => {
                            acceptor.rotate(unattested);
                            Step::FellBack
                        }
                        // Nothing better to serve; the next step tries again.
                        Err(_) => Step::Kept,
                    }
                };
                tracing::error!(
                    error = %attestation::audit::chain(&error),
                    retry_in = ?wait,
                    fell_back = step == Step::FellBack,
                    "cannot certify the server key; nodes with a service policy refuse this service once its certified key expires"
                );
                (step, wait)
            }
        }
    }

    /// Runs [`step`](Self::step) on schedule until `shutdown`, starting with the wait the last
    /// step asked for (at once if there was none).
    pub async fn run(mut self, acceptor: Arc<Acceptor>, shutdown: plumbing::shutdown::Shutdown) {
        loop {
            tokio::select! {
                () = tokio::time::sleep(self.next) => {}
                () = shutdown.clone().wait() => return,
            }
            self.step(&acceptor, SystemTime::now()).await;
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Mutex;

    use attestation::Issuer;
    use soft_issuer::SoftIssuer;

    use super::*;

    /// A certifier with the real rules (atls::server_evidence::certify) on a software device,
    /// that can be told to fail.
    #[derive(Debug)]
    struct InProcess {
        issuer: Box<dyn Issuer>,
        down: Mutex<bool>,
        clock: Mutex<SystemTime>,
    }

    impl InProcess {
        fn new(issuer: impl Issuer + 'static) -> Self {
            InProcess {
                issuer: Box::new(issuer),
                down: Mutex::new(false),
                clock: Mutex::new(SystemTime::now()),
            }
        }
    }

    impl Certifier for InProcess {
        fn certify<'a>(
            &'a self,
            spki: &'a [u8],
            window: Window,
        ) -> BoxFuture<'a, Result<(Variant, Vec<u8>), CertifierError>> {
            Box::pin(async move {
                if *self.down.lock().unwrap() {
                    return Err(CertifierError::Unavailable("connection refused".into()));
                }
                let now = *self.clock.lock().unwrap();
                atls::server_evidence::certify(self.issuer.as_ref(), spki, window, now)
                    .map(|document| (self.issuer.variant(), document))
                    .map_err(|e| CertifierError::Refused(e.to_string()))
            })
        }
    }

    fn setup() -> (Arc<InProcess>, Rotator, Acceptor) {
        let certifier = Arc::new(InProcess::new(SoftIssuer::ecdsa_p256().unwrap()));
        let rotator = Rotator::new(certifier.clone(), Variant::QemuVtpm, Schedule::default());
        (certifier, rotator, Acceptor::new().unwrap())
    }

    #[tokio::test]
    async fn certifies_on_schedule_and_keeps_the_key_while_the_certifier_is_down() {
        let (certifier, mut rotator, acceptor) = setup();
        let start = SystemTime::now();
        assert_eq!(acceptor.current().variant(), None, "starts uncertified");

        let (step, wait) = rotator.step(&acceptor, start).await;
        assert_eq!((step, wait), (Step::Certified, Duration::from_secs(3600)));
        let first = acceptor.current();
        assert_eq!(first.variant(), Some(Variant::QemuVtpm));
        assert_eq!(first.window(), Window::for_rotation_at(start));
        assert_eq!(rotator.certified.get(), 1);
        assert_eq!(rotator.not_after.get(), first.window().not_after);

        // The certifier goes away: the certified key stays, retries back off.
        *certifier.down.lock().unwrap() = true;
        let an_hour_later = start + Duration::from_secs(3600);
        let mut waits = Vec::new();
        for _ in 0..3 {
            let (step, wait) = rotator.step(&acceptor, an_hour_later).await;
            assert_eq!(step, Step::Kept);
            waits.push(wait.as_secs());
        }
        assert_eq!(waits, [5, 10, 20]);
        assert_eq!(acceptor.current().certificate(), first.certificate());

        // Back: a new key, and the retry wait starts over.
        *certifier.down.lock().unwrap() = false;
        *certifier.clock.lock().unwrap() = an_hour_later;
        let (step, _) = rotator.step(&acceptor, an_hour_later).await;
        assert_eq!(step, Step::Certified);
        assert_ne!(acceptor.current().certificate(), first.certificate());
        *certifier.down.lock().unwrap() = true;
        assert_eq!(rotator.step(&acceptor, an_hour_later).await.1.as_secs(), 5);
    }

    #[tokio::test]
    async fn falls_back_to_an_uncertified_key_only_when_the_certified_one_would_expire() {
        let (certifier, mut rotator, acceptor) = setup();
        let start = SystemTime::now();
        rotator.step(&acceptor, start).await;
        let certified = acceptor.current();
        *certifier.down.lock().unwrap() = true;

        // Three hours on, the window ends now: the next try would be past it.
        let at_expiry = start + Duration::from_secs(3 * 3600);
        let (step, _) = rotator.step(&acceptor, at_expiry).await;
        assert_eq!(step, Step::FellBack);
        let fallback = acceptor.current();
        assert_eq!(fallback.variant(), None);
        assert_eq!(rotator.certified.get(), 0, "the metric says so");
        assert_eq!(rotator.not_after.get(), fallback.window().not_after);
        assert_ne!(fallback.certificate(), certified.certificate());
        assert!(
            fallback.window().contains(at_expiry),
            "the fallback is valid now, so Go nodes keep joining"
        );
    }

    #[tokio::test]
    async fn snp_evidence_is_served_only_with_the_collateral_nodes_need_to_check_it() {
        use attestation::snp::{Crl, Product, StaticCollateral, Tcb};
        use soft_issuer::snp::{ReportFields, SimulatedAmd, SnpDocumentIssuer};

        let amd = SimulatedAmd::new(Product::Milan).unwrap();
        let tcb = Tcb {
            fmc: None,
            bootloader: 3,
            tee: 0,
            snp: 8,
            microcode: 115,
        };
        let vlek = amd.vlek("CN=cc-eu-west-1.amazonaws.com", tcb).unwrap();
        let machine = SnpDocumentIssuer::aws(
            SoftIssuer::ecdsa_p256().unwrap(),
            &vlek,
            &amd.vlek_chain_pem(),
            ReportFields::default(),
        )
        .unwrap();
        let certifier = Arc::new(InProcess::new(machine));
        let rotator = |collateral: StaticCollateral| {
            Rotator::new(certifier.clone(), Variant::AwsSevSnp, Schedule::default())
                .with_collateral(OwnCollateral {
                    amd: Some(Arc::new(collateral)),
                    intel: None,
                })
        };

        // AMD's CRL is not at hand yet: the rotation fails as a certifier failure does, and the
        // evidence is not served.
        let mut waiting = rotator(StaticCollateral::new());
        let error = waiting.certified(SystemTime::now()).await.unwrap_err();
        assert!(matches!(error, RotationError::Collateral(_)), "{error}");
        assert!(
            attestation::audit::chain(&error).contains("no Milan CRL for VLEK chains"),
            "{}",
            attestation::audit::chain(&error)
        );
        let acceptor = Acceptor::new().unwrap();
        let (step, wait) = waiting.step(&acceptor, SystemTime::now()).await;
        assert_eq!((step, wait), (Step::Kept, Schedule::default().retry_min));
        assert_eq!(acceptor.current().variant(), None);
        assert_eq!(waiting.certified.get(), 0);

        // With it, the certificate carries the evidence and AMD's CRL.
        let now = std::time::UNIX_EPOCH.elapsed().unwrap().as_secs();
        let crl = Crl::from_der(amd.crl(&[], now - 3600, now + 86_400).unwrap()).unwrap();
        let mut ready = rotator(StaticCollateral::new().with_crl(Product::Milan, crl));
        let (step, _) = ready.step(&acceptor, SystemTime::now()).await;
        assert_eq!(step, Step::Certified);
        let current = acceptor.current();
        assert_eq!(current.variant(), Some(Variant::AwsSevSnp));
        let (_, cert) =
            x509_parser::parse_x509_certificate(current.certificate().as_ref()).unwrap();
        let carried = atls::server_collateral::find_collateral(&cert).unwrap();
        match atls::server_collateral::ServerCollateral::decode(carried).unwrap() {
            atls::server_collateral::ServerCollateral::Amd(amd) => {
                assert!(amd.intermediate.is_none(), "the document carries the ASVK");
                assert!(amd.signer.is_none(), "the document carries the VLEK");
            }
            other => panic!("expected AMD collateral, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn refuses_evidence_of_another_variant() {
        #[derive(Debug)]
        struct Wrong;
        impl Certifier for Wrong {
            fn certify<'a>(
                &'a self,
                _: &'a [u8],
                _: Window,
            ) -> BoxFuture<'a, Result<(Variant, Vec<u8>), CertifierError>> {
                Box::pin(async { Ok((Variant::AwsSevSnp, Vec::new())) })
            }
        }
        let rotator = Rotator::new(Arc::new(Wrong), Variant::QemuVtpm, Schedule::default());
        let error = rotator.certified(SystemTime::now()).await.unwrap_err();
        assert!(matches!(
            error,
            RotationError::Variant {
                expected: Variant::QemuVtpm,
                actual: Variant::AwsSevSnp
            }
        ));
    }
}
