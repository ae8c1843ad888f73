#!/usr/bin/env bash
# Checks the Helm chart packaging/helm/nri-accel (run by .ci/run; by hand from the repo root:
# `bash packaging/helm/check.sh`), with helm built from its Go module (tests/peers/helm-v4.3.2):
#   1. the chart's version and appVersion are the workspace's (Cargo.toml);
#   2. helm lint --strict with the default values and each ci/*-values.yaml (the roles: DRA
#      driver, device plugin, webhook, metrics with a ServiceMonitor);
#   3. helm template of each; the config.yaml each renders passes `nri-accel check-config`
#      (the daemon's own loader: unknown fields, pools, families);
#   4. a ServiceMonitor without the metrics proxy is refused (the daemon serves loopback only);
#   5. packaging/kubernetes/ is the chart's rendering (packaging/helm/render.sh --check).
# Against an API server (the cluster suite, issue 29): with NRI_ACCEL_HELM_KUBECONFIG set it also
# runs `helm install --dry-run=server` of each values file; without it that step says it skipped.
# Env: NRI_ACCEL_BIN (default target/debug/nri-accel) for check-config.
set -euo pipefail
cd "$(dirname "$0")/../.."

fail() { echo "helm check FAILED: $*" >&2; exit 1; }
start=$(date +%s)
helm="$(bash tests/peers/build.sh helm-v4.3.2 | awk '{print $2}')/helm"
[ -x "$helm" ] || fail "tests/peers/build.sh helm-v4.3.2 built no helm"
export HELM="$helm"
chart=packaging/helm/nri-accel
bin="$(realpath -m "${NRI_ACCEL_BIN:-${CARGO_TARGET_DIR:-target}/debug/nri-accel}")"
[ -x "$bin" ] || fail "no nri-accel binary at $bin for check-config: cargo build -p nri-accel, or set NRI_ACCEL_BIN"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
grep -qx "version: $version" "$chart/Chart.yaml" || fail "$chart/Chart.yaml: version is not the workspace's $version"
grep -qx "appVersion: \"$version\"" "$chart/Chart.yaml" || fail "$chart/Chart.yaml: appVersion is not the workspace's \"$version\""

