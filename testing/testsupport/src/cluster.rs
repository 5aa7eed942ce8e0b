//! The Kubernetes side of the whole-system harness: the real control plane set up as a
//! Constellation cluster with the deployment's RBAC and admission policy, the fault proxy
//! token-issuer reaches it through, and token-issuer's ServiceAccount token.
//!
//! Tests look at what joins wrote with the harness's admin client and ask the API server itself
//! what a ticket's credentials are worth ([`Kube::authenticate`]).

use std::path::Path;
use std::time::Duration;

use crate::fixtures::{
    EDGELESS_GROUP, components_json, constellation_version, control_plane_expectation,
};
use anyhow::Context;
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, UserInfo};
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::core::GroupVersionKind;

use crate::control_plane::{ControlPlane, Options, Pki, client_from_kubeconfig, request_token};
use crate::kube_faults::{Fault, FaultProxy, RequestRecord};
use crate::shared::Tenant;

/// The cluster's Kubernetes version, as its `NodeVersion` names it.
pub const KUBERNETES_VERSION: &str = "v1.31.1";
/// The components ConfigMap the `NodeVersion` names.
pub const COMPONENTS_REF: &str = "k8s-components-sha256-4a7b2c9e";
/// How many control-plane nodes the cluster expects (`join-control-plane`; it has none yet).
pub const EXPECTED_CONTROL_PLANE_NODES: u32 = 3;

/// How long token-issuer's ServiceAccount tokens live; a new one replaces each at half that, as
/// the kubelet renews a pod's projected token before it expires.
pub(crate) const TOKEN_LIFETIME: Duration = Duration::from_secs(3600);

/// The bootstrap token Secret type.
pub(crate) const BOOTSTRAP_TOKEN_TYPE: &str = "bootstrap.kubernetes.io/token";

/// token-issuer's ServiceAccount (and its Role, ClusterRole and bindings) in deploy/base.
pub(crate) const TOKEN_ISSUER: &str = "join-token-issuer";

/// A prepared control plane, its own or the test binary's shared one held alone
/// ([`crate::shared::alone`]), with a fault proxy of its own in front.
#[derive(Debug)]
pub struct Kube {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    /// Proxy first: it stops before the API server it forwards to.
    Own {
        proxy: FaultProxy,
        plane: Box<ControlPlane>,
    },
    Shared(Tenant),
}

/// Applies the Constellation cluster's objects and deploy/base (with `rbac` in place of its RBAC
/// file when given) to `plane`, and waits until the API server enforces the admission policy for
/// token-issuer.
pub async fn prepare(plane: &ControlPlane, rbac: Option<&Path>) -> anyhow::Result<()> {
    plane
        .prepare_constellation(cluster_objects())
        .await
        .context("preparing the cluster")?;
    plane
        .apply_deploy_base(rbac)
        .await
        .context("applying deploy/base")?;
    plane
        .wait_admission_enforced(&token_issuer_token(plane).await?)
        .await
}

/// What a fresh Constellation cluster holds for the join service: its `NodeVersion`, the
/// components ConfigMap it names, and `join-control-plane` expecting
/// [`EXPECTED_CONTROL_PLANE_NODES`] (it has none yet).
pub(crate) fn cluster_objects() -> impl Iterator<Item = serde_json::Value> {
    let version = constellation_version(KUBERNETES_VERSION, COMPONENTS_REF, &components_json());
    let expectation = control_plane_expectation(EXPECTED_CONTROL_PLANE_NODES);
    version.into_iter().chain([expectation])
}

/// A new token `plane` issues for token-issuer's ServiceAccount.
pub(crate) async fn token_issuer_token(plane: &ControlPlane) -> anyhow::Result<String> {
    plane
        .service_account_token("kube-system", TOKEN_ISSUER, TOKEN_LIFETIME)
        .await
}

