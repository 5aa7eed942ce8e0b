//! The join service's deployment manifests live next to this crate (`kubectl apply -k deploy/`).
//!
//! The crate has no code of its own: its integration tests (`tests/`) read the manifests and
//! check their least-privilege properties, so a change that widens what a container may do
//! fails `cargo test -p deploy`.

/// The directory holding the manifests and `kustomization.yaml`.
pub const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
