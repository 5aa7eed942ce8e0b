//! The join service's deployment manifests live next to this crate: the base in `base/`, which
//! `kubectl apply -k deploy/` applies, and the overlays in `examples/`.
//!
//! The crate's integration tests (`tests/`) read the manifests and check their least-privilege
//! properties, so a change that widens what a container may do fails `cargo test -p deploy`.
//! What the RBAC and the admission policy allow and refuse is judged by a real kube-apiserver in
//! `testing/testsupport/tests/least_privilege.rs`, where the tests apply these files unchanged.

/// The directory holding the base manifests and their `kustomization.yaml` (`deploy/base`).
pub const MANIFEST_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/base");

/// The manifest that holds every Role, ClusterRole and binding of the join service.
pub const RBAC_FILE: &str = "rbac.yaml";

/// The manifest that holds the ValidatingAdmissionPolicy narrowing token-issuer's Secrets.
pub const ADMISSION_POLICY_FILE: &str = "admission-policy.yaml";
