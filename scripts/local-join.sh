#!/usr/bin/env bash
# Starts the whole system locally (swtpm, key service, Kubernetes API stand-in, token-issuer,
# join-core, attest-proxy) and joins a node through it.
#   scripts/local-join.sh                      one join and one rejoin, then exit
#   scripts/local-join.sh --serve [--listen 0.0.0.0:9090] [--attestation-config FILE] [--trust-any-ak]
#                                              keep serving in the foreground until Ctrl-C
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --workspace --bins
exec target/release/local-cluster "$@"