# An empty host root for configs that read the host under /host.
mkdir -p "$work/host/sys" "$work/host/proc/driver" "$work/host/dev"
for values in "" "$chart"/ci/*-values.yaml; do
    name=${values:+$(basename "$values")}
    name=${name:-default values}
    args=(${values:+-f "$values"})
    "$helm" lint --strict "$chart" "${args[@]}" >"$work/lint" 2>&1 \
        || { cat "$work/lint" >&2; fail "helm lint --strict with $name"; }
    "$helm" template nri-accel "$chart" --namespace nri-accel "${args[@]}" >"$work/all.yaml" 2>"$work/err" \
        || { cat "$work/err" >&2; fail "helm template with $name"; }
    kinds=$(grep -E '^kind: ' "$work/all.yaml" | awk '{print $2}' | sort | uniq -c | awk '{printf "%s %s, ", $1, $2}')
    "$helm" template nri-accel "$chart" "${args[@]}" --show-only templates/configmap.yaml \
        | awk 'f { sub(/^    /, ""); print } /config.yaml: \|/ { f = 1 }' \
        | sed "s|^  root: /host$|  root: $work/host|" >"$work/config.yaml"
    "$bin" check-config "$work/config.yaml" >"$work/check" 2>&1 \
        || { cat "$work/check" >&2; fail "the config.yaml rendered with $name does not load in nri-accel"; }
    echo "$name: lint ok, ${kinds%, }; config ok"
done

if "$helm" template nri-accel "$chart" --set metrics.enabled=true --set metrics.serviceMonitor.enabled=true \
        >/dev/null 2>"$work/err"; then
    fail "a ServiceMonitor without metrics.proxy rendered: the daemon's loopback /metrics is unreachable to Prometheus"
fi
grep -q "needs metrics.proxy" "$work/err" || { cat "$work/err" >&2; fail "the ServiceMonitor refusal does not say why"; }
echo "ServiceMonitor without the proxy: refused"

# One pool on both doors (issue 37): refused with a sentence; disjoint pools render and load.
both=(--set roles.devicePlugin.enabled=true)
if "$helm" template nri-accel "$chart" "${both[@]}" >/dev/null 2>"$work/err"; then
    fail "DRA and the device plugin on every pool rendered: the scheduler would count the devices twice"
fi
grep -q "disjoint lists of pool names" "$work/err" || { cat "$work/err" >&2; fail "the both-roles refusal does not say what to set"; }
pools=(--set 'pools[0].name=a' --set 'pools[0].family.kind=exclusive' --set 'pools[1].name=b' --set 'pools[1].family.kind=exclusive')
if "$helm" template nri-accel "$chart" "${both[@]}" "${pools[@]}" --set 'roles.dra.pools={a,b}' \
        --set 'roles.devicePlugin.config.pools={b}' >/dev/null 2>"$work/err"; then
    fail "pool b on both doors rendered"
fi
grep -q 'pool "b" is in both' "$work/err" || { cat "$work/err" >&2; fail "the one-pool-on-both-doors refusal does not name the pool"; }
"$helm" template nri-accel "$chart" "${both[@]}" "${pools[@]}" --set 'roles.dra.pools={a}' \
    --set 'roles.devicePlugin.config.pools={b}' --show-only templates/configmap.yaml \
    | awk 'f { sub(/^    /, ""); print } /config.yaml: \|/ { f = 1 }' >"$work/split.yaml"
"$bin" check-config "$work/split.yaml" >"$work/check" 2>&1 \
    || { cat "$work/check" >&2; fail "the config with pools split between DRA and the device plugin does not load"; }
echo "one pool on both doors: refused; split pools: config ok"

# The fleet defaults: only labelled nodes, scoped tolerations, probes; node-feature-discovery.
"$helm" template nri-accel "$chart" --show-only templates/daemonset.yaml >"$work/ds.yaml"
grep -q 'accel.nri.io/enabled: "true"' "$work/ds.yaml" || fail "the DaemonSet does not select the labelled nodes by default"
grep -q -- '- operator: Exists' "$work/ds.yaml" && fail "the DaemonSet tolerates every taint"
for probe in startupProbe readinessProbe livenessProbe; do
    grep -q "$probe:" "$work/ds.yaml" || fail "the DaemonSet has no $probe"
done
grep -q 'failureThreshold: 120' "$work/ds.yaml" || fail "the startup probe does not allow probes.startupSeconds (600 s)"
"$helm" template nri-accel "$chart" --set nodeFeatureDiscovery.enabled=true --show-only templates/daemonset.yaml >"$work/nfd.yaml"
grep -q 'feature.node.kubernetes.io/pci-0302_10de.present' "$work/nfd.yaml" || fail "nodeFeatureDiscovery.enabled renders no NFD label term"
grep -q 'nodeSelector:' "$work/nfd.yaml" && fail "with nodeFeatureDiscovery the label is a nodeSelector (ANDed), not one of the affinity's terms"
echo "fleet defaults: labelled nodes, scoped tolerations, probes, NFD terms"

# The webhook: rolls on a config change, a PDB, a cert-manager certificate.
wh=(--set roles.webhook.enabled=true --show-only templates/webhook.yaml)
"$helm" template nri-accel "$chart" "${wh[@]}" >"$work/wh1.yaml"
"$helm" template nri-accel "$chart" "${wh[@]}" --set 'pools[0].name=other' --set 'pools[0].family.kind=exclusive' >"$work/wh2.yaml"
h1=$(grep config-sha256 "$work/wh1.yaml"); h2=$(grep config-sha256 "$work/wh2.yaml")
[ -n "$h1" ] && [ "$h1" != "$h2" ] || fail "the webhook's pod template does not change with the pools ($h1 / $h2)"
grep -q 'subPath:' "$work/wh1.yaml" && fail "the webhook mounts its config by subPath, which never sees an update"
grep -q 'kind: PodDisruptionBudget' "$work/wh1.yaml" || fail "the webhook has no PodDisruptionBudget"
grep -q 'topologySpreadConstraints' "$work/wh1.yaml" || fail "the webhook's replicas are not spread"
"$helm" template nri-accel "$chart" "${wh[@]}" --set roles.webhook.certManager.enabled=true \
    --set roles.webhook.certManager.issuerRef.kind=Issuer --set roles.webhook.certManager.issuerRef.name=selfsigned >"$work/cm.yaml"
grep -q 'kind: Certificate' "$work/cm.yaml" && grep -q 'cert-manager.io/inject-ca-from: nri-accel/nri-accel-webhook' "$work/cm.yaml" \
    || grep -q 'cert-manager.io/inject-ca-from: default/nri-accel-webhook' "$work/cm.yaml" \
    || fail "certManager.enabled renders no Certificate or no CA injection"
if "$helm" template nri-accel "$chart" "${wh[@]}" --set roles.webhook.certManager.enabled=true >/dev/null 2>"$work/err"; then
    fail "certManager without an issuerRef rendered"
fi
grep -q 'size(object.spec.resourceClaims) > 0' "$work/wh1.yaml" || fail "pods with DRA claims are not sent to the webhook"
# VMIs: judged when the cluster serves KubeVirt's CRD (kubevirt: auto), or when forced.
grep -q 'vmis.accel.nri.io' "$work/wh1.yaml" && fail "the VMI rule is on in a cluster without KubeVirt"
"$helm" template nri-accel "$chart" "${wh[@]}" --api-versions kubevirt.io/v1/VirtualMachineInstance | grep -q 'vmis.accel.nri.io' \
    || fail "the VMI rule is off in a cluster that serves kubevirt.io/v1 VirtualMachineInstance"
"$helm" template nri-accel "$chart" "${wh[@]}" --set roles.webhook.kubevirt=false --api-versions kubevirt.io/v1/VirtualMachineInstance \
    | grep -q 'vmis.accel.nri.io' && fail "roles.webhook.kubevirt=false left the VMI rule on"
"$helm" template nri-accel "$chart" "${wh[@]}" --set roles.webhook.kubevirt=true | grep -q 'vmis.accel.nri.io' \
    || fail "roles.webhook.kubevirt=true did not turn the VMI rule on"
echo "webhook: rolls on config, PDB, spread, cert-manager; DRA-claim pods; VMIs with KubeVirt's CRD"

bash packaging/helm/render.sh --check

if [ -n "${NRI_ACCEL_HELM_KUBECONFIG:-}" ]; then
    for values in "" "$chart"/ci/*-values.yaml; do
        "$helm" install --dry-run=server --kubeconfig "$NRI_ACCEL_HELM_KUBECONFIG" \
            --namespace nri-accel --create-namespace nri-accel "$chart" ${values:+-f "$values"} >/dev/null \
            || fail "helm install --dry-run=server with ${values:-the default values}"
    done
    echo "server-side dry run: ok"
else
    echo "server-side dry run and helm install: skipped (they need the cluster suite's API server; set NRI_ACCEL_HELM_KUBECONFIG)"
fi
echo "helm checks passed in $(($(date +%s) - start)) s"
