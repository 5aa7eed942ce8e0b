#!/usr/bin/env bash
# Validates every manifest that `kubectl apply -k deploy/` installs (the base, deploy/base/,
# which deploy/kustomization.yaml names and nothing else) against the Kubernetes API schemas,
# offline, with a pinned kubernetes-validate (the schemas ship inside the package).
# Checked against the oldest Kubernetes the manifests support (1.30: ValidatingAdmissionPolicy
# is GA there) and the newest the validator knows, in strict mode (unknown fields are errors).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.local/manifest-validator
if [ ! -x "$venv/bin/kubernetes-validate" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check \
        -r scripts/manifest-validator.requirements
fi
base=deploy/base
mapfile -t top < <(sed -n '/^resources:/,/^[^ -]/s/^  - //p' deploy/kustomization.yaml)
if [ "${top[*]}" != base ]; then
    echo "deploy/kustomization.yaml must list only base, not: ${top[*]}" >&2
    exit 1
fi
# The resources kustomize would apply, in order, exactly as the base's kustomization lists them.
mapfile -t resources < <(sed -n '/^resources:/,/^[^ -]/s/^  - //p' "$base/kustomization.yaml")
if [ ${#resources[@]} -eq 0 ]; then
    echo "$base/kustomization.yaml lists no resources" >&2
    exit 1
fi
for file in "$base"/*.yaml; do
    name=$(basename "$file")
    [ "$name" = kustomization.yaml ] && continue
    if ! printf '%s\n' "${resources[@]}" | grep -qx "$name"; then
        echo "$base/$name is not listed in $base/kustomization.yaml" >&2
        exit 1
    fi
done
validator="$PWD/$venv/bin/kubernetes-validate"
for version in 1.30.0 1.37.0; do
    (cd "$base" && "$validator" --strict --quiet -k "$version" "${resources[@]}")
    echo "$base/: ${#resources[@]} manifest files valid against Kubernetes $version"
done
# The TPM device plugin example is made of complete objects too (the overlays are patches, which
# the schemas cannot check on their own).
example=deploy/examples/tpm-device-plugin
mapfile -t example_resources < <(sed -n '/^resources:/,/^[^ -]/s/^  - //p' "$example/kustomization.yaml")
for version in 1.30.0 1.37.0; do
    (cd "$example" && "$validator" --strict --quiet -k "$version" "${example_resources[@]}")
    echo "$example/: ${#example_resources[@]} manifest files valid against Kubernetes $version"
done
