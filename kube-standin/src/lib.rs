//! A stand-in for the Kubernetes API server: real paths, bearer auth, Status bodies (tests and local runs).
