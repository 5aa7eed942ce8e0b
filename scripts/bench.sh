#!/usr/bin/env bash
# The join service benchmark: three setups side by side on this machine, in one run.
#   A  plain mutual TLS (ECDSA P-256 client certificates, the server's self-signed P-256 certificate
#      as attest-proxy's) and one unary join.API call to a trivial upstream (fixed answers), which
#      terminates TLS itself in its own process
#   B  aTLS with attestation verification through the real attest-proxy binary to the same trivial
#      upstream on a Unix socket
#   C  full joins through the whole system (local-cluster: attest-proxy, join-core, token-issuer,
#      the key service, and the real etcd and kube-apiserver local-cluster starts)
#   C-mutual  C with mutual attestation, qemu-vtpm only, run right after C: the service attests
#      itself (local-cluster --attested-service: the certifier on a control-plane swtpm certifies
#      attest-proxy's key) and every node checks that evidence with the real qemu-vtpm validator
#      (atls::ServerPolicy) inside its handshake, as join-client --service-policy does
# B and C run for each attestation variant of --variant (default all nine): qemu-vtpm
# (soft-issuer documents), aws-sev-snp, azure-sev-snp and gcp-sev-snp (simulated AMD machines, their
# ARK the config's amdRootKey; attest-proxy fetches AMD's CRL and chains from a KDS stand-in into a
# collateral directory), qemu-tdx and azure-tdx (TDs on simulated Intel hosts of three platform
# models, the simulated root the config's intelRootKey; attest-proxy fetches TCB info, QE identity
# and CRLs from a PCS stand-in). For the SNP and TDX variants each step also reports the collateral
# fetches per join, from attest-proxy's metrics before and after the step (zero once warm). gcp-sev-snp also
# runs gce-identity against a GCE stand-in; every node is a new instance, so every join costs one
# GCE lookup, reported per join the same way (and gce-identity's CPU counts as the setup's).
# gcp-sev-es, azure-trustedlaunch and aws-nitro-tpm run on software attestation keys: gcp-sev-es
# nodes are simulated GCE confidential VMs, each a new instance (one GCE lookup per join, as
# gcp-sev-snp); azure-trustedlaunch nodes each carry an AK certificate of a simulated Azure vTPM CA
# whose root the config trusts (no cloud lookup, no collateral); aws-nitro-tpm nodes send identity
# documents of one image, their keys trusted under trustAnyAk, and ec2-identity asks an EC2 stand-in
# whether that image supports TPM 2.0: attest-proxy caches the answer per image, so once warm a join
# costs no EC2 lookup (ec2-identity's CPU counts as the setup's).
# at concurrency 1, 16, 64 and 256 (closed loop: N nodes at a time, each a new node with its own
# keys and a new connection with a full handshake). Node identities (kubelet key and CSR, SSH host
# key, attestation key; A: the client certificate) are made before each step, as a node makes its
# keys at boot; the per-join handshake work (a fresh aTLS key and document) is inside the step.
# All setups are started first; then each concurrency's A, B and C steps run back to back, so the
# steps a ratio compares are seconds apart on a machine whose other load drifts. Prints each step's report and a side-by-side
# table with the ratios B/A and C/A (server CPU per operation and throughput), a table of
# C-mutual against C (throughput, server CPU per join, p99, their ratios, and the load generator's
# own CPU per join, where the nodes' check of the service runs, apart), and writes
# target/bench/results.json, target/bench/results.svg, target/bench/results.md (one Markdown table per
# variant, as the README shows them) and the processes' logs (target/bench/logs).
#
# CPU per operation: utime + stime (/proc/<pid>/stat) of the setup's server-side processes during
# the step, divided by its successful operations. A: the trivial mTLS server. B: attest-proxy plus
# the trivial upstream (attest-proxy alone is in the JSON; plus gce-identity or ec2-identity where the
# variant runs one). C: attest-proxy, join-core, token-issuer, keyservice (plus gce-identity or
# ec2-identity) and local-cluster
# (the stand-ins); C-mutual: the same plus the certifier. C's control plane (kube-apiserver and
# etcd, which token-issuer reaches directly) is reported apart, per join, with the API requests
# each step made of it by verb and resource (the API server's apiserver_request_total before and
# after the step), in a table of its own. The load generator runs on the same
# cores; its own CPU is reported apart and is in no ratio. Peak RSS is VmHWM (/proc/<pid>/status).
#
# The figures, the targets and where the CPU goes: tools/loadgen/BENCHMARKS.md.
#
# Not part of the test run. Options go to `loadgen bench` (see `--help`), e.g.
#   scripts/bench.sh --step 10s --warmup 2s            longer steps (default 5s each; 80 steps by default:
#                                                       A, nine Bs, nine Cs and C-mutual at four
#                                                       concurrencies)
#   scripts/bench.sh --setups b,c --concurrency 64     some setups and concurrencies only
#   scripts/bench.sh --ak rsa2048 --no-retry           RSA attestation keys; failures are final
#   scripts/bench.sh --variant aws-sev-snp              B and C for one variant only
#   scripts/bench.sh --variant qemu-tdx,azure-tdx       B and C for the TDX variants
#   scripts/bench.sh --variant gcp-sev-es,azure-trustedlaunch,aws-nitro-tpm
#                                                       B and C for the cloud-trusted vTPM variants
#
#   scripts/bench.sh --crypto [MS]     instead: the signature verifications an attestation costs
#                                      (a real SEV-SNP report's P-384, a TDX-sized P-256), side by
#                                      side in ring, aws-lc-rs and RustCrypto (tools/crypto-bench,
#                                      outside the workspace); MS per provider, default 1500
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
if [ "${1:-}" = "--crypto" ]; then
    shift
    CARGO_TARGET_DIR="$PWD/target/crypto-bench" \
        cargo build --release --manifest-path tools/crypto-bench/Cargo.toml
    exec target/crypto-bench/release/crypto-bench "$@"
fi
cargo build --release --bins -p loadgen -p attest-proxy -p join-core -p token-issuer -p keyservice -p gce-identity -p ec2-identity -p certifier -p testsupport
exec target/release/loadgen bench "$@"