/// A kubeconfig for `plane` through the proxy at `proxy`, with the token in `token_file`.
pub(crate) fn kubeconfig_via(
    plane: &ControlPlane,
    proxy: std::net::SocketAddr,
    token_file: &Path,
) -> String {
    plane
        .token_file_kubeconfig(token_file)
        .replace(&plane.url(), &format!("https://{proxy}"))
}

/// The bootstrap token Secrets in kube-system, as `admin` lists them.
pub(crate) async fn bootstrap_tokens(admin: kube::Client) -> Vec<Secret> {
    let secrets: Api<Secret> = Api::namespaced(admin, "kube-system");
    let params = ListParams::default().fields(&format!("type={BOOTSTRAP_TOKEN_TYPE}"));
    match secrets.list(&params).await {
        Ok(list) => list.items,
        Err(error) => panic!("listing bootstrap tokens: {error}"),
    }
}

/// The `JoiningNode` API of `plane`.
pub(crate) async fn joining_nodes_api(plane: &ControlPlane) -> anyhow::Result<Api<DynamicObject>> {
    let gvk = GroupVersionKind::gvk(EDGELESS_GROUP, "v1alpha1", "JoiningNode");
    plane.dynamic_api(&gvk, None).await
}

/// The `JoiningNode`s of `plane`.
pub(crate) async fn joining_nodes(plane: &ControlPlane) -> Vec<DynamicObject> {
    let api = match joining_nodes_api(plane).await {
        Ok(api) => api,
        Err(error) => panic!("{error:#}"),
    };
    match api.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => panic!("listing JoiningNodes: {error}"),
    }
}

/// The Events in kube-system, as `admin` lists them.
pub(crate) async fn events(admin: kube::Client) -> Vec<Event> {
    let events: Api<Event> = Api::namespaced(admin, "kube-system");
    match events.list(&ListParams::default()).await {
        Ok(list) => list.items,
        Err(error) => panic!("listing Events: {error}"),
    }
}

/// Renews a token file until dropped ([`Kube::keep_token_fresh`]).
#[derive(Debug)]
pub struct TokenRefresher(tokio::task::JoinHandle<()>);

impl Drop for TokenRefresher {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Kube {
    /// Starts the control plane under `root` with the CAs of `pki`, applies the Constellation
    /// cluster's objects and deploy/base (with `rbac` in place of its RBAC file when given), and
    /// waits until the API server enforces the admission policy for token-issuer.
    pub async fn start(pki: &Pki, root: &Path, rbac: Option<&Path>) -> anyhow::Result<Self> {
        let plane = ControlPlane::start(pki, root, &Options::default())
            .await
            .context("starting the control plane")?;
        prepare(&plane, rbac).await?;
        let proxy = FaultProxy::start(plane.addr(), &pki.ca_cert, &pki.ca_key).await?;
        Ok(Self {
            inner: Inner::Own {
                proxy,
                plane: Box::new(plane),
            },
        })
    }

    /// The test binary's shared control plane, alone and in its first state, for as long as
    /// this lives: no other test changes it meanwhile. Start the system on the cluster's PKI
    /// ([`Kube::pki`]).
    pub async fn shared() -> Self {
        Self {
            inner: Inner::Shared(crate::shared::alone().await),
        }
    }

    /// The PKI of the shared control plane ([`Kube::shared`]); `None` for a plane of its own,
    /// started from the caller's.
    pub fn pki(&self) -> Option<&Pki> {
        match &self.inner {
            Inner::Own { .. } => None,
            Inner::Shared(tenant) => Some(tenant.pki()),
        }
    }

    /// The real etcd and kube-apiserver.
    pub fn plane(&self) -> &ControlPlane {
        match &self.inner {
            Inner::Own { plane, .. } => plane,
            Inner::Shared(tenant) => tenant.plane(),
        }
    }

    /// The fault proxy token-issuer reaches the API server through.
    pub fn proxy(&self) -> &FaultProxy {
        match &self.inner {
            Inner::Own { proxy, .. } => proxy,
            Inner::Shared(tenant) => &tenant.proxy,
        }
    }

