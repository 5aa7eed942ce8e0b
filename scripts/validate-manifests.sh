#!/usr/bin/env bash
# Validates every manifest that `kubectl apply -k deploy/` installs against the Kubernetes API
# schemas, offline, with a pinned kubernetes-validate (the schemas ship inside the package).
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
# The resources kustomize would apply, in order, exactly as kustomization.yaml lists them.
mapfile -t resources < <(sed -n '/^resources:/,/^[^ -]/s/^  - //p' deploy/kustomization.yaml)
if [ ${#resources[@]} -eq 0 ]; then
    echo "deploy/kustomization.yaml lists no resources" >&2
    exit 1
fi
for file in deploy/*.yaml; do
    name=$(basename "$file")
    [ "$name" = kustomization.yaml ] && continue
    if ! printf '%s\n' "${resources[@]}" | grep -qx "$name"; then
        echo "deploy/$name is not listed in deploy/kustomization.yaml" >&2
        exit 1
    fi
done
for version in 1.30.0 1.37.0; do
    (cd deploy && "../$venv/bin/kubernetes-validate" --strict --quiet -k "$version" "${resources[@]}")
    echo "deploy/: ${#resources[@]} manifest files valid against Kubernetes $version"
done
# The TPM device plugin example is made of complete objects too (the overlays are patches, which
# the schemas cannot check on their own).
example=deploy/examples/tpm-device-plugin
validator="$PWD/$venv/bin/kubernetes-validate"
mapfile -t example_resources < <(sed -n '/^resources:/,/^[^ -]/s/^  - //p' "$example/kustomization.yaml")
for version in 1.30.0 1.37.0; do
    (cd "$example" && "$validator" --strict --quiet -k "$version" "${example_resources[@]}")
    echo "$example/: ${#example_resources[@]} manifest files valid against Kubernetes $version"
done
