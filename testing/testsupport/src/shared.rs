//! One control plane for all the tests of a test binary.
//!
//! kube-apiserver takes seconds of CPU to start, so the tests of one binary share one, prepared
//! as [`Kube::start`](crate::cluster::Kube::start) prepares one, and keep out of each other's
//! way. Each test is a [`Tenant`]: it names what it creates with its own prefix
//! ([`Tenant::name`]), sees only the objects that carry it, and talks to the API server through
//! a fault proxy of its own, so its request record and its faults are its own. A test that
//! changes what the whole cluster shares (the `NodeVersion`, `join-control-plane`, Nodes, the
//! single `control-plane` JoiningNode) asks for the cluster [`alone`]: it waits for the others,
//! gets the cluster in its first state, and whoever comes after it gets that state back.
//!
//! The processes run until the test binary ends (they are tied to it, [`crate::process`]). The
//! plane starts on a runtime of its own, on a thread that outlasts every test's runtime, and keeps
//! no client: each caller's admin client ([`ControlPlane::admin`]) is its own, so no connection
//! outlives the test whose runtime drives it.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::{Event, Node, Secret};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use serde_json::{Value, json};
use tokio::sync::{OnceCell, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::cluster::{self, BOOTSTRAP_TOKEN_TYPE, TOKEN_ISSUER, TOKEN_LIFETIME};
use crate::control_plane::{ControlPlane, Options, Pki};
use crate::fixtures::{EDGELESS_GROUP, NODE_VERSION_NAME};
use crate::kube_faults::{Fault, FaultProxy, RequestRecord};

/// The directories of shared control planes start with this, then the test process's pid.
const DIR_PREFIX: &str = "joinservice-control-plane-";

/// The control plane the tests of this binary share.
pub struct SharedPlane {
    plane: ControlPlane,
    pki: Pki,
    /// Read by tests that keep to their own names, written by a test that runs alone. True while
    /// the cluster may differ from its first state.
    changed: RwLock<bool>,
    /// The thread of the test holding the cluster alone, if one does.
    holder: std::sync::Mutex<Option<std::thread::ThreadId>>,
    tenants: AtomicU32,
}

static SHARED: OnceCell<SharedPlane> = OnceCell::const_new();

impl std::fmt::Debug for SharedPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPlane")
            .field("plane", &self.plane)
            .finish_non_exhaustive()
    }
}

/// How long a test waits for the others before it says why it may be waiting forever.
const WAIT_FOR_TURN: Duration = Duration::from_secs(900);

/// A place in the shared cluster beside other tests.
pub async fn tenant() -> Tenant {
    let shared = plane().await;
    shared.refuse_reentry();
    let turn = loop {
        let read = wait_for_turn(shared.changed.read()).await;
        if !*read {
            break Turn::Beside(read);
        }
        drop(read);
        let mut write = wait_for_turn(shared.changed.write()).await;
        if *write {
            shared.reset().await;
            *write = false;
        }
    };
    shared.tenant(turn).await
}

/// The shared cluster alone, in its first state: for a test that changes what every test sees.
pub async fn alone() -> Tenant {
    let shared = plane().await;
    shared.refuse_reentry();
    let mut write = wait_for_turn(shared.changed.write()).await;
    *shared.holder.lock().unwrap_or_else(|e| e.into_inner()) = Some(std::thread::current().id());
    shared.reset().await;
    *write = true;
    shared.tenant(Turn::Alone(write)).await
}

async fn wait_for_turn<T>(turn: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT_FOR_TURN, turn).await {
        Ok(turn) => turn,
        Err(_) => panic!(
            "waited {WAIT_FOR_TURN:?} for the shared control plane: does a test hold it while it \
             waits for it again (a second system started while the first runs, not through \
             Options::cluster)?"
        ),
    }
}

async fn plane() -> &'static SharedPlane {
    match SHARED.get_or_try_init(start_lasting).await {
        Ok(shared) => shared,
        Err(error) => panic!("starting the shared control plane: {error:#}"),
    }
}