    /// A new token the API server issues for token-issuer's ServiceAccount, as each pod gets
    /// its own.
    pub async fn token_issuer_token(&self) -> anyhow::Result<String> {
        token_issuer_token(self.plane()).await
    }

    /// Replaces the token in `path` with a new one every half [`TOKEN_LIFETIME`], keeping the
    /// file's owner and mode (token-issuer re-reads it, as it re-reads a projected token).
    pub fn keep_token_fresh(&self, path: &Path) -> TokenRefresher {
        let admin = self.plane().admin();
        let path = path.to_path_buf();
        TokenRefresher(tokio::spawn(async move {
            loop {
                tokio::time::sleep(TOKEN_LIFETIME / 2).await;
                let token =
                    request_token(&admin, "kube-system", TOKEN_ISSUER, TOKEN_LIFETIME).await;
                let written = token.and_then(|token| replace_keeping_owner(&path, &token));
                if let Err(error) = written {
                    tracing::warn!("renewing token-issuer's token: {error:#}");
                }
            }
        }))
    }

    /// A kubeconfig for the API server itself, with the token in `token_file`.
    pub fn kubeconfig_direct(&self, token_file: &Path) -> String {
        self.plane().token_file_kubeconfig(token_file)
    }

    /// A kubeconfig for the API server through the fault proxy, with the token in `token_file`.
    pub fn kubeconfig_via_proxy(&self, token_file: &Path) -> String {
        kubeconfig_via(self.plane(), self.proxy().addr(), token_file)
    }

    /// The bootstrap token Secrets in kube-system.
    pub async fn bootstrap_tokens(&self) -> Vec<Secret> {
        bootstrap_tokens(self.plane().admin()).await
    }

    /// The `JoiningNode`s.
    pub async fn joining_nodes(&self) -> Vec<DynamicObject> {
        joining_nodes(self.plane()).await
    }

    /// The Events in kube-system.
    pub async fn events(&self) -> Vec<Event> {
        events(self.plane().admin()).await
    }

    /// What joins leave in Kubernetes: bootstrap tokens and `JoiningNode`s, by kind and name.
    pub async fn join_objects(&self) -> Vec<String> {
        let tokens = self
            .bootstrap_tokens()
            .await
            .into_iter()
            .map(|s| format!("Secret {}", s.metadata.name.unwrap_or_default()));
        let nodes = self
            .joining_nodes()
            .await
            .into_iter()
            .map(|n| format!("JoiningNode {}", n.metadata.name.unwrap_or_default()));
        tokens.chain(nodes).collect()
    }

    /// Who the API server says `token` is (SelfSubjectReview), or its refusal.
    pub async fn authenticate(&self, token: &str) -> Result<UserInfo, kube::Error> {
        let client = client_from_kubeconfig(&self.plane().token_kubeconfig(token))
            .await
            .map_err(|error| kube::Error::Service(error.into()))?;
        let reviews: Api<SelfSubjectReview> = Api::all(client);
        let review = reviews
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await?;
        Ok(review
            .status
            .and_then(|status| status.user_info)
            .unwrap_or_default())
    }

    /// Every request token-issuer made, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.proxy().requests()
    }

    /// Queues a fault for token-issuer's next matching request.
    pub fn inject(&self, fault: Fault) {
        self.proxy().inject(fault);
    }

    /// Delays each of token-issuer's requests by `delay`.
    pub fn set_delay(&self, delay: Duration) {
        self.proxy().set_delay(delay);
    }
}

/// Writes `contents` over `path` in one step (a rename), with `path`'s owner and mode.
fn replace_keeping_owner(path: &Path, contents: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::MetadataExt as _;
    let old = std::fs::metadata(path)?;
    let partial = path.with_extension("new");
    std::fs::write(&partial, contents)?;
    std::fs::set_permissions(&partial, old.permissions())?;
    std::os::unix::fs::chown(&partial, Some(old.uid()), Some(old.gid()))?;
    std::fs::rename(&partial, path)?;
    Ok(())
}
