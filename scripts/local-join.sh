#!/usr/bin/env bash
# Starts the whole system locally (swtpm, key service, etcd and kube-apiserver, token-issuer,
# join-core, attest-proxy, and the certifier on a second swtpm standing for the control-plane
# node's TPM) and joins a node through it, the node verifying the service's evidence first.
#   scripts/local-join.sh                      one join and one rejoin, then exit
#   scripts/local-join.sh --serve [--listen 0.0.0.0:9090] [--attestation-config FILE] [--trust-any-ak]
#                                              keep serving in the foreground until Ctrl-C, and
#                                              print a join-client command that verifies the service
# With --variant (the SEV-SNP and TDX variants on simulated hardware, gcp-sev-es on a simulated
# GCE confidential VM) the service does not attest itself: the certifier attests with a TPM, as
# qemu-vtpm only. --kds-url URL [--kds-ca-file PEM]
# (SEV-SNP) and --pcs-url URL [--pcs-ca-file PEM] (TDX) make attest-proxy fetch collateral from a
# service of your own (a mirror, a test server) instead of the stand-in; the simulated nodes
# verify only against the stand-in, so add --no-demo and your --attestation-config.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --workspace --bins
attested=(--attested-service)
for arg in "$@"; do
    case "$arg" in
        --variant | --variant=*) attested=() ;;
    esac
done
exec target/release/local-cluster "${attested[@]}" "$@"
