//! The only process with a Kubernetes credential: bootstrap tokens and kubelet certificates.
