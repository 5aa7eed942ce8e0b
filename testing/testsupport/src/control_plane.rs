//! A real Kubernetes control plane for tests and the local run: etcd and kube-apiserver, built
//! from their Go modules by `scripts/build-control-plane.sh`, started on loopback with TLS as a
//! kubeadm cluster runs them.
//!
//! The API server authenticates clients by the cluster CA (`--client-ca-file`: the CA
//! token-issuer signs kubelet certificates with), by bootstrap tokens and by service-account
//! tokens it signs itself; it authorizes with the Node authorizer and RBAC, and runs the default
//! admission chain (ValidatingAdmissionPolicy among it) plus NodeRestriction. etcd speaks TLS
//! with client certificates from the etcd CA. [`ControlPlane::prepare_constellation`] then
//! applies what a Constellation cluster holds before the join service arrives, and
//! [`ControlPlane::apply_deploy_base`] the project's own RBAC and admission policy, unchanged.
//!
//! The harness keeps an admin client (`system:masters`) to set the cluster up and to look at what
//! joins wrote; nothing in the join path gets it: token-issuer authenticates with a token the API
//! server issues for its ServiceAccount ([`ControlPlane::service_account_token`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine as _;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;

use crate::process::{Process, bin_dir, built, free_port};

/// The field manager the harness applies its objects with.
const FIELD_MANAGER: &str = "joinservice-testsupport";

/// What a Constellation cluster holds before the join service arrives (CRDs, kubeadm's grants).
const CLUSTER_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../control-plane/cluster");

/// The service-account issuer, as kubeadm sets it.
pub const SERVICE_ACCOUNT_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// The files of a kubeadm PKI directory the control plane is started from.
#[derive(Clone, Debug)]
pub struct Pki {
    /// `ca.crt`, `ca.key`: the cluster CA (client CA, signs the API server's certificate).
    pub ca_cert: PathBuf,
    /// See [`Pki::ca_cert`].
    pub ca_key: PathBuf,
    /// `sa.key`, `sa.pub`: the service-account token signing key.
    pub sa_key: PathBuf,
    /// See [`Pki::sa_key`].
    pub sa_pub: PathBuf,
    /// `etcd/ca.crt`, `etcd/ca.key`: etcd's CA.
    pub etcd_ca_cert: PathBuf,
    /// See [`Pki::etcd_ca_cert`].
    pub etcd_ca_key: PathBuf,
    /// `front-proxy-ca.crt`, `front-proxy-ca.key`: the aggregation layer's CA.
    pub front_proxy_ca_cert: PathBuf,
    /// See [`Pki::front_proxy_ca_cert`].
    pub front_proxy_ca_key: PathBuf,
}

impl Pki {
    /// The kubeadm layout under `dir` (`/etc/kubernetes/pki` on a node).
    pub fn kubeadm(dir: &Path) -> Self {
        Self {
            ca_cert: dir.join("ca.crt"),
            ca_key: dir.join("ca.key"),
            sa_key: dir.join("sa.key"),
            sa_pub: dir.join("sa.pub"),
            etcd_ca_cert: dir.join("etcd/ca.crt"),
            etcd_ca_key: dir.join("etcd/ca.key"),
            front_proxy_ca_cert: dir.join("front-proxy-ca.crt"),
            front_proxy_ca_key: dir.join("front-proxy-ca.key"),
        }
    }

    /// Generates a kubeadm PKI under `dir`: the cluster, front-proxy and etcd CAs and the
    /// service-account key pair, as `kubeadm init` writes them.
    pub fn generate(dir: &Path) -> anyhow::Result<Self> {
        let pki = Self::kubeadm(dir);
        std::fs::create_dir_all(dir.join("etcd"))?;
        for (cert, key, cn) in [
            (&pki.ca_cert, &pki.ca_key, "kubernetes"),
            (
                &pki.front_proxy_ca_cert,
                &pki.front_proxy_ca_key,
                "front-proxy-ca",
            ),
            (&pki.etcd_ca_cert, &pki.etcd_ca_key, "etcd-ca"),
        ] {
            let (cert_pem, key_pem) = self_signed_ca(cn)?;
            std::fs::write(cert, cert_pem)?;
            std::fs::write(key, key_pem)?;
        }
        let sa = rcgen::KeyPair::generate()?;
        std::fs::write(&pki.sa_key, sa.serialize_pem())?;
        std::fs::write(&pki.sa_pub, sa.public_key_pem())?;
        Ok(pki)
    }
}

