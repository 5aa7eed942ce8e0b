//! The measurement policy in force, the validator built from it, and its hot reload.
//!
//! Each connection takes the current validator once (a cheap `Arc` clone under a short lock) and
//! verifies with it lock-free, so a policy swap never waits for, or blocks, a verification, and
//! a connection in flight keeps the validator it took at handshake time.
//!
//! The file is re-read every poll interval and applied when its bytes change. Polling rather
//! than inotify: the kubelet updates a ConfigMap volume by writing a new `..<timestamp>`
//! directory and renaming the `..data` symlink onto it, so the mounted file is a symlink through
//! `..data` whose target directory disappears after each update. An inotify watch on the file
//! follows the old inode and goes silent after the first swap; one on the directory needs care
//! for remove/create and re-watching, and still wants a periodic re-read as a safety net. Reading
//! a few kilobytes once a second resolves the path afresh every time, so the symlink swap, an
//! editor's remove-and-create and a replaced mount all look the same, and costs nothing
//! measurable. The kubelet itself takes up to a minute to project a change, so a second of
//! polling adds no noticeable delay.
//!
//! With a [`Guard`], a valid new file is first tried on the evidence attest-proxy kept of the
//! nodes it accepted lately ([`attestation::dry_run`]): if it would refuse more than the
//! guard's share of them, it is held (logged, `policy_held`, a `/readyz` note) and the policy
//! in force stays, until the file changes again. A file whose `"forceReload"` names its own
//! policy digest is applied without the check: the operator's way to roll out a change that is
//! meant to refuse nodes, with nothing but the ConfigMap edit that changes the policy itself.
//! The field names one digest, so a value left behind never forces the next change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use attestation::snp::{GceIdentity, SnpCollateral};
use attestation::tdx::TdxCollateral;
use attestation::variants::aws_nitro_tpm::{AwsNitroTpmValidator, Ec2Images};
use attestation::variants::sev_snp::{Binding, SevSnpValidator};
use attestation::variants::tdx::{TdxKind, TdxValidator};
use attestation::{Validator, Variant};
use plumbing::shutdown::Shutdown;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::status;

/// Why no validator could be built.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The attestation config file could not be read.
    #[error("cannot read attestation config {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The attestation config is not a valid policy for the variant.
    #[error("attestation config {path} is not a valid {variant} policy")]
    Invalid {
        path: PathBuf,
        variant: Variant,
        #[source]
        source: attestation::policy::PolicyError,
    },
    /// No validator exists for the configured variant.
    #[error("attestation variant {0} is not supported by this build")]
    Unsupported(Variant),
}

/// Where the hardware variants get what documents leave out, per vendor. Kept across reloads:
/// a new policy gets a new validator over the same caches.
#[derive(Clone, Debug)]
pub enum Hardware {
    /// The SEV-SNP variants: AMD collateral and, for gcp-sev-snp, the key the GCE API vouches
    /// for.
    Amd {
        collateral: Arc<dyn SnpCollateral>,
        gce: Option<Arc<dyn GceIdentity>>,
    },
    /// The TDX variants: Intel collateral.
    Intel { collateral: Arc<dyn TdxCollateral> },
    /// gcp-sev-es: no vendor collateral, only what the GCE API says about an instance.
    Google { gce: Arc<dyn GceIdentity> },
    /// aws-nitro-tpm: what EC2 says about an image's TPM support.
    Ec2 { images: Arc<dyn Ec2Images> },
}

/// A validator together with the digest of the policy it enforces.
#[derive(Clone, Debug)]
pub struct Active {
    pub validator: Arc<dyn Validator>,
    /// Covers everything the validator decides by: measurements and trusted keys.
    pub digest: String,
    /// The policy trusts any attestation key (`"trustAnyAk": true`): development only.
    pub trust_any_ak: bool,
}

/// Builds the validator for `variant` from attestation config bytes read from `path`. A config
/// that trusts no attestation key or enforces no measurement is invalid, at start as on reload.
/// The SNP variants take their collateral (and gcp-sev-snp its GCE keys) from `hardware`, the
/// TDX variants theirs, gcp-sev-es what the GCE API says.
fn build(
    variant: Variant,
    path: &Path,
    raw: &[u8],
    hardware: Option<&Hardware>,
) -> Result<Active, PolicyError> {
    let invalid = |source| PolicyError::Invalid {
        path: path.to_owned(),
        variant,
        source,
    };
    match variant {
        Variant::QemuVtpm => {
            let config =
                attestation::QemuVtpmConfig::from_attestation_config(raw).map_err(invalid)?;
            Ok(Active {
                digest: config.digest(),
                trust_any_ak: config.ak_trust.is_any(),
                validator: Arc::new(attestation::QemuVtpmValidator::from_config(config)),
            })
        }
        Variant::AwsNitroTpm => {
            let Some(Hardware::Ec2 { images }) = hardware else {
                return Err(PolicyError::Unsupported(variant));
            };
            let (validator, digest) =
                AwsNitroTpmValidator::from_attestation_config(raw).map_err(invalid)?;
            Ok(Active {
                digest,
                trust_any_ak: validator.ak_trust().is_some_and(|t| t.is_any()),
                validator: Arc::new(validator.with_ec2_images(images.clone())),
            })
        }
        Variant::AwsSevSnp | Variant::AzureSevSnp | Variant::GcpSevSnp => {
            let binding = match variant {
                Variant::AwsSevSnp => Binding::Aws,
                Variant::AzureSevSnp => Binding::Azure,
                _ => Binding::Gcp,
            };
            let Some(Hardware::Amd { collateral, gce }) = hardware else {
                return Err(PolicyError::Unsupported(variant));
            };
            let (mut validator, digest) =
                SevSnpValidator::from_attestation_config(binding, raw, collateral.clone())
                    .map_err(invalid)?;
            if binding == Binding::Gcp {
                let gce = gce.clone().ok_or(PolicyError::Unsupported(variant))?;
                validator = validator.with_gce_identity(gce);
            }
            Ok(Active {
                digest,
                trust_any_ak: false,
                validator: Arc::new(validator),
            })
        }
        Variant::AzureTrustedLaunch => {
            let (validator, digest) =
                attestation::variants::azure_trustedlaunch::TrustedLaunchValidator::from_attestation_config(raw)
                    .map_err(invalid)?;
            Ok(Active {
                digest,
                trust_any_ak: false,
                validator: Arc::new(validator),
            })
        }
        Variant::QemuTdx | Variant::AzureTdx => {
            let kind = match variant {
                Variant::QemuTdx => TdxKind::Qemu,
                _ => TdxKind::Azure,
            };
            let Some(Hardware::Intel { collateral }) = hardware else {
                return Err(PolicyError::Unsupported(variant));
            };
            let (validator, digest) =
                TdxValidator::from_attestation_config(kind, raw, collateral.clone())
                    .map_err(invalid)?;
            Ok(Active {
                digest,
                trust_any_ak: false,
                validator: Arc::new(validator),
            })
        }
        Variant::GcpSevEs => {
            let Some(Hardware::Google { gce }) = hardware else {
                return Err(PolicyError::Unsupported(variant));
            };
            let (validator, digest) =
                attestation::GcpSevEsValidator::from_attestation_config(raw).map_err(invalid)?;
            Ok(Active {
                digest,
                trust_any_ak: false,
                validator: Arc::new(validator.with_gce_identity(gce.clone())),
            })
        }
        other => Err(PolicyError::Unsupported(other)),
    }
}

