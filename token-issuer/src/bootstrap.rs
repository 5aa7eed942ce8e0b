//! Bootstrap tokens: generating them and storing them as the Secret kubeadm's bootstrap
//! authenticator reads (`bootstrap-token-<id>` in `kube-system`).

use std::collections::BTreeMap;
use std::time::Duration;

pub use crate::kube_api::KubeError;
use crate::kube_api::bounded;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use rand::Rng;

/// Namespace of bootstrap token Secrets.
pub const NAMESPACE: &str = "kube-system";
/// Secret type the bootstrap authenticator looks for.
pub const SECRET_TYPE: &str = "bootstrap.kubernetes.io/token";
/// Group the token authenticates into besides `system:bootstrappers`; kubeadm's default RBAC
/// lets it create node CSRs.
pub const EXTRA_GROUPS: &str = "system:bootstrappers:kubeadm:default-node-token";
/// The label on every token Secret token-issuer creates; the admission policy lets it delete
/// only Secrets carrying it, so it can roll back its own tokens and no one else's.
pub const ISSUED_BY_LABEL: &str = "joinservice.edgeless.systems/issued-by";
/// The label's value.
pub const ISSUED_BY: &str = "token-issuer";
/// Constellation's token lifetime.
pub const TOKEN_TTL: time::Duration = time::Duration::minutes(15);

const ALPHABET: &[u8; 36] = b"abcdefghijklmnopqrstuvwxyz0123456789";

/// A bootstrap token, `<id>.<secret>`.
#[derive(Clone, PartialEq, Eq)]
pub struct BootstrapToken {
    /// `[a-z0-9]{6}`, public (it names the Secret).
    pub id: String,
    /// `[a-z0-9]{16}`, the credential.
    pub secret: String,
}

impl std::fmt::Debug for BootstrapToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BootstrapToken")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn random_chars(n: usize) -> String {
    // ThreadRng is a CSPRNG seeded from the OS; random_range is unbiased.
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

impl BootstrapToken {
    /// A fresh random token.
    pub fn generate() -> Self {
        Self {
            id: random_chars(6),
            secret: random_chars(16),
        }
    }

    /// The token as the node presents it.
    pub fn token_string(&self) -> String {
        format!("{}.{}", self.id, self.secret)
    }

    /// The Secret's name.
    pub fn secret_name(&self) -> String {
        format!("bootstrap-token-{}", self.id)
    }

    /// The Secret kubeadm would create for this token, expiring at `expiration`.
    pub fn to_secret(&self, node_name: &str, expiration: time::OffsetDateTime) -> Secret {
        let expiration = rfc3339_seconds(expiration);
        let data: BTreeMap<String, ByteString> = [
            ("token-id", self.id.clone()),
            ("token-secret", self.secret.clone()),
            ("expiration", expiration),
            ("usage-bootstrap-authentication", "true".to_owned()),
            ("usage-bootstrap-signing", "true".to_owned()),
            ("auth-extra-groups", EXTRA_GROUPS.to_owned()),
            (
                "description",
                format!("Bootstrap token for node {node_name}, issued by the join service"),
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), ByteString(v.into_bytes())))
        .collect();
        Secret {
            metadata: ObjectMeta {
                name: Some(self.secret_name()),
                namespace: Some(NAMESPACE.to_owned()),
                labels: Some(BTreeMap::from([(
                    ISSUED_BY_LABEL.to_owned(),
                    ISSUED_BY.to_owned(),
                )])),
                ..ObjectMeta::default()
            },
            type_: Some(SECRET_TYPE.to_owned()),
            data: Some(data),
            ..Secret::default()
        }
    }
}

/// RFC 3339 in UTC with whole seconds, as Go's `time.RFC3339` formats it.
pub(crate) fn rfc3339_seconds(t: time::OffsetDateTime) -> String {
    let f = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    let t = t.to_offset(time::UtcOffset::UTC);
    // Formatting a valid UTC date with this description cannot fail; fall back to the
    // well-known formatter rather than panicking all the same.
    t.format(&f)
        .or_else(|_| t.format(&time::format_description::well_known::Rfc3339))
        .unwrap_or_default()
}

/// The Secrets API as token-issuer uses it: create, and delete for rollback.
#[derive(Clone, Debug)]
pub struct TokenStore {
    api: Api<Secret>,
    timeout: Duration,
}

impl TokenStore {
    /// Secrets in [`NAMESPACE`] through `client`, each call bounded by `timeout` (kube-rs
    /// retries throttling answers on its own; the deadline bounds those retries too).
    pub fn new(client: kube::Client, timeout: Duration) -> Self {
        Self {
            api: Api::namespaced(client, NAMESPACE),
            timeout,
        }
    }

    /// Creates the token's Secret.
    pub async fn create(&self, secret: &Secret) -> Result<(), KubeError> {
        bounded(
            "create_secret",
            self.timeout,
            self.api.create(&PostParams::default(), secret),
        )
        .await
        .map(drop)
    }

    /// Deletes a Secret; absent counts as deleted.
    pub async fn delete(&self, name: &str) -> Result<(), KubeError> {
        match bounded(
            "delete_secret",
            self.timeout,
            self.api.delete(name, &DeleteParams::default()),
        )
        .await
        {
            Err(e) if e.is_not_found() => Ok(()),
            other => other.map(drop),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_shape() {
        let t = BootstrapToken::generate();
        assert_eq!(t.id.len(), 6);
        assert_eq!(t.secret.len(), 16);
        assert!(
            t.token_string()
                .bytes()
                .all(|c| c == b'.' || ALPHABET.contains(&c))
        );
        assert!(!format!("{t:?}").contains(&t.secret));
    }

    #[test]
    fn secrets_carry_the_issued_by_label() {
        let t = BootstrapToken::generate();
        let s = t.to_secret("worker-0", time::OffsetDateTime::now_utc());
        let labels = s.metadata.labels.unwrap_or_default();
        assert_eq!(
            labels.get(ISSUED_BY_LABEL).map(String::as_str),
            Some(ISSUED_BY)
        );
        assert_eq!(labels.len(), 1);
    }

    #[test]
    fn expiration_is_rfc3339_seconds() {
        let t = time::macros::datetime!(2025-01-02 03:04:05.678 UTC);
        assert_eq!(rfc3339_seconds(t), "2025-01-02T03:04:05Z");
    }
}