/// A self-signed CA named `cn`: (certificate PEM, key PEM).
fn self_signed_ca(cn: &str) -> anyhow::Result<(String, String)> {
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, cn);
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// How to start the control plane.
#[derive(Clone, Debug, Default)]
pub struct Options {
    /// etcd syncs every write to disk, as in a cluster. Off (`--unsafe-no-fsync`) for tests,
    /// which measure nothing and would otherwise wait on the disk for every write.
    pub fsync: bool,
    /// Also run kube-controller-manager, with only the controller that type-checks
    /// ValidatingAdmissionPolicies and writes the result to their `status.typeChecking`.
    pub type_checking: bool,
}

/// Running etcd, kube-apiserver and, with [`Options::type_checking`], kube-controller-manager;
/// they end when this is dropped.
pub struct ControlPlane {
    controller_manager: Option<Process>,
    apiserver: Process,
    etcd: Process,
    addr: SocketAddr,
    ca_pem: String,
    /// The admin client's configuration; each [`ControlPlane::admin`] is a client of its own.
    admin_config: kube::Config,
    admin_kubeconfig: String,
    admin_kubeconfig_path: PathBuf,
    dir: PathBuf,
}

/// The directory holding the built control-plane binaries: `JOINSERVICE_CONTROL_PLANE_DIR`, else
/// `<target>/control-plane/bin` (where `scripts/build-control-plane.sh` links its build).
pub fn bin_dir_control_plane() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("JOINSERVICE_CONTROL_PLANE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let profile_dir = bin_dir()?;
    let target = profile_dir
        .parent()
        .context("the binaries' directory has no parent")?;
    Ok(target.join("control-plane/bin"))
}

fn control_plane_bin(name: &str) -> anyhow::Result<PathBuf> {
    built(
        &bin_dir_control_plane()?,
        name,
        "scripts/build-control-plane.sh",
    )
}

/// The CA in the PEM files `cert` and `key`, to sign certificates with.
pub(crate) fn load_issuer(
    cert: &Path,
    key: &Path,
) -> anyhow::Result<rcgen::Issuer<'static, rcgen::KeyPair>> {
    let cert = std::fs::read_to_string(cert).with_context(|| cert.display().to_string())?;
    let key = std::fs::read_to_string(key).with_context(|| key.display().to_string())?;
    Ok(rcgen::Issuer::from_ca_cert_pem(
        &cert,
        rcgen::KeyPair::from_pem(&key)?,
    )?)
}

/// A certificate signed by the CA in `ca_cert`/`ca_key`, written as `<stem>.crt` and
/// `<stem>.key` into `dir`.
fn issue(
    dir: &Path,
    stem: &str,
    ca: (&Path, &Path),
    common_name: &str,
    organization: Option<&str>,
    sans: &[&str],
    usages: &[rcgen::ExtendedKeyUsagePurpose],
) -> anyhow::Result<(PathBuf, PathBuf)> {
    let issuer = load_issuer(ca.0, ca.1)?;
    let key = rcgen::KeyPair::generate()?;
    let mut params =
        rcgen::CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, common_name);
    if let Some(o) = organization {
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, o);
    }
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = usages.to_vec();
    let cert = params.signed_by(&key, &issuer)?;
    let cert_path = dir.join(format!("{stem}.crt"));
    let key_path = dir.join(format!("{stem}.key"));
    std::fs::write(&cert_path, cert.pem())?;
    std::fs::write(&key_path, key.serialize_pem())?;
    Ok((cert_path, key_path))
}

/// A kubeconfig for `server` trusting `ca_pem`, authenticating with `user` (the lines under
/// `user:`).
fn kubeconfig(server: &str, ca_pem: &str, user_name: &str, user: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: joinservice\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: {user_name}\n  user:\n{user}contexts:\n- name: {user_name}\n  context:\n    cluster: joinservice\n    user: {user_name}\ncurrent-context: {user_name}\n"
    )
}

