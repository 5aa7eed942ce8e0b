#!/usr/bin/env bash
# The 5,000-node storm for every hardware variant, each against its own local-cluster (release
# build): C's rate at concurrency 64 first (10 s, after a 1 s warm-up), then 5,000 new nodes
# joining at once, retrying as node-client does (every node's keys made before the clock starts, as
# nodes make theirs at boot; each node connects from its own 127.x.y.z address). Per variant it
# prints the storm's report and a line: joined, the storm's time, count ÷ C's rate and their ratio
# (the target: at most 1.5), retries by gRPC code, the collateral attest-proxy fetched since it
# started per item it holds (once per item, not per node), the cloud API lookups of the storm
# (GCE, EC2) and the peak RSS of attest-proxy and of the load generator; and writes
# target/storm/storm.json and the processes' logs (target/storm/logs).
#
# Default variants: aws-sev-snp, azure-sev-snp, gcp-sev-snp, qemu-tdx, azure-tdx (simulated AMD and
# Intel hardware), gcp-sev-es, azure-trustedlaunch, aws-nitro-tpm (software keys on simulated cloud
# VMs), as `loadgen bench` simulates them. Options go to `loadgen storm` (see `--help`), e.g.
#   scripts/storm.sh --variant qemu-tdx --count 1000       one variant, a smaller storm
#   scripts/storm.sh --concurrency 500                     500 at once instead of all
#
# Not part of the test run. The figures: tools/loadgen/BENCHMARKS.md, "Storms per variant".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release --bins -p loadgen -p attest-proxy -p join-core -p token-issuer -p keyservice -p gce-identity -p ec2-identity -p testsupport
# 5,000 nodes at once hold 5,000 connections in the load generator and as many in attest-proxy.
ulimit -n "$(ulimit -Hn)"
exec target/release/loadgen storm "$@"
