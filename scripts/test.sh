#!/usr/bin/env bash
# Runs every test. End-to-end tests start the real binaries, so they are built first.
#
# Tests that need root (they start processes under other uids, as the pod runs them) are named
# `as_root_*` and `#[ignore]`d; this script runs them when it runs as root. Under CI=true (CI runs
# as root) it refuses to run without root, so none is silently left out.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/validate-manifests.sh
cargo build --workspace --bins
cargo test --workspace "$@"
if [ "$(id -u)" -eq 0 ]; then
    cargo test --workspace "$@" -- --ignored as_root_
elif [ "${CI:-}" = "true" ]; then
    echo "scripts/test.sh: CI=true but not root: the as_root_ tests cannot run" >&2
    exit 1
else
    echo "scripts/test.sh: not root, so the as_root_ tests (other uids) did not run" >&2
fi
