#!/usr/bin/env bash
# System packages the build, the tests and the local run need (Debian). Idempotent.
#   swtpm, swtpm-tools  a real TPM 2.0 emulator the node client attests with
#   libtss2-dev         the TPM software stack (TSS) tss-esapi links against (node side only)
#   tpm2-tools          handy for inspecting the emulated TPM
#   openssl             the openssl CLI as a foreign TLS client in tests (no library is linked)
#   procps              kill(1), used by tests to send SIGTERM
#   util-linux          setpriv: the processes tests and local-cluster start end when their starter
#                       does, even by SIGKILL (a parent-death signal)
#   pkg-config          finds libtss2 at build time
#   openssh-client      ssh-keygen, an independent check of the SSH host certificates in tests
#   python3, python3-venv  run the pinned offline manifest validator (scripts/validate-manifests.sh)
#   binutils            readelf, which the deploy tests use to read the certifier's DT_NEEDED
#   gcc, libc6-dev      compile AWS-LC, the C and assembly beneath aws-lc-rs, the crypto provider
# Then it builds the real control plane the tests start (etcd, kube-apiserver, kubectl) from their
# Go modules with the machine's Go toolchain (scripts/build-control-plane.sh; cached).
set -euo pipefail
cd "$(dirname "$0")/.."
packages=(swtpm swtpm-tools libtss2-dev tpm2-tools openssl procps util-linux pkg-config openssh-client python3 python3-venv binutils gcc libc6-dev)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "installing: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}"
fi
scripts/build-control-plane.sh