/// Starts the plane on a runtime that lasts as long as the process.
async fn start_lasting() -> anyhow::Result<SharedPlane> {
    let (started, result) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("shared-control-plane".to_owned())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(error) => {
                    let _ = started.send(Err(error.into()));
                    return;
                }
            };
            runtime.block_on(async move {
                let _ = started.send(SharedPlane::start().await);
                std::future::pending::<()>().await
            });
        })?;
    result
        .await
        .context("the shared control plane's thread ended")?
}

impl SharedPlane {
    async fn start() -> anyhow::Result<Self> {
        remove_stale_dirs();
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()?
            .keep();
        let pki = Pki::generate(&dir.join("pki"))?;
        let plane = ControlPlane::start(&pki, &dir.join("plane"), &Options::default()).await?;
        cluster::prepare(&plane, None).await?;
        Ok(Self {
            plane,
            pki,
            changed: RwLock::new(false),
            holder: std::sync::Mutex::new(None),
            tenants: AtomicU32::new(0),
        })
    }

    /// Panics if the calling test holds the cluster alone already: it would wait for itself.
    fn refuse_reentry(&self) {
        let holder = *self.holder.lock().unwrap_or_else(|e| e.into_inner());
        assert!(
            holder != Some(std::thread::current().id()),
            "this test holds the shared control plane alone already: start a second system on \
             the same cluster with Options::cluster"
        );
    }

    async fn tenant(&'static self, turn: Turn) -> Tenant {
        let number = self.tenants.fetch_add(1, Ordering::Relaxed);
        let proxy = FaultProxy::start(self.plane.addr(), &self.pki.ca_cert, &self.pki.ca_key).await;
        match proxy {
            Ok(proxy) => {
                let (beside, alone) = match turn {
                    Turn::Beside(read) => (Some(read), None),
                    Turn::Alone(write) => (None, Some(write)),
                };
                Tenant {
                    shared: self,
                    proxy,
                    prefix: format!("t{number}-"),
                    alone: alone.is_some(),
                    _beside: beside,
                    _alone: alone,
                }
            }
            Err(error) => panic!("joining the shared cluster: {error:#}"),
        }
    }

    /// Puts back what tests running alone may change: no bootstrap tokens, Events, Nodes or
    /// JoiningNodes, the `NodeVersion` (without status), its components and `join-control-plane`
    /// as first applied.
    async fn reset(&self) {
        if let Err(error) = self.try_reset().await {
            panic!("resetting the shared cluster: {error:#}");
        }
    }

    async fn try_reset(&self) -> anyhow::Result<()> {
        let admin = self.plane.admin();
        let everything = ListParams::default();
        Api::<Secret>::namespaced(admin.clone(), "kube-system")
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().fields(&format!("type={BOOTSTRAP_TOKEN_TYPE}")),
            )
            .await
            .context("deleting the bootstrap tokens")?;
        Api::<Event>::namespaced(admin.clone(), "kube-system")
            .delete_collection(&DeleteParams::default(), &everything)
            .await
            .context("deleting the Events")?;
        Api::<Node>::all(admin.clone())
            .delete_collection(&DeleteParams::default(), &everything)
            .await
            .context("deleting the Nodes")?;
        cluster::joining_nodes_api(&self.plane)
            .await?
            .delete_collection(&DeleteParams::default(), &everything)
            .await
            .context("deleting the JoiningNodes")?;
        for object in cluster::cluster_objects() {
            self.plane.apply(object).await?;
        }
        let gvk = GroupVersionKind::gvk(EDGELESS_GROUP, "v1alpha1", "NodeVersion");
        self.plane
            .dynamic_api(&gvk, None)
            .await?
            .patch_status(
                NODE_VERSION_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": null})),
            )
            .await
            .context("clearing the NodeVersion's status")?;
        Ok(())
    }
}

/// Removes the directories of shared control planes whose test process has ended.
fn remove_stale_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
            continue;
        };
        let Some((pid, _)) = rest.split_once('-') else {
            continue;
        };
        if pid.parse::<u32>().is_ok() && !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// A tenant's hold on the cluster's state: shared with other tenants, or alone.