/// A token the API server behind `admin` issues for ServiceAccount `namespace/name`
/// (TokenRequest), valid for `lifetime`, for the API server's own audience.
pub async fn request_token(
    admin: &kube::Client,
    namespace: &str,
    name: &str,
    lifetime: Duration,
) -> anyhow::Result<String> {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(i64::try_from(lifetime.as_secs())?),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer: TokenRequest = accounts
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .with_context(|| format!("TokenRequest for {namespace}/{name}"))?;
    answer
        .status
        .and_then(|status| status.token)
        .context("TokenRequest answered without a token")
}

/// A client from kubeconfig text.
pub async fn client_from_kubeconfig(text: &str) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(config_from_kubeconfig(text).await?)?)
}

/// The client configuration kubeconfig text describes.
async fn config_from_kubeconfig(text: &str) -> anyhow::Result<kube::Config> {
    // kube-rs builds its rustls config from the process default provider; ours is aws-lc-rs.
    let _ = rustls23::crypto::aws_lc_rs::default_provider().install_default();
    let kubeconfig = kube::config::Kubeconfig::from_yaml(text)?;
    Ok(kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?)
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("addr", &self.addr)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver with the CAs of `pki` and waits until the API server is
    /// ready (`/readyz`: its post-start hooks, the RBAC bootstrap roles among them, have run).
    /// Working files and logs go under `dir`.
    pub async fn start(pki: &Pki, dir: &Path, options: &Options) -> anyhow::Result<Self> {
        // A booting kube-apiserver takes about 3 CPU-seconds in its first seconds (its storage,
        // its bootstrap roles and flow schemas): one boot at a time per process, so tests that
        // start systems side by side on two cores do not starve each other's joins.
        static BOOTING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _one_boot_at_a_time = BOOTING.lock().await;
        // Only this process's uid may enter: the admin key and the API server's and etcd's
        // serving keys are no business of the join service's processes (other uids as root).
        use std::os::unix::fs::PermissionsExt as _;
        let certs = dir.join("control-plane-pki");
        let logs = dir.join("control-plane-logs");
        for private in [&certs, &logs] {
            std::fs::create_dir_all(private)?;
            std::fs::set_permissions(private, std::fs::Permissions::from_mode(0o700))?;
        }
        use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
        let etcd_ca = (pki.etcd_ca_cert.as_path(), pki.etcd_ca_key.as_path());
        let cluster_ca = (pki.ca_cert.as_path(), pki.ca_key.as_path());
        let front_proxy_ca = (
            pki.front_proxy_ca_cert.as_path(),
            pki.front_proxy_ca_key.as_path(),
        );
        let loopback = ["127.0.0.1", "localhost"];
        let (etcd_cert, etcd_key) = issue(
            &certs,
            "etcd-server",
            etcd_ca,
            "etcd",
            None,
            &loopback,
            &[ServerAuth, ClientAuth],
        )?;
        let (etcd_client_cert, etcd_client_key) = issue(
            &certs,
            "apiserver-etcd-client",
            etcd_ca,
            "kube-apiserver-etcd-client",
            None,
            &[],
            &[ClientAuth],
        )?;
        let (serving_cert, serving_key) = issue(
            &certs,
            "apiserver",
            cluster_ca,
            "kube-apiserver",
            None,
            &[
                "127.0.0.1",
                "localhost",
                "10.96.0.1",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
            &[ServerAuth],
        )?;
        let (front_proxy_cert, front_proxy_key) = issue(
            &certs,
            "front-proxy-client",
            front_proxy_ca,
            "front-proxy-client",
            None,
            &[],
            &[ClientAuth],
        )?;
        let (admin_cert, admin_key) = issue(
            &certs,
            "admin",
            cluster_ca,
            "kubernetes-admin",
            Some("system:masters"),
            &[],
            &[ClientAuth],
        )?;

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let mut etcd_command = Command::new(control_plane_bin("etcd")?);
        etcd_command
            .args(["--name", "joinservice"])
            .arg("--data-dir")
            .arg(dir.join("etcd-data"))
            .arg(format!(
                "--listen-client-urls=https://127.0.0.1:{etcd_port}"
            ))
            .arg(format!(
                "--advertise-client-urls=https://127.0.0.1:{etcd_port}"
            ))
            .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"))
            .arg(format!(
                "--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"
            ))
            .arg(format!(
                "--initial-cluster=joinservice=http://127.0.0.1:{peer_port}"
            ))
            .arg("--cert-file")
            .arg(&etcd_cert)
            .arg("--key-file")
            .arg(&etcd_key)
            .arg("--trusted-ca-file")
            .arg(&pki.etcd_ca_cert)
            .arg("--client-cert-auth")
            .args(["--log-level", "warn"]);
        if !options.fsync {
            etcd_command.arg("--unsafe-no-fsync");
        }
        let mut etcd = Process::spawn("etcd", &etcd_command, &logs)?;
        etcd.wait_for_tcp(SocketAddr::from(([127, 0, 0, 1], etcd_port)))?;

        let port = free_port()?;
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let mut apiserver_command = Command::new(control_plane_bin("kube-apiserver")?);
        apiserver_command
            .args([
                "--bind-address",
                "127.0.0.1",
                "--advertise-address",
                "127.0.0.1",
            ])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--etcd-servers=https://127.0.0.1:{etcd_port}"))
            .arg("--etcd-cafile")
            .arg(&pki.etcd_ca_cert)
            .arg("--etcd-certfile")
            .arg(&etcd_client_cert)
            .arg("--etcd-keyfile")
            .arg(&etcd_client_key)
            .arg("--tls-cert-file")
            .arg(&serving_cert)
            .arg("--tls-private-key-file")
            .arg(&serving_key)
            .arg("--client-ca-file")
            .arg(&pki.ca_cert)
            .args(["--authorization-mode", "Node,RBAC"])
            .arg("--enable-bootstrap-token-auth")
            .args(["--enable-admission-plugins", "NodeRestriction"])
            .args(["--service-account-issuer", SERVICE_ACCOUNT_ISSUER])
            .arg("--service-account-key-file")
            .arg(&pki.sa_pub)
            .arg("--service-account-signing-key-file")
            .arg(&pki.sa_key)
            .args(["--service-cluster-ip-range", "10.96.0.0/12"])
            .arg("--requestheader-client-ca-file")
            .arg(&pki.front_proxy_ca_cert)
            .args(["--requestheader-allowed-names", "front-proxy-client"])
            .args(["--requestheader-username-headers", "X-Remote-User"])
            .args(["--requestheader-group-headers", "X-Remote-Group"])
            .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"])
            .arg("--proxy-client-cert-file")
            .arg(&front_proxy_cert)
            .arg("--proxy-client-key-file")
            .arg(&front_proxy_key)
            .arg("--profiling=false");
        let mut apiserver = Process::spawn("kube-apiserver", &apiserver_command, &logs)?;

        let ca_pem = std::fs::read_to_string(&pki.ca_cert)?;
        let server = format!("https://{addr}");
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            admin_cert.display(),
            admin_key.display()
        );
        let admin_kubeconfig = kubeconfig(&server, &ca_pem, "kubernetes-admin", &user);
        // Private, as the admin certificate it names (kubeadm's admin.conf).
        let admin_kubeconfig_path = certs.join("admin.conf");
        std::fs::write(&admin_kubeconfig_path, &admin_kubeconfig)?;
        let admin_config = config_from_kubeconfig(&admin_kubeconfig).await?;
        let admin = kube::Client::try_from(admin_config.clone())?;
        Self::wait_ready(&mut apiserver, &admin).await?;

        let controller_manager = if options.type_checking {
            let (cert, key) = issue(
                &certs,
                "controller-manager",
                cluster_ca,
                "system:kube-controller-manager",
                None,
                &[],
                &[ClientAuth],
            )?;
            let user = format!(
                "    client-certificate: {}\n    client-key: {}\n",
                cert.display(),
                key.display()
            );
            let config = certs.join("controller-manager.conf");
            std::fs::write(
                &config,
                kubeconfig(&server, &ca_pem, "system:kube-controller-manager", &user),
            )?;
            let mut command = Command::new(control_plane_bin("kube-controller-manager")?);
            command
                .arg("--kubeconfig")
                .arg(&config)
                .args([
                    "--controllers",
                    "validatingadmissionpolicy-status-controller",
                ])
                .arg("--use-service-account-credentials=true")
                .arg("--root-ca-file")
                .arg(&pki.ca_cert)
                .arg("--leader-elect=false")
                .arg("--secure-port=0");
            Some(Process::spawn("kube-controller-manager", &command, &logs)?)
        } else {
            None
        };
        Ok(Self {
            controller_manager,
            etcd,
            apiserver,
            addr,
            ca_pem,
            admin_config,
            admin_kubeconfig,
            admin_kubeconfig_path,
            dir: dir.to_path_buf(),
        })
    }

    async fn wait_ready(apiserver: &mut Process, admin: &kube::Client) -> anyhow::Result<()> {
        let timeout = Duration::from_secs(90);
        let deadline = Instant::now() + timeout;
        loop {
            apiserver.check_running()?;
            let request = http::Request::get("/readyz").body(Vec::new())?;
            match admin.request_text(request).await {
                Ok(text) if text.trim() == "ok" => return Ok(()),
                Ok(_) | Err(_) if Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Ok(text) => bail!("kube-apiserver not ready after {timeout:?}: {text}"),
                Err(error) => bail!(
                    "kube-apiserver not ready after {timeout:?}: {error}; its log:\n{}",
                    apiserver.log()
                ),
            }
        }
    }

    /// The API server's address (loopback).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<addr>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The cluster CA the API server's certificate chains to (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The admin client (`system:masters`): for setting up and inspecting, never for the join
    /// path. A new client each time, whose connections belong to the caller's runtime: a kube
    /// client's requests run on the runtime that polls them, so one client shared by tests (the
    /// shared plane's) would keep connections whose tasks died with the test that opened them.
    pub fn admin(&self) -> kube::Client {
        match kube::Client::try_from(self.admin_config.clone()) {
            Ok(client) => client,
            // The same configuration made the client start() waited with.
            Err(error) => panic!("the admin client: {error}"),
        }
    }

    /// The admin kubeconfig text.
    pub fn admin_kubeconfig(&self) -> &str {
        &self.admin_kubeconfig
    }

    /// The file holding [`ControlPlane::admin_kubeconfig`], readable by this process's uid only.
    pub fn admin_kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig_path
    }

    /// A kubeconfig authenticating with the bearer token in `token_file`, re-read as it changes
    /// (as a pod's projected token is).
    pub fn token_file_kubeconfig(&self, token_file: &Path) -> String {
        let user = format!("    tokenFile: {}\n", token_file.display());
        kubeconfig(&self.url(), &self.ca_pem, "token", &user)
    }

    /// A kubeconfig authenticating with `token`.
    pub fn token_kubeconfig(&self, token: &str) -> String {
        let user = format!("    token: {token}\n");
        kubeconfig(&self.url(), &self.ca_pem, "token", &user)
    }

    /// A kubeconfig authenticating with a client certificate and key (PEM files).
    pub fn certificate_kubeconfig(&self, cert: &Path, key: &Path) -> String {
        let user = format!(
            "    client-certificate: {}\n    client-key: {}\n",
            cert.display(),
            key.display()
        );
        kubeconfig(&self.url(), &self.ca_pem, "certificate", &user)
    }

    /// A token the API server issues for ServiceAccount `namespace/name` (TokenRequest), valid
    /// for `lifetime`, for the API server's own audience.
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        lifetime: Duration,
    ) -> anyhow::Result<String> {
        request_token(&self.admin(), namespace, name, lifetime).await
    }

    /// Applies every object of a multi-document YAML text as the admin (server-side apply),
    /// waiting for each CustomResourceDefinition to be established before the next object.
    pub async fn apply_yaml(&self, yaml: &str) -> anyhow::Result<()> {
        use serde::Deserialize as _;
        for document in serde_yaml::Deserializer::from_str(yaml) {
            let value = serde_json::Value::deserialize(document)?;
            if value.is_null() {
                continue;
            }
            self.apply(value).await?;
        }
        Ok(())
    }

    /// Applies one object as the admin (server-side apply, forced) and returns it as stored.
    pub async fn apply(&self, object: serde_json::Value) -> anyhow::Result<DynamicObject> {
        let object: DynamicObject = serde_json::from_value(object)?;
        let types = object
            .types
            .clone()
            .context("an object without apiVersion/kind")?;
        let gvk = GroupVersionKind::try_from(&types)?;
        let name = object
            .metadata
            .name
            .clone()
            .context("an object without a name")?;
        let api = self
            .dynamic_api(&gvk, object.metadata.namespace.as_deref())
            .await?;
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let stored = api
            .patch(&name, &params, &Patch::Apply(&object))
            .await
            .with_context(|| format!("applying {} {name}", types.kind))?;
        if types.kind == "CustomResourceDefinition" {
            self.wait_established(&name).await?;
        }
        Ok(stored)
    }

    /// The dynamic API of `gvk`, in `namespace` when given.
    pub async fn dynamic_api(
        &self,
        gvk: &GroupVersionKind,
        namespace: Option<&str>,
    ) -> anyhow::Result<Api<DynamicObject>> {
        let admin = self.admin();
        let (resource, _) = kube::discovery::pinned_kind(&admin, gvk)
            .await
            .with_context(|| format!("discovering {gvk:?}"))?;
        Ok(match namespace {
            Some(ns) => Api::namespaced_with(admin, ns, &resource),
            None => Api::all_with(admin, &resource),
        })
    }

    async fn wait_established(&self, name: &str) -> anyhow::Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crds: Api<CustomResourceDefinition> = Api::all(self.admin());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let crd = crds.get(name).await?;
            let established = crd
                .status
                .and_then(|status| status.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("CustomResourceDefinition {name} not established after 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Applies what a Constellation cluster holds before the join service arrives: kubeadm's
    /// grants to bootstrap tokens and nodes, the node operator's CRDs, the objects in `cluster`
    /// (the `NodeVersion`, its components ConfigMap, `join-control-plane`, ...).
    pub async fn prepare_constellation(
        &self,
        cluster: impl IntoIterator<Item = serde_json::Value>,
    ) -> anyhow::Result<()> {
        for file in ["kubeadm.yaml", "constellation-crds.yaml"] {
            let path = Path::new(CLUSTER_DIR).join(file);
            let yaml = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            self.apply_yaml(&yaml)
                .await
                .with_context(|| format!("applying {}", path.display()))?;
        }
        for object in cluster {
            self.apply(object).await?;
        }
        Ok(())
    }

    /// Applies the project's ServiceAccount, admission policy and RBAC from `deploy/base`, as
    /// they are, or RBAC from `rbac` instead of `deploy/base/rbac.yaml`.
    pub async fn apply_deploy_base(&self, rbac: Option<&Path>) -> anyhow::Result<()> {
        let base = Path::new(deploy::MANIFEST_DIR);
        let rbac = rbac.map_or_else(|| base.join(deploy::RBAC_FILE), Path::to_path_buf);
        let files = [
            base.join("serviceaccount.yaml"),
            base.join(deploy::ADMISSION_POLICY_FILE),
            rbac,
        ];
        for path in files {
            let yaml = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            self.apply_yaml(&yaml)
                .await
                .with_context(|| format!("applying {}", path.display()))?;
        }
        Ok(())
    }

    /// Waits until the API server enforces deploy/base's admission policy for the caller of
    /// `token` (token-issuer's): the admission plugin learns of a new policy from a watch, so
    /// for a moment after it is applied every Secret RBAC allows is admitted. Asks with a dry run,
    /// which runs admission and stores nothing.
    pub async fn wait_admission_enforced(&self, token: &str) -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Secret;
        let client = client_from_kubeconfig(&self.token_kubeconfig(token)).await?;
        let secrets: Api<Secret> = Api::namespaced(client, "kube-system");
        let probe: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "admission-probe", "namespace": "kube-system"},
            "type": "Opaque",
        }))?;
        let params = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match secrets.create(&params, &probe).await {
                Err(kube::Error::Api(status))
                    if status.code == 403
                        && status.message.contains("ValidatingAdmissionPolicy") =>
                {
                    return Ok(());
                }
                answer if Instant::now() > deadline => {
                    bail!("the admission policy is not enforced after 30 s: {answer:?}")
                }
                _ => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        }
    }

    /// The processes' logs, for failure messages.
    pub fn logs(&self) -> String {
        [
            Some(&self.etcd),
            Some(&self.apiserver),
            self.controller_manager.as_ref(),
        ]
        .into_iter()
        .flatten()
        .map(|p| format!("----- {} -----\n{}", p.name(), p.log()))
        .collect::<Vec<_>>()
        .join("\n")
    }

    /// The directory the control plane keeps its files in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
