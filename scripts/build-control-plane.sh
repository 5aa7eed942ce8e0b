#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests and the local run start: kube-apiserver,
# kube-controller-manager and kubectl (the tests render and dry-run deploy/'s kustomizations with
# it) from k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3,
# at the releases and module checksums pinned in testing/control-plane/*/go.{mod,sum}.
#
# The binaries go to <target>/control-plane/<key>/, where <key> hashes the wrapper modules and the
# Go version, and <target>/control-plane/bin links to the newest build. A second run with the same
# key does nothing. <target> is $CARGO_TARGET_DIR, else ./target.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
command -v go >/dev/null || { echo "build-control-plane.sh: needs Go (1.26 or newer) on PATH" >&2; exit 1; }
modules=testing/control-plane
target=${CARGO_TARGET_DIR:-$root/target}
kubernetes=$(awk '$1 == "require" && $2 == "k8s.io/kubernetes" { print $3 }' "$modules/kubernetes/go.mod")
etcd=$(awk '$1 == "go.etcd.io/etcd/server/v3" { print $2 }' "$modules/etcd/go.mod")
[ -n "$kubernetes" ] && [ -n "$etcd" ] || { echo "build-control-plane.sh: no version pinned in $modules" >&2; exit 1; }

key=$( { go version; cat "$modules"/*/go.mod "$modules"/*/go.sum; } | sha256sum | cut -c1-16)
out=$target/control-plane/$kubernetes-etcd-$etcd-$key
binaries=(kube-apiserver kube-controller-manager kubectl etcd)
built=true
for b in "${binaries[@]}"; do [ -x "$out/$b" ] || built=false; done
if $built; then
    ln -sfn "$(basename "$out")" "$target/control-plane/bin"
    exit 0
fi

echo "building kube-apiserver, kube-controller-manager and kubectl $kubernetes, etcd $etcd (once per version)"
partial=$out.partial
rm -rf "$partial"
mkdir -p "$partial"
# The checksums in go.sum are the pin: the build refuses a module whose contents differ.
export GOFLAGS="-mod=readonly -trimpath -buildvcs=false"
minor=${kubernetes#v1.}
minor=${minor%%.*}
version_flags="-X k8s.io/component-base/version.gitVersion=$kubernetes"
version_flags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
version_flags+=" -X k8s.io/component-base/version.gitTreeState=clean"
(cd "$modules/kubernetes" && go build -ldflags "-s -w $version_flags" -o "$partial/" \
    k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
    k8s.io/kubernetes/cmd/kubectl)
(cd "$modules/etcd" && go build -ldflags "-s -w" -o "$partial/etcd" go.etcd.io/etcd/server/v3)
rm -rf "$out"
mv "$partial" "$out"
ln -sfn "$(basename "$out")" "$target/control-plane/bin"
"$out/kube-apiserver" --version
"$out/etcd" --version
