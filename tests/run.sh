#!/usr/bin/env bash
# The end-to-end suite inside real containerd (tests/README.md). Builds the peers (cached outside
# the checkout by tests/peers/build.sh), builds nri-accel's release binary (a no-op when fresh;
# NRI_ACCEL_BIN names another binary instead), and runs `go test ./e2e/...` as root.
# Usage: tests/run.sh [--matrix] [go test flags, e.g. -run 'TestB_/v1.7.0/device-nodes']
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
versions="${NRI_ACCEL_E2E_CONTAINERD:-v1.7.0,v2.4.2}"
if [ "${1:-}" = --matrix ]; then
    versions=v1.7.0,v1.7.35,v2.1.9,v2.2.9,v2.3.7,v2.4.2,crio-v1.36.3
    shift
fi
[ "$(id -u)" = 0 ] || { echo "tests/run.sh needs root (it runs containerd, runc and mknod)" >&2; exit 1; }

peers=()
IFS=, read -ra vs <<<"$versions"
for v in "${vs[@]}"; do
    case "$v" in crio-*) peers+=("$v") ;; *) peers+=("containerd-$v") ;; esac
done
bash "$here/peers/build.sh" "${peers[@]}"

bin="${NRI_ACCEL_BIN:-}"
if [ -z "$bin" ]; then
    (cd "$here/.." && cargo build --release --locked -p nri-accel)
    bin="${CARGO_TARGET_DIR:-$here/../target}/release/nri-accel"
fi

cd "$here"
NRI_ACCEL_BIN="$bin" NRI_ACCEL_E2E_CONTAINERD="$versions" \
    go test ./e2e/... -count=1 -v -timeout "${NRI_ACCEL_E2E_TIMEOUT:-90m}" "$@"
