#!/usr/bin/env bash
# Checks the alert rules and the Grafana dashboard (run by .ci/run; by hand as root from the repo
# root: `bash packaging/prometheus/check.sh [--plot]`):
#   1. promtool check rules packaging/prometheus/nri-accel-rules.yaml;
#   2. promtool test rules nri-accel-rules.test.yaml: each alert fires on the fault it names and
#      stays silent on a healthy node;
#   3. the dashboard is valid JSON and names only metrics the daemon exports (or `up`);
#   4. a real Prometheus scrapes nri-accel running inside real containerd while pods and claims
#      go through it, and every panel's query returns data, every rule evaluates, no alert fires
#      (tests/e2e/k_dashboard_test.go, containerd v2.4.2; needs root, Go and the peer build).
# --plot also redraws docs/img/dashboard.png from that run (matplotlib from PyPI).
# Env: NRI_ACCEL_BIN (default target/debug/nri-accel, what the CI test step built);
# NRI_ACCEL_E2E=0 skips step 4, as it skips .ci/run's other real-containerd steps.
# Installs Debian's prometheus (it brings promtool) when missing.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "monitoring check FAILED: $*" >&2; exit 1; }
if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
    echo "installing prometheus from Debian (prometheus, promtool)"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null
fi
echo "tools: $(promtool --version 2>&1 | head -1)"

cd packaging/prometheus
promtool check rules nri-accel-rules.yaml || fail "promtool check rules: fix nri-accel-rules.yaml"
promtool test rules nri-accel-rules.test.yaml || fail "promtool test rules: an alert fired where it must not, or not where it must (nri-accel-rules.test.yaml)"
cd ../..

# Metric names the dashboard and the rules use, against what the daemon registers.
exported=$(grep -oE 'register(_with_unit)?\(\s*"[a-z_]+"' -z plugin/src/metrics/mod.rs | tr '\0' '\n' \
    | grep -oE '"[a-z_]+"' | tr -d '"' | sort -u)
[ -n "$exported" ] || fail "found no registered metric in plugin/src/metrics/mod.rs"
jq -e '.panels | length > 0' packaging/grafana/nri-accel.json >/dev/null || fail "packaging/grafana/nri-accel.json is not a dashboard with panels"
for name in $( { jq -r '.panels[].targets[].expr' packaging/grafana/nri-accel.json; cat packaging/prometheus/nri-accel-rules.yaml; } \
        | grep -oE 'nri_accel_[a-z_]+' | sort -u); do
    base=$(sed -E 's/^nri_accel_//; s/_(bucket|count|sum|total)$//; s/_seconds$//' <<<"$name")
    grep -qx "$base" <<<"$exported" || fail "$name is not a metric nri-accel exports (plugin/src/metrics/mod.rs)"
done
echo "metric names: ok"

if [ "${NRI_ACCEL_E2E:-1}" = 0 ]; then
    echo "the dashboard against a real Prometheus: skipped (NRI_ACCEL_E2E=0 skips every real-containerd step)"
    exit 0
fi
bin="$(realpath -m "${NRI_ACCEL_BIN:-${CARGO_TARGET_DIR:-target}/debug/nri-accel}")"
[ -x "$bin" ] || fail "no nri-accel binary at $bin: cargo build -p nri-accel, or set NRI_ACCEL_BIN"
[ "$(id -u)" = 0 ] || fail "the dashboard check runs real containerd: run it as root"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash tests/peers/build.sh containerd-v2.4.2 >/dev/null
(cd tests && NRI_ACCEL_BIN="$bin" NRI_ACCEL_E2E_CONTAINERD=v2.4.2 NRI_ACCEL_E2E_DASHBOARD=1 \
    NRI_ACCEL_E2E_DASHBOARD_OUT="$out" go test ./e2e/ -run TestK_ -count=1 -v -timeout 10m) \
    || fail "the dashboard against a real Prometheus (tests/e2e/k_dashboard_test.go; logs under tests/results/)"
if [ "${1:-}" = --plot ]; then
    python3 -c 'import matplotlib' 2>/dev/null || pip install -q matplotlib
    python3 packaging/grafana/plot.py "$out/dashboard-data.json" docs/img/dashboard.png
    echo "drew docs/img/dashboard.png"
fi
echo "monitoring checks passed"
