//! Test and local-run support: key service and Kubernetes API stand-ins, swtpm and process harness.
