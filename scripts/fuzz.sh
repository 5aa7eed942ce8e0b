#!/usr/bin/env bash
# Runs the cargo-fuzz targets in fuzz/ for a given time each; see fuzz/README.md.
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# SECONDS_PER_TARGET defaults to 120; the targets default to all of them. Each target starts
# from its committed seeds (fuzz/seeds/<target>) plus whatever corpus earlier runs left in
# fuzz/corpus/<target>. A crash leaves its input in fuzz/artifacts/<target>/ and makes the script
# exit 1 after the remaining targets ran. Needs cargo-fuzz (`cargo install cargo-fuzz`); the
# stable toolchain is enough, RUSTC_BOOTSTRAP lets it take the nightly-only sanitizer flags.
set -euo pipefail

seconds="${1:-120}"
shift || true
cd "$(dirname "$0")/../fuzz"

all_targets=(cert_extension server_certificate server_collateral document_json tpmt_public tpmt_signature tpms_attest event_log snp_report snp_instance_info snp_cert snp_crl snp_certtable tdx_quote qemu_tdx_document azure_tdx_instance_info azure_trustedlaunch_instance_info gcp_sev_es tdx_collateral tdx_outblob aws_nitro_tpm nitro_tpm_document)
targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    targets=("${all_targets[@]}")
fi

# The largest input worth generating per target: the limit the service enforces before the
# parser runs (a TLS client certificate is at most 64 KiB, so are the document and log inside
# it); TPM structures are a few hundred bytes.
max_len() {
    case "$1" in
        cert_extension | server_certificate | server_collateral | document_json | event_log | snp_instance_info | qemu_tdx_document | azure_tdx_instance_info | tdx_collateral) echo 65536 ;;
        tdx_quote | tdx_outblob) echo 16384 ;;
        *) echo 4096 ;;
    esac
}

export RUSTC_BOOTSTRAP=1
failed=()
for target in "${targets[@]}"; do
    mkdir -p "corpus/$target"
    cp -n "seeds/$target"/* "corpus/$target/" 2>/dev/null || true
    echo "== fuzzing $target for ${seconds}s"
    if ! cargo fuzz run "$target" --target-dir target "corpus/$target" -- \
        -max_total_time="$seconds" -max_len="$(max_len "$target")" -timeout=10 \
        -print_final_stats=1; then
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -ne 0 ]; then
    echo "crashes in: ${failed[*]} (inputs in fuzz/artifacts/); keep each as a regression test" >&2
    exit 1
fi
echo "all ${#targets[@]} targets ran ${seconds}s without a crash"