/// Logged at start and on every reload while the policy trusts any key, so it cannot go
/// unnoticed in a cluster that is not a development setup.
fn warn_trust_any_ak(active: &Active) {
    if active.trust_any_ak {
        tracing::warn!(
            policy = %active.digest,
            "the attestation config trusts ANY attestation key (trustAnyAk): anyone who can reach this proxy can forge a quote and join; development only, list trustedAkDigests instead"
        );
    }
}

/// Reads at most one byte more than a policy may have: a file mounted by mistake (a log, an
/// image) must not be read whole into memory every poll; the parser then names the size.
fn read(path: &Path) -> Result<Vec<u8>, PolicyError> {
    use std::io::Read as _;
    let limit = u64::try_from(attestation::policy::MAX_CONFIG_SIZE).unwrap_or(u64::MAX);
    let mut raw = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(limit.saturating_add(1)).read_to_end(&mut raw))
        .map_err(|source| PolicyError::Read {
            path: path.to_owned(),
            source,
        })?;
    Ok(raw)
}

/// What the file on disk looked like at the last look, to tell a change from a re-read.
#[derive(Debug, PartialEq, Eq)]
enum Seen {
    /// SHA-256 of the bytes read.
    Bytes([u8; 32]),
    /// The file could not be read, for this reason.
    Unreadable(String),
}

/// The outcome of one reload attempt.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    /// The file is as it was at the last look; nothing was done.
    Unchanged,
    /// The file changed and its policy is now in force.
    Applied { digest: String },
    /// The file changed but is not a valid policy; the previous one stays in force.
    Refused { reason: String },
    /// The file changed to a valid policy that would refuse too many of the nodes accepted
    /// lately; the previous one stays in force until the file changes again.
    Held { digest: String, reason: String },
}

/// What a new policy must pass before it replaces the one in force: it may refuse at most
/// `max_refused_share` of the nodes accepted within `window`, as the evidence kept in
/// `evidence_dir` shows.
#[derive(Clone, Debug)]
pub struct Guard {
    pub evidence_dir: PathBuf,
    pub max_refused_share: f64,
    pub window: Duration,
}

/// The config field that applies a policy the guard would hold: its value must be the digest
/// of the policy the file describes.
pub const FORCE_FIELD: &str = "forceReload";

/// A policy held back by the [`Guard`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The digest of the held policy.
    pub digest: String,
    /// Why: how many of the nodes accepted lately it would refuse, and by which checks.
    pub reason: String,
}

/// The state of the policy for readiness, metrics and operators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PolicyStatus {
    /// The digest of the policy in force.
    pub digest: String,
    /// Why the file on disk is not in force, while it is not; `None` when it is.
    pub last_error: Option<String>,
    /// Changes of the file that were applied (the initial load not included).
    pub reloads_ok: u64,
    /// Changes of the file that were refused.
    pub reloads_failed: u64,
    /// The valid policy on disk the guard holds back, while it does.
    pub held: Option<Held>,
}

impl PolicyStatus {
    /// Whether the file on disk differs from the policy in force because it is invalid.
    pub fn failing(&self) -> bool {
        self.last_error.is_some()
    }
}

/// The validator in force; swapped whole when the policy file changes.
#[derive(Debug)]
pub struct Current {
    variant: Variant,
    /// Where the hardware variants get collateral; `None` for the others.
    hardware: Option<Hardware>,
    path: PathBuf,
    active: RwLock<Arc<Active>>,
    // Only reloads take this lock, never a connection: it keeps concurrent reloads (the poll
    // and a test calling `reload`) from interleaving their read-compare-swap.
    seen: Mutex<Looked>,
    guard: Option<Guard>,
    // The counts and the failing flag are the exported metrics themselves, so what /metrics
    // shows and what `status` reports cannot drift apart.
    reloads: Family<[(&'static str, &'static str); 1], Counter>,
    failing: Gauge,
    held: Gauge,
    trust_any_ak: Gauge,
}

/// What the last look at the file found, and what became of it.
#[derive(Debug)]
struct Looked {
    seen: Seen,
    /// Why the file is not in force because it is invalid.
    error: Option<String>,
    /// The file's valid policy, held back by the guard.
    held: Option<Held>,
}

/// How long a missing file may take to reappear before a reload counts as refused.
const MISSING_FILE_GRACE: Duration = Duration::from_millis(200);

const OK: [(&str, &str); 1] = [("result", "ok")];
const FAILED: [(&str, &str); 1] = [("result", "failed")];
const HELD: [(&str, &str); 1] = [("result", "held")];

impl Current {
    /// Loads the policy at start. Unlike a reload, failing here is fatal: there is no previous
    /// policy to keep, and a proxy with none must not start.
    pub fn load(
        variant: Variant,
        path: &Path,
        hardware: Option<Hardware>,
    ) -> Result<Self, PolicyError> {
        let raw = read(path)?;
        let active = build(variant, path, &raw, hardware.as_ref())?;
        warn_trust_any_ak(&active);
        let trust_any_ak = Gauge::default();
        trust_any_ak.set(i64::from(active.trust_any_ak));
        Ok(Self {
            variant,
            hardware,
            path: path.to_owned(),
            active: RwLock::new(Arc::new(active)),
            seen: Mutex::new(Looked {
                seen: Seen::Bytes(sha256(&raw)),
                error: None,
                held: None,
            }),
            guard: None,
            reloads: Family::default(),
            failing: Gauge::default(),
            held: Gauge::default(),
            trust_any_ak,
        })
    }