enum Turn {
    Beside(RwLockReadGuard<'static, bool>),
    Alone(RwLockWriteGuard<'static, bool>),
}

/// One test's place in the shared cluster: its name prefix and its fault proxy.
pub struct Tenant {
    shared: &'static SharedPlane,
    /// The test's own proxy in front of the API server: its requests, its faults.
    pub proxy: FaultProxy,
    prefix: String,
    alone: bool,
    _beside: Option<RwLockReadGuard<'static, bool>>,
    _alone: Option<RwLockWriteGuard<'static, bool>>,
}

impl std::fmt::Debug for Tenant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenant")
            .field("prefix", &self.prefix)
            .field("alone", &self.is_alone())
            .finish_non_exhaustive()
    }
}

impl Drop for Tenant {
    fn drop(&mut self) {
        if self.alone {
            *self.shared.holder.lock().unwrap_or_else(|e| e.into_inner()) = None;
        }
    }
}

impl Tenant {
    /// `base` under this test's prefix: what the test names its nodes (and so their tokens,
    /// JoiningNodes and Events).
    pub fn name(&self, base: &str) -> String {
        format!("{}{base}", self.prefix)
    }

    /// Whether this test has the cluster to itself ([`alone`]).
    pub fn is_alone(&self) -> bool {
        self.alone
    }

    /// The control plane, to change what the cluster holds. Panics unless the test runs
    /// [`alone`]: the others would see it.
    pub fn plane(&self) -> &ControlPlane {
        assert!(
            self.is_alone(),
            "a test beside others must not change what the whole cluster holds"
        );
        &self.shared.plane
    }

    /// Puts the cluster back in its first state (for a test running [`alone`] through several
    /// cases).
    pub async fn reset(&self) {
        assert!(
            self.is_alone(),
            "only a test running alone resets the cluster"
        );
        self.shared.reset().await;
    }

    /// The cluster's PKI (`/etc/kubernetes/pki` of its control-plane nodes).
    pub fn pki(&self) -> &Pki {
        &self.shared.pki
    }

    /// An admin client (`system:masters`) on the calling test's runtime.
    pub fn admin(&self) -> kube::Client {
        self.shared.plane.admin()
    }

    /// A token the API server issues for token-issuer's ServiceAccount.
    pub async fn token_issuer_token(&self) -> String {
        match cluster::token_issuer_token(&self.shared.plane).await {
            Ok(token) => token,
            Err(error) => panic!("a token for token-issuer: {error:#}"),
        }
    }

    /// A kubeconfig for the API server through this test's proxy, with the token in `token_file`.
    pub fn kubeconfig_via_proxy(&self, token_file: &Path) -> String {
        cluster::kubeconfig_via(&self.shared.plane, self.proxy.addr(), token_file)
    }

    /// A ServiceAccount of this test's own with deploy/base's RBAC for token-issuer, its rules
    /// changed by `edit` (called with each Role's and ClusterRole's kind and rules), and a token
    /// for it once the API server's authorizer grants what is left. deploy/base's admission
    /// policy applies only to token-issuer's own ServiceAccount, not to this one.
    pub async fn token_issuer_like(
        &self,
        suffix: &str,
        edit: impl Fn(&str, &mut Vec<Value>),
    ) -> String {
        match self.try_token_issuer_like(suffix, edit).await {
            Ok(token) => token,
            Err(error) => panic!("a ServiceAccount like token-issuer's: {error:#}"),
        }
    }

