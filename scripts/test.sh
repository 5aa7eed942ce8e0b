#!/usr/bin/env bash
# Runs every test. End-to-end tests start the real binaries, so they are built first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/validate-manifests.sh
cargo build --workspace --bins
cargo test --workspace "$@"