    /// Tries every changed policy on kept evidence before applying it (see [`Guard`]).
    pub fn with_guard(mut self, guard: Guard) -> Self {
        self.guard = Some(guard);
        self
    }

    /// The validator and digest `raw` (an attestation config) would give, over the same
    /// collateral sources as the policy in force; `origin` names where it came from in errors.
    pub fn build_candidate(&self, origin: &Path, raw: &[u8]) -> Result<Active, PolicyError> {
        if raw.len() > attestation::policy::MAX_CONFIG_SIZE {
            // The parser names the size too; this keeps a huge body from being parsed at all.
            return Err(PolicyError::Invalid {
                path: origin.to_owned(),
                variant: self.variant,
                source: attestation::policy::PolicyError::TooLarge {
                    size: raw.len(),
                    limit: attestation::policy::MAX_CONFIG_SIZE,
                },
            });
        }
        build(self.variant, origin, raw, self.hardware.as_ref())
    }

    /// Registers the reload metrics: `policy_reloads_total{result="ok"|"failed"|"held"}`
    /// (changes of the file applied, refused as invalid, or held back by the guard),
    /// `policy_failing` (1 while the file on disk is invalid and the previous policy is still
    /// enforced), `policy_held` (1 while the guard holds the file's policy back) and
    /// `trust_any_ak` (1 while the policy in force trusts any attestation key).
    pub fn register_metrics(&self, registry: &mut Registry) {
        // Every result exists from the start, so an alert on "failed" has a series to watch.
        drop(self.reloads.get_or_create(&OK));
        drop(self.reloads.get_or_create(&FAILED));
        drop(self.reloads.get_or_create(&HELD));
        registry.register(
            "policy_reloads",
            "Changes of the attestation config file, by whether they were applied",
            self.reloads.clone(),
        );
        registry.register(
            "policy_failing",
            "1 while the attestation config file is invalid and the previous policy is enforced",
            self.failing.clone(),
        );
        registry.register(
            "policy_held",
            "1 while a valid attestation config is held back because it would refuse too many of the nodes accepted lately",
            self.held.clone(),
        );
        registry.register(
            "trust_any_ak",
            "1 while the policy in force trusts any attestation key (trustAnyAk, development only)",
            self.trust_any_ak.clone(),
        );
    }

    /// The validator to use for one connection.
    pub fn get(&self) -> Arc<Active> {
        // A poisoned lock still holds a complete Arc; keep serving with it.
        self.active
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Why the policy in force is unsafe outside development, if it is: the readiness note.
    pub fn trust_any_ak_note(&self) -> Option<String> {
        let active = self.get();
        active.trust_any_ak.then(|| {
            format!(
                "policy {} trusts any attestation key (trustAnyAk): anyone can forge a quote; development only",
                active.digest
            )
        })
    }

    /// The policy in force and the reload history.
    pub fn status(&self) -> PolicyStatus {
        let (last_error, held) = {
            let looked = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            (looked.error.clone(), looked.held.clone())
        };
        PolicyStatus {
            digest: self.get().digest.clone(),
            last_error,
            reloads_ok: self.reloads.get_or_create(&OK).get(),
            reloads_failed: self.reloads.get_or_create(&FAILED).get(),
            held,
        }
    }

    /// Re-reads the file and applies it if it changed. Blocking (file I/O and parsing).
    pub fn reload(&self) -> Reload {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let raw = read(&self.path).or_else(|error| match &error {
            // An editor or a script that removes the file and creates it anew leaves a moment
            // without one; look once more before calling that a broken policy.
            PolicyError::Read { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
                std::thread::sleep(MISSING_FILE_GRACE);
                read(&self.path)
            }
            _ => Err(error),
        });
        let now = match &raw {
            Ok(raw) => Seen::Bytes(sha256(raw)),
            Err(error) => Seen::Unreadable(status::chain(error)),
        };
        if seen.seen == now {
            return Reload::Unchanged;
        }
        // Built only when the file changed: the poll re-reads every second.
        let result = raw.and_then(|raw| {
            build(self.variant, &self.path, &raw, self.hardware.as_ref())
                .map(|active| (forced(&raw, &active.digest), active))
        });
        seen.seen = now;
        match result {
            Ok((forced, active)) => {
                match (&self.guard, forced) {
                    (Some(_), true) => tracing::warn!(
                        path = %self.path.display(),
                        policy = %active.digest,
                        "the attestation config forces its policy ({FORCE_FIELD}): applied without trying it on the kept evidence"
                    ),
                    (Some(guard), false) => {
                        if let Some(reason) = self.guard_refuses(guard, &active) {
                            let digest = active.digest.clone();
                            self.reloads.get_or_create(&HELD).inc();
                            self.held.set(1);
                            self.failing.set(0);
                            tracing::error!(
                                path = %self.path.display(),
                                policy = %digest,
                                in_force = %self.get().digest,
                                %reason,
                                "measurement policy held back; the previous policy stays in force"
                            );
                            seen.error = None;
                            seen.held = Some(Held {
                                digest: digest.clone(),
                                reason: reason.clone(),
                            });
                            return Reload::Held { digest, reason };
                        }
                    }
                    (None, _) => {}
                }
                let digest = active.digest.clone();
                warn_trust_any_ak(&active);
                self.trust_any_ak.set(i64::from(active.trust_any_ak));
                let previous = {
                    let mut guard = self.active.write().unwrap_or_else(PoisonError::into_inner);
                    std::mem::replace(&mut *guard, Arc::new(active))
                };
                seen.error = None;
                seen.held = None;
                self.reloads.get_or_create(&OK).inc();
                self.failing.set(0);
                self.held.set(0);
                tracing::info!(
                    path = %self.path.display(),
                    policy = %digest,
                    previous = %previous.digest,
                    "measurement policy reloaded; new handshakes use it"
                );
                Reload::Applied { digest }
            }
            Err(error) => {
                let reason = status::chain(&error);
                self.reloads.get_or_create(&FAILED).inc();
                self.failing.set(1);
                tracing::error!(
                    policy = %self.get().digest,
                    %reason,
                    "measurement policy file refused; the previous policy stays in force"
                );
                seen.error = Some(reason.clone());
                // The held policy is no longer what the file says.
                seen.held = None;
                self.held.set(0);
                Reload::Refused { reason }
            }
        }
    }

    /// Why `candidate` must be held back, if it must: it would refuse more than the guard's
    /// share of the nodes accepted within its window. Kept evidence that cannot be read holds
    /// nothing back (there is nothing to protect the change against), and says so in the log.
    fn guard_refuses(&self, guard: &Guard, candidate: &Active) -> Option<String> {
        let read = match attestation::evidence::read_dir(&guard.evidence_dir) {
            Ok(read) => read,
            Err(error) => {
                tracing::warn!(dir = %guard.evidence_dir.display(), %error, "no kept evidence to try the new policy on; applying it unchecked");
                return None;
            }
        };
        let since = std::time::SystemTime::now()
            .checked_sub(guard.window)
            .unwrap_or(std::time::UNIX_EPOCH);
        let recent = read
            .records
            .iter()
            .filter(|record| record.accepted() && record.time().is_ok_and(|time| time >= since));
        let recent: Vec<_> = recent.cloned().collect();
        let report = crate::dry_run::redecide(&recent, candidate);
        let share = report.newly_refused_share();
        if share <= guard.max_refused_share {
            tracing::info!(
                policy = %candidate.digest,
                refused = report.newly_refused(),
                accepted = report.accepted_before,
                "the new policy refuses few enough of the nodes accepted lately"
            );
            return None;
        }
        let mut checks: Vec<String> = report
            .refused
            .iter()
            .map(|r| {
                format!(
                    "{} ({})",
                    r.decision.peer,
                    r.decision.check.as_deref().unwrap_or("evidence")
                )
            })
            .collect();
        const NAMED: usize = 5;
        if checks.len() > NAMED {
            let more = checks.len() - NAMED;
            checks.truncate(NAMED);
            checks.push(format!("{more} more"));
        }
        Some(format!(
            "policy {} would refuse {} of the {} node connections accepted in the last {} ({:.2} > the allowed share {}): {}; `attest-tool dry-run` or POST /dry-run shows each, and \"{FORCE_FIELD}\": \"{}\" in the config applies it anyway",
            candidate.digest,
            report.newly_refused(),
            report.accepted_before,
            humantime::format_duration(guard.window),
            share,
            guard.max_refused_share,
            checks.join(", "),
            candidate.digest,
        ))
    }

    /// Re-reads the file every `interval` until `shutdown`.
    pub async fn watch(self: Arc<Self>, interval: Duration, shutdown: Shutdown) {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // The first tick is immediate; the file was just loaded.
        ticks.tick().await;
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                () = shutdown.clone().wait() => return,
            }
            let current = self.clone();
            // File I/O may block (a slow volume); keep it off the runtime's threads.
            if let Err(error) = tokio::task::spawn_blocking(move || current.reload()).await {
                tracing::error!(%error, "policy reload task failed");
            }
        }
    }
}