    async fn try_token_issuer_like(
        &self,
        suffix: &str,
        edit: impl Fn(&str, &mut Vec<Value>),
    ) -> anyhow::Result<String> {
        use serde::Deserialize as _;
        let name = format!("{TOKEN_ISSUER}-{}{suffix}", self.prefix);
        let plane = &self.shared.plane;
        plane
            .apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                          "metadata": {"name": name, "namespace": "kube-system"}}))
            .await?;
        let path = Path::new(deploy::MANIFEST_DIR).join(deploy::RBAC_FILE);
        let yaml = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let mut granted = Vec::new();
        for document in serde_yaml::Deserializer::from_str(&yaml) {
            let mut object = Value::deserialize(document)?;
            let kind = object["kind"].as_str().unwrap_or_default().to_owned();
            object["metadata"]["name"] = name.clone().into();
            match kind.as_str() {
                "Role" | "ClusterRole" => {
                    let mut rules: Vec<Value> = serde_json::from_value(object["rules"].take())?;
                    edit(&kind, &mut rules);
                    let namespace = object["metadata"]["namespace"].as_str().map(str::to_owned);
                    granted.extend(rules.iter().map(|r| (namespace.clone(), r.clone())));
                    object["rules"] = rules.into();
                }
                "RoleBinding" | "ClusterRoleBinding" => {
                    object["roleRef"]["name"] = name.clone().into();
                    object["subjects"][0]["name"] = name.clone().into();
                }
                other => bail!("{} holds a {other}", path.display()),
            }
            plane.apply(object).await?;
        }
        let user = format!("system:serviceaccount:kube-system:{name}");
        self.wait_granted(&user, &granted).await?;
        plane
            .service_account_token("kube-system", &name, TOKEN_LIFETIME)
            .await
    }

    /// Waits until the authorizer allows `user` the first verb on the first resource of each
    /// rule (the RBAC authorizer learns of new roles and bindings from a watch).
    async fn wait_granted(
        &self,
        user: &str,
        rules: &[(Option<String>, Value)],
    ) -> anyhow::Result<()> {
        let reviews: Api<SubjectAccessReview> = Api::all(self.admin());
        let first = |rule: &Value, key: &str| rule[key][0].as_str().map(str::to_owned);
        let deadline = Instant::now() + Duration::from_secs(10);
        for (namespace, rule) in rules {
            let review = SubjectAccessReview {
                spec: SubjectAccessReviewSpec {
                    user: Some(user.to_owned()),
                    resource_attributes: Some(ResourceAttributes {
                        namespace: namespace.clone(),
                        verb: first(rule, "verbs"),
                        group: first(rule, "apiGroups"),
                        resource: first(rule, "resources"),
                        name: first(rule, "resourceNames"),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                ..Default::default()
            };
            loop {
                let answer = reviews.create(&PostParams::default(), &review).await?;
                if answer.status.is_some_and(|s| s.allowed) {
                    break;
                }
                if Instant::now() > deadline {
                    bail!("{user} is not granted {rule} after 10 s");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        Ok(())
    }

    /// This test's bootstrap token Secrets (those issued for its nodes).
    pub async fn bootstrap_tokens(&self) -> Vec<Secret> {
        let mine = format!("node {}", self.prefix);
        let mut tokens = cluster::bootstrap_tokens(self.admin()).await;
        tokens.retain(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get("description"))
                .is_some_and(|d| String::from_utf8_lossy(&d.0).contains(&mine))
        });
        tokens
    }

    /// This test's JoiningNodes: named after its nodes, or the `control-plane` record naming one.
    pub async fn joining_nodes(&self) -> Vec<DynamicObject> {
        let mine = |name: Option<&str>| name.is_some_and(|name| name.starts_with(&self.prefix));
        let mut nodes = cluster::joining_nodes(&self.shared.plane).await;
        nodes.retain(|n| mine(n.metadata.name.as_deref()) || mine(n.data["spec"]["name"].as_str()));
        nodes
    }

    /// The Events in kube-system about this test's nodes.
    pub async fn events(&self) -> Vec<Event> {
        let mut events = cluster::events(self.admin()).await;
        events.retain(|e| {
            e.involved_object
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(&self.prefix))
        });
        events
    }

    /// Every request made through this test's proxy, in order.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.proxy.requests()
    }

    /// Queues a fault for the next matching request through this test's proxy.
    pub fn inject(&self, fault: Fault) {
        self.proxy.inject(fault);
    }
}