/// Whether the config's [`FORCE_FIELD`] names `digest`, the policy the config describes.
fn forced(raw: &[u8], digest: &str) -> bool {
    serde_json::from_slice::<serde_json::Value>(raw)
        .ok()
        .and_then(|config| {
            config
                .get(FORCE_FIELD)
                .and_then(serde_json::Value::as_str)
                .map(|named| named.eq_ignore_ascii_case(digest))
        })
        .unwrap_or(false)
}

fn sha256(bytes: &[u8]) -> [u8; 32] {
    let mut out = [0u8; 32];
    out.copy_from_slice(aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes).as_ref());
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    const AK: &str = "abababababababababababababababababababababababababababababababab";

    /// PCR 4 enforced, PCR 9 = `byte` (warn-only or not), one trusted key.
    fn config(byte: u8, warn_only: bool) -> String {
        format!(
            r#"{{"measurements": {{"4": {{"expected": "{}"}}, "9": {{"expected": "{}", "warnOnly": {warn_only}}}}}, "trustedAkDigests": ["{AK}"]}}"#,
            hex::encode([4u8; 32]),
            hex::encode([byte; 32])
        )
    }

    fn trust_any(byte: u8) -> String {
        format!(
            r#"{{"measurements": {{"4": {{"expected": "{}"}}}}, "trustAnyAk": true}}"#,
            hex::encode([byte; 32])
        )
    }

    /// The kubelet's atomic writer: a new timestamped directory, `..data` renamed onto it, the
    /// old directory removed; the visible file is a symlink through `..data`.
    fn project(dir: &Path, generation: u32, contents: &str) {
        let target = format!("..2026_11_21_06_00_00.{generation}");
        std::fs::create_dir(dir.join(&target)).unwrap();
        std::fs::write(dir.join(&target).join("attestationConfig"), contents).unwrap();
        let old = std::fs::read_link(dir.join("..data")).ok();
        symlink(&target, dir.join("..data_tmp")).unwrap();
        std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
        if !dir.join("attestationConfig").exists() {
            symlink("..data/attestationConfig", dir.join("attestationConfig")).unwrap();
        }
        if let Some(old) = old {
            std::fs::remove_dir_all(dir.join(old)).unwrap();
        }
    }

    /// The policy at `path`, with its metrics registered as the proxy registers them.
    fn load_with_metrics(path: &Path) -> (Current, Registry) {
        let current = Current::load(Variant::QemuVtpm, path, None).unwrap();
        let mut registry = Registry::with_prefix("attest_proxy");
        current.register_metrics(&mut registry);
        (current, registry)
    }

    fn scrape(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
        text
    }

    fn digest_of(contents: &str) -> String {
        attestation::QemuVtpmConfig::from_attestation_config(contents.as_bytes())
            .unwrap()
            .digest()
    }

    #[test]
    fn symlink_swap_is_applied_and_broken_file_keeps_old_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        project(dir.path(), 1, &config(1, false));
        let current = Current::load(Variant::QemuVtpm, &path, None).unwrap();
        let first = current.get();
        assert_eq!(first.digest, digest_of(&config(1, false)));
        assert_eq!(current.reload(), Reload::Unchanged);

        project(dir.path(), 2, &config(2, true));
        let second = digest_of(&config(2, true));
        assert_eq!(
            current.reload(),
            Reload::Applied {
                digest: second.clone()
            }
        );
        assert_eq!(current.get().digest, second);
        // A connection that took the old validator keeps it.
        assert_eq!(first.digest, digest_of(&config(1, false)));

        project(dir.path(), 3, "{\"measurements\": {\"4\": \"zz\"}}");
        let Reload::Refused { reason } = current.reload() else {
            panic!("a broken file must be refused")
        };
        assert!(reason.contains("not a valid qemu-vtpm policy"), "{reason}");
        assert_eq!(current.get().digest, second);
        // Re-reading the same broken file neither counts again nor clears the error.
        assert_eq!(current.reload(), Reload::Unchanged);
        let status = current.status();
        assert!(status.failing());
        assert_eq!(
            (
                status.digest.as_str(),
                status.reloads_ok,
                status.reloads_failed
            ),
            (second.as_str(), 1, 1)
        );

        project(dir.path(), 4, &config(4, false));
        assert!(matches!(current.reload(), Reload::Applied { .. }));
        let status = current.status();
        assert!(!status.failing());
        assert_eq!((status.reloads_ok, status.reloads_failed), (2, 1));
    }

    #[test]
    fn metrics_follow_the_reloads() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, config(1, false)).unwrap();
        let (current, registry) = load_with_metrics(&path);
        let text = scrape(&registry);
        assert!(
            text.contains("attest_proxy_policy_reloads_total{result=\"failed\"} 0"),
            "{text}"
        );
        assert!(text.contains("attest_proxy_policy_failing 0"), "{text}");

        std::fs::write(&path, "not json").unwrap();
        current.reload();
        let text = scrape(&registry);
        assert!(
            text.contains("attest_proxy_policy_reloads_total{result=\"failed\"} 1"),
            "{text}"
        );
        assert!(text.contains("attest_proxy_policy_failing 1"), "{text}");

        std::fs::write(&path, config(2, false)).unwrap();
        current.reload();
        let text = scrape(&registry);
        assert!(
            text.contains("attest_proxy_policy_reloads_total{result=\"ok\"} 1"),
            "{text}"
        );
        assert!(text.contains("attest_proxy_policy_failing 0"), "{text}");
    }

    #[test]
    fn missing_file_keeps_old_policy_until_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, config(1, false)).unwrap();
        let current = Current::load(Variant::QemuVtpm, &path, None).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(current.reload(), Reload::Refused { .. }));
        assert!(current.status().last_error.unwrap().contains("cannot read"));
        assert_eq!(current.get().digest, digest_of(&config(1, false)));
        // Removed and created again, as an editor does.
        std::fs::write(&path, config(5, false)).unwrap();
        assert!(matches!(current.reload(), Reload::Applied { .. }));
        assert_eq!(current.get().digest, digest_of(&config(5, false)));
    }

    #[test]
    fn oversized_file_is_refused_without_reading_it_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, config(1, false)).unwrap();
        let current = Current::load(Variant::QemuVtpm, &path, None).unwrap();
        let huge = vec![b' '; attestation::policy::MAX_CONFIG_SIZE * 3];
        std::fs::write(&path, &huge).unwrap();
        assert_eq!(
            read(&path).unwrap().len(),
            attestation::policy::MAX_CONFIG_SIZE + 1
        );
        let Reload::Refused { reason } = current.reload() else {
            panic!("an oversized file must be refused")
        };
        assert!(reason.contains("exceeds the limit"), "{reason}");
    }

    #[test]
    fn start_fails_without_a_valid_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        assert!(matches!(
            Current::load(Variant::QemuVtpm, &path, None),
            Err(PolicyError::Read { .. })
        ));
        std::fs::write(&path, "{}").unwrap();
        assert!(matches!(
            Current::load(Variant::QemuVtpm, &path, None),
            Err(PolicyError::Invalid { .. })
        ));
        std::fs::write(&path, config(1, false)).unwrap();
        for gcp in [Variant::GcpSevSnp, Variant::GcpSevEs] {
            assert!(matches!(
                Current::load(gcp, &path, None),
                Err(PolicyError::Unsupported(v)) if v == gcp
            ));
        }
        // A hardware variant without its vendor's collateral source is not served.
        for tdx in [Variant::QemuTdx, Variant::AzureTdx] {
            assert!(matches!(
                Current::load(tdx, &path, None),
                Err(PolicyError::Unsupported(v)) if v == tdx
            ));
        }
    }

    fn ec2() -> Hardware {
        Hardware::Ec2 {
            images: Arc::new(attestation::variants::aws_nitro_tpm::StaticEc2Images::new()),
        }
    }

    /// aws-nitro-tpm reads qemu-vtpm's config and its key trust: trustAnyAk is flagged as for
    /// qemu-vtpm, a config trusting no key is refused at start, and without ec2-identity the
    /// variant is not served.
    #[test]
    fn aws_nitro_tpm_needs_ec2_and_explicit_key_trust() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, config(1, false)).unwrap();
        assert!(matches!(
            Current::load(Variant::AwsNitroTpm, &path, None),
            Err(PolicyError::Unsupported(Variant::AwsNitroTpm))
        ));
        let current = Current::load(Variant::AwsNitroTpm, &path, Some(ec2())).unwrap();
        assert_eq!(current.get().validator.variant(), Variant::AwsNitroTpm);
        assert!(!current.get().trust_any_ak);
        std::fs::write(&path, trust_any(4)).unwrap();
        assert!(matches!(current.reload(), Reload::Applied { .. }));
        assert!(current.get().trust_any_ak);
        assert!(current.trust_any_ak_note().is_some());
        std::fs::write(
            &path,
            format!(
                r#"{{"measurements": {{"4": {{"expected": "{}"}}}}}}"#,
                hex::encode([4u8; 32])
            ),
        )
        .unwrap();
        let err = Current::load(Variant::AwsNitroTpm, &path, Some(ec2())).unwrap_err();
        assert!(err.to_string().contains("aws-nitro-tpm"), "{err}");
        assert!(
            std::error::Error::source(&err)
                .is_some_and(|e| e.to_string().contains("trustedAkDigests")),
            "{err}"
        );
    }

    fn intel() -> Hardware {
        Hardware::Intel {
            collateral: Arc::new(attestation::tdx::StaticCollateral::new()),
        }
    }

    /// MRTD (index 0) enforced, 48 bytes as TDX measures, the same MRTD and an MRSEAM pinned,
    /// and the TCB statuses accepted.
    fn tdx_config(byte: u8, statuses: &str) -> String {
        format!(
            r#"{{"measurements": {{"0": {{"expected": "{mrtd}"}}}}, "mrtds": ["{mrtd}"], "mrSeams": ["{}"], "acceptedTcbStatuses": [{statuses}]}}"#,
            hex::encode([0x5e; 48]),
            mrtd = hex::encode([byte; 48]),
        )
    }

    fn amd() -> Hardware {
        Hardware::Amd {
            collateral: Arc::new(attestation::snp::StaticCollateral::new()),
            gce: None,
        }
    }

    /// An azure-sev-snp config: a PCR enforced, Constellation's minimum TCB, and `signer` (the
    /// `firmwareSignerConfig` value, JSON).
    fn azure_snp_config(signer: &str) -> String {
        format!(
            r#"{{"measurements": {{"4": {{"expected": "{}"}}}}, "bootloaderVersion": 3, "teeVersion": 0, "snpVersion": 8, "microcodeVersion": 115, "firmwareSignerConfig": {signer}}}"#,
            hex::encode([4u8; 32])
        )
    }

    /// azure-sev-snp without `firmwareSignerConfig` pins no firmware: refused at start, and a
    /// reload that drops it keeps the last good policy, naming the field.
    #[test]
    fn an_azure_sev_snp_config_without_a_firmware_signer_is_refused_at_start_and_on_reload() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        let pinned = azure_snp_config(&format!(
            r#"{{"acceptedKeyDigests": ["{}"]}}"#,
            hex::encode([3u8; 48])
        ));
        let unpinned = [
            azure_snp_config("null"),
            azure_snp_config("null").replace(r#", "firmwareSignerConfig": null"#, ""),
        ];
        for contents in &unpinned {
            std::fs::write(&path, contents).unwrap();
            let error = Current::load(Variant::AzureSevSnp, &path, Some(amd())).unwrap_err();
            let chain = status::chain(&error);
            assert!(
                chain.contains("azure-sev-snp needs firmwareSignerConfig")
                    && chain.contains("Stricter than Constellation"),
                "{chain}"
            );
            // aws-sev-snp binds its firmware otherwise: the same config starts.
            Current::load(Variant::AwsSevSnp, &path, Some(amd())).unwrap();
        }
        std::fs::write(&path, &pinned).unwrap();
        let current = Current::load(Variant::AzureSevSnp, &path, Some(amd())).unwrap();
        let digest = current.get().digest.clone();
        for contents in &unpinned {
            std::fs::write(&path, contents).unwrap();
            let Reload::Refused { reason } = current.reload() else {
                panic!("an unpinned azure-sev-snp config must be refused on reload")
            };
            assert!(reason.contains("firmwareSignerConfig"), "{reason}");
            assert_eq!(current.get().digest, digest, "the last good policy stays");
        }
    }

    /// azure-tdx without `mrtds`, a TDX config without an MRSEAM: refused on reload as at start.
    #[test]
    fn a_tdx_reload_that_unpins_the_firmware_keeps_the_last_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        let good = tdx_config(1, r#""UpToDate""#);
        let no_mrtds = good.replace(&format!(r#""mrtds": ["{}"], "#, hex::encode([1u8; 48])), "");
        let no_mrseam = good.replace(
            &format!(r#""mrSeams": ["{}"], "#, hex::encode([0x5e; 48])),
            "",
        );
        for (variant, contents, field) in [
            (Variant::AzureTdx, &no_mrtds, "needs mrtds"),
            (Variant::AzureTdx, &no_mrseam, "needs mrSeams"),
            (Variant::QemuTdx, &no_mrseam, "needs mrSeams"),
        ] {
            std::fs::write(&path, &good).unwrap();
            let current = Current::load(variant, &path, Some(intel())).unwrap();
            let digest = current.get().digest.clone();
            std::fs::write(&path, contents).unwrap();
            let Reload::Refused { reason } = current.reload() else {
                panic!("{variant}: an unpinned config must be refused on reload")
            };
            assert!(reason.contains(field), "{reason}");
            assert_eq!(current.get().digest, digest);
            let error = Current::load(variant, &path, Some(intel())).unwrap_err();
            assert!(status::chain(&error).contains(field), "{error}");
        }
        // qemu-tdx pins the MRTD through measurement 0: mrtds is not needed.
        std::fs::write(&path, &no_mrtds).unwrap();
        Current::load(Variant::QemuTdx, &path, Some(intel())).unwrap();
    }

    #[test]
    fn azure_trustedlaunch_loads_its_roots_and_a_reload_with_a_bad_root_keeps_the_last_good_policy()
    {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        let config = |roots: serde_json::Value| {
            serde_json::json!({
                "measurements": {"4": {"expected": hex::encode([0x44; 32]), "warnOnly": false}},
                "azureVtpmRoots": roots,
            })
            .to_string()
        };
        let azure = soft_issuer::azure_vtpm::SimulatedAzureVtpmCa::new().unwrap();
        std::fs::write(&path, config(serde_json::json!([azure.root_pem()]))).unwrap();
        let current = Current::load(Variant::AzureTrustedLaunch, &path, None).unwrap();
        let first = current.get();
        assert_eq!(first.validator.variant(), Variant::AzureTrustedLaunch);
        assert!(!first.trust_any_ak);

        // The roots are part of what the digest covers.
        let other = soft_issuer::azure_vtpm::SimulatedAzureVtpmCa::impostor().unwrap();
        std::fs::write(&path, config(serde_json::json!([other.root_pem()]))).unwrap();
        let Reload::Applied { digest } = current.reload() else {
            panic!("another root is a valid policy")
        };
        assert_ne!(digest, first.digest);

        // What Constellation's CLI writes on upgrade (it knows no azureVtpmRoots): a policy with
        // the built-in roots only (the reload guard, off here without evidence, holds it back
        // where it would refuse the nodes accepted lately).
        let measurements_only = serde_json::json!({
            "measurements": {"4": {"expected": hex::encode([0x44; 32]), "warnOnly": false}},
        });
        std::fs::write(&path, measurements_only.to_string()).unwrap();
        let Reload::Applied { digest: builtin } = current.reload() else {
            panic!("a config without azureVtpmRoots trusts the built-in roots")
        };
        assert_ne!(builtin, digest);
        std::fs::write(&path, config(serde_json::json!([other.root_pem()]))).unwrap();
        assert!(matches!(current.reload(), Reload::Applied { .. }));

        std::fs::write(&path, config(serde_json::json!(["not a certificate"]))).unwrap();
        let Reload::Refused { reason } = current.reload() else {
            panic!("a config with a bad root must be refused")
        };
        assert!(reason.contains("azureVtpmRoots entry 0"), "{reason}");
        assert_eq!(current.get().digest, digest);
        let error = Current::load(Variant::AzureTrustedLaunch, &path, None).unwrap_err();
        assert!(
            status::chain(&error).contains("azureVtpmRoots entry 0"),
            "{error}"
        );
    }

    #[test]
    fn tdx_variants_load_a_valid_config_and_reload_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        for (variant, name) in [
            (Variant::QemuTdx, "qemu-tdx"),
            (Variant::AzureTdx, "azure-tdx"),
        ] {
            std::fs::write(&path, tdx_config(1, r#""UpToDate""#)).unwrap();
            let current = Current::load(variant, &path, Some(intel())).unwrap();
            let first = current.get();
            assert_eq!(first.validator.variant(), variant);
            assert_eq!(first.digest.len(), 64);
            // The accepted statuses are part of what the digest covers.
            std::fs::write(&path, tdx_config(1, r#""UpToDate", "SWHardeningNeeded""#)).unwrap();
            let Reload::Applied { digest } = current.reload() else {
                panic!("{name}: a valid change must be applied")
            };
            assert_ne!(digest, first.digest, "{name}");
            // A broken file keeps the policy in force, over the same collateral source.
            std::fs::write(&path, tdx_config(1, r#""Sometimes""#)).unwrap();
            let Reload::Refused { reason } = current.reload() else {
                panic!("{name}: an invalid change must be refused")
            };
            assert!(
                reason.contains(&format!("not a valid {name} policy")),
                "{reason}"
            );
            assert_eq!(current.get().digest, digest);
            // The SNP variants' collateral does not serve TDX.
            assert!(matches!(
                Current::load(variant, &path, None),
                Err(PolicyError::Unsupported(_))
            ));
        }
    }

    #[test]
    fn tdx_variants_refuse_an_invalid_config_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        for (contents, reason) in [
            (
                format!(
                    r#"{{"measurements": {{"0": {{"expected": "{}", "warnOnly": true}}}}}}"#,
                    hex::encode([1u8; 48])
                ),
                "enforces no measurement",
            ),
            (tdx_config(1, r#""Sometimes""#), "Sometimes"),
            (
                tdx_config(1, r#""UpToDate""#).replace('}', r#", "intelRootKey": "not PEM"}"#),
                "intelRootKey",
            ),
        ] {
            std::fs::write(&path, &contents).unwrap();
            for variant in [Variant::QemuTdx, Variant::AzureTdx] {
                let error = Current::load(variant, &path, Some(intel())).unwrap_err();
                assert!(matches!(error, PolicyError::Invalid { .. }), "{error}");
                let chain = status::chain(&error);
                assert!(chain.contains(reason), "{contents}: {chain}");
            }
        }
    }

    #[test]
    fn start_fails_without_key_trust_or_an_enforced_measurement() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        for (contents, reason) in [
            (
                format!(
                    r#"{{"measurements": {{"4": "{}"}}}}"#,
                    hex::encode([4u8; 32])
                ),
                "trusts no attestation key",
            ),
            (
                r#"{"measurements": {}, "trustAnyAk": true}"#.to_owned(),
                "enforces no measurement",
            ),
            (
                format!(
                    r#"{{"measurements": {{"4": {{"expected": "{}", "warnOnly": true}}}}, "trustedAkDigests": ["{AK}"]}}"#,
                    hex::encode([4u8; 32])
                ),
                "enforces no measurement",
            ),
        ] {
            std::fs::write(&path, &contents).unwrap();
            let err = Current::load(Variant::QemuVtpm, &path, None).unwrap_err();
            assert!(matches!(err, PolicyError::Invalid { .. }), "{err}");
            let chain = status::chain(&err);
            assert!(chain.contains(reason), "{contents}: {chain}");
        }
    }

    #[test]
    fn a_reload_that_drops_key_trust_or_enforcement_keeps_the_last_good_policy() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, config(1, false)).unwrap();
        let current = Current::load(Variant::QemuVtpm, &path, None).unwrap();
        let good = current.get().digest.clone();
        for broken in [
            r#"{"measurements": {}, "trustAnyAk": true}"#.to_owned(),
            config(1, false).replace("trustedAkDigests", "someOtherKey"),
        ] {
            std::fs::write(&path, &broken).unwrap();
            assert!(
                matches!(current.reload(), Reload::Refused { .. }),
                "{broken}"
            );
            assert_eq!(current.get().digest, good);
        }
    }

    #[test]
    fn trust_any_ak_shows_in_the_metric_the_note_and_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        std::fs::write(&path, trust_any(4)).unwrap();
        let (current, registry) = load_with_metrics(&path);
        assert!(current.get().trust_any_ak);
        assert!(
            scrape(&registry).contains("attest_proxy_trust_any_ak 1"),
            "{}",
            scrape(&registry)
        );
        let note = current.trust_any_ak_note().unwrap();
        assert!(note.contains("trusts any attestation key"), "{note}");
        // The same measurements with a pinned key are another policy.
        let any_digest = current.get().digest.clone();
        assert_ne!(
            any_digest,
            attestation::Policy::from_attestation_config(trust_any(4).as_bytes())
                .unwrap()
                .digest()
        );

        std::fs::write(&path, config(1, false)).unwrap();
        assert!(matches!(current.reload(), Reload::Applied { .. }));
        assert!(!current.get().trust_any_ak);
        assert!(current.trust_any_ak_note().is_none());
        assert!(scrape(&registry).contains("attest_proxy_trust_any_ak 0"));

        std::fs::write(&path, trust_any(4)).unwrap();
        assert!(matches!(current.reload(), Reload::Applied { .. }));
        assert!(scrape(&registry).contains("attest_proxy_trust_any_ak 1"));
        assert_eq!(current.get().digest, any_digest);
    }

    /// A qemu-vtpm config enforcing PCR 4 = 4s and trusting `aks`, with `extra` fields.
    fn pinning(aks: &[&[u8]], extra: &str) -> String {
        let digests: Vec<String> = aks
            .iter()
            .map(|ak| format!("\"{}\"", hex::encode(attestation::ak_digest(ak))))
            .collect();
        format!(
            r#"{{"measurements": {{"4": {{"expected": "{}"}}}}, "trustedAkDigests": [{}]{extra}}}"#,
            hex::encode([4u8; 32]),
            digests.join(", ")
        )
    }

    /// Keeps in `dir` the evidence of `issuer`'s node, decided by `config` at `at`.
    fn keep(dir: &Path, issuer: &soft_issuer::SoftIssuer, config: &str, at: std::time::SystemTime) {
        use attestation::audit::{Decision, Evidence, Subject};
        let config =
            attestation::QemuVtpmConfig::from_attestation_config(config.as_bytes()).unwrap();
        let digest = config.digest();
        let validator = attestation::QemuVtpmValidator::from_config(config);
        let (nonce, user_data) = ([1u8; 32], [2u8; 32]);
        let document = issuer.issue_document(&user_data, &nonce).unwrap();
        let verified = attestation::Validator::validate(&validator, &document, &nonce).unwrap();
        let subject = Subject {
            time: at,
            peer: "127.0.0.1:4000".to_owned(),
            variant: Variant::QemuVtpm,
            policy: digest,
            evidence: Evidence::Certificate(&document),
        };
        let record = attestation::evidence::Record::new(
            Decision::accepted(subject, &verified),
            &nonce,
            &user_data,
            &document,
        );
        let bounds = attestation::evidence::Bounds {
            max_records: 100,
            max_bytes: 1 << 20,
            max_age: Duration::from_secs(7 * 86_400),
        };
        attestation::evidence::Store::open(dir, bounds)
            .unwrap()
            .put(&record)
            .unwrap();
    }

    #[test]
    fn a_reload_refusing_too_many_recent_nodes_is_held_until_forced() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("attestationConfig");
        let evidence = tmp.path().join("evidence");
        let node = || {
            soft_issuer::SoftIssuer::ecdsa_p256()
                .unwrap()
                .with_pcrs([(4, [4; 32])])
                .unwrap()
        };
        let (a, b, old) = (node(), node(), node());
        let both = pinning(&[a.ak_public(), b.ak_public(), old.ak_public()], "");
        let now = std::time::SystemTime::now();
        keep(&evidence, &a, &both, now);
        keep(&evidence, &b, &both, now);
        // Accepted two days ago: outside the guard's window, so not counted.
        keep(
            &evidence,
            &old,
            &both,
            now - Duration::from_secs(2 * 86_400),
        );
        std::fs::write(&path, &both).unwrap();
        let guard = Guard {
            evidence_dir: evidence.clone(),
            max_refused_share: 0.1,
            window: Duration::from_secs(86_400),
        };
        let current = Current::load(Variant::QemuVtpm, &path, None)
            .unwrap()
            .with_guard(guard.clone());
        let mut registry = Registry::with_prefix("attest_proxy");
        current.register_metrics(&mut registry);
        let in_force = current.get().digest.clone();

        // Only a's key: b, accepted an hour ago, would be refused (1 of 2 > 0.1).
        let only_a = pinning(&[a.ak_public(), old.ak_public()], "");
        let held_digest = digest_of(&only_a);
        std::fs::write(&path, &only_a).unwrap();
        let Reload::Held { digest, reason } = current.reload() else {
            panic!("a policy refusing half the recent nodes must be held")
        };
        assert_eq!(digest, held_digest);
        assert!(
            reason.contains("would refuse 1 of the 2 node connections accepted in the last 1day")
                && reason.contains("127.0.0.1:4000 (ak_untrusted)")
                && reason.contains(&format!(r#""forceReload": "{held_digest}""#)),
            "{reason}"
        );
        assert_eq!(current.get().digest, in_force, "the previous policy stays");
        let status = current.status();
        assert_eq!(
            status.held.as_ref().map(|h| h.digest.as_str()),
            Some(held_digest.as_str())
        );
        assert!(!status.failing());
        let text = scrape(&registry);
        assert!(text.contains("attest_proxy_policy_held 1"), "{text}");
        assert!(
            text.contains("attest_proxy_policy_reloads_total{result=\"held\"} 1"),
            "{text}"
        );
        // Re-read unchanged: still held, not counted again.
        assert_eq!(current.reload(), Reload::Unchanged);

        // A force naming another policy's digest forces nothing.
        let wrong = pinning(
            &[a.ak_public(), old.ak_public()],
            &format!(r#", "forceReload": "{in_force}""#),
        );
        std::fs::write(&path, &wrong).unwrap();
        assert!(matches!(current.reload(), Reload::Held { .. }));
        // The operator forces exactly the held policy: applied, and the digest is the policy's,
        // not the field's.
        let forced = pinning(
            &[a.ak_public(), old.ak_public()],
            &format!(r#", "forceReload": "{held_digest}""#),
        );
        assert_eq!(digest_of(&forced), held_digest);
        std::fs::write(&path, &forced).unwrap();
        assert_eq!(
            current.reload(),
            Reload::Applied {
                digest: held_digest.clone()
            }
        );
        assert!(current.status().held.is_none());
        assert!(scrape(&registry).contains("attest_proxy_policy_held 0"));

        // Within the share the guard lets a change through: 1 of 2 is not more than 0.5.
        std::fs::write(&path, &both).unwrap();
        let lenient = Current::load(Variant::QemuVtpm, &path, None)
            .unwrap()
            .with_guard(Guard {
                max_refused_share: 0.5,
                ..guard
            });
        std::fs::write(&path, &only_a).unwrap();
        assert!(matches!(lenient.reload(), Reload::Applied { .. }));
    }

    #[tokio::test]
    async fn watch_applies_changes_until_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attestationConfig");
        project(dir.path(), 1, &config(1, false));
        let current = Arc::new(Current::load(Variant::QemuVtpm, &path, None).unwrap());
        let (trigger, shutdown) = plumbing::shutdown::channel();
        let watcher = tokio::spawn(current.clone().watch(Duration::from_millis(20), shutdown));
        project(dir.path(), 2, &config(2, false));
        let want = digest_of(&config(2, false));
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while current.get().digest != want {
            assert!(tokio::time::Instant::now() < deadline, "change not applied");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        trigger.fire();
        tokio::time::timeout(Duration::from_secs(5), watcher)
            .await
            .unwrap()
            .unwrap();
    }
}
