#!/usr/bin/env bash
# The cluster suite: nri-accel on a real single-node Kubernetes, and on a fleet of several real
# nodes (tests/README.md, "The cluster suite"). Builds the peers (etcd, Kubernetes, containerd;
# cached by tests/peers/build.sh) and nri-accel's release binary unless NRI_ACCEL_BIN names one,
# then:
#   cluster.sh test [go test flags]   the scenarios on each version of NRI_ACCEL_CLUSTER_KUBE
#                                      (default v1.34.4,v1.37.2), e.g. -run 'TestCluster/v1.34.4'
#   NRI_ACCEL_CLUSTER_BENCH=1 cluster.sh test -run TestClusterBench
#                                      the benchmark of a DRA pod's start (skipped otherwise)
#   NRI_ACCEL_CLUSTER_FLEET=full cluster.sh test -run TestClusterFleet
#                                      every fleet scenario on NRI_ACCEL_CLUSTER_NODES nodes
#                                      (default 3; without it: two nodes, placement and drain)
#   cluster.sh up                      one cluster (the first version) kept up until Ctrl-C
#                                      (NRI_ACCEL_CLUSTER_NODES=3: a fleet, the chart on every node);
#                                      it prints the env file that points kubectl at it
# Needs root. Only one real-runtime suite may run at a time on a machine (containerd instances
# share /run/containerd/s): run it under `flock /tmp/nri-accel-runtime.lock` where others run.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
[ "$(id -u)" = 0 ] || { echo "tests/cluster.sh needs root (it runs containerd, the kubelet, runc and mknod)" >&2; exit 1; }
# The node's mount namespace (unshare, nsenter) and the pods' network (ip): tests/README.md.
for tool in unshare nsenter ip; do
    command -v "$tool" >/dev/null || { echo "tests/cluster.sh needs $tool (Debian: util-linux, iproute2)" >&2; exit 1; }
done
cmd="${1:-}"
[ "$cmd" = test ] || [ "$cmd" = up ] || { echo "usage: $0 test [go test flags] | up" >&2; exit 2; }
shift
versions="${NRI_ACCEL_CLUSTER_KUBE:-v1.34.4,v1.37.2}"
peers=(etcd-v3.6.16 containerd-v2.4.2)
IFS=, read -ra vs <<<"$versions"
for v in "${vs[@]}"; do peers+=("kubernetes-$v"); done
bash "$here/peers/build.sh" "${peers[@]}"

bin="${NRI_ACCEL_BIN:-}"
if [ -z "$bin" ]; then
    (cd "$here/.." && cargo build --release --locked -p nri-accel)
    bin="${CARGO_TARGET_DIR:-$here/../target}/release/nri-accel"
fi
cd "$here"
export NRI_ACCEL_BIN="$bin" NRI_ACCEL_CLUSTER_KUBE="$versions"
if [ "$cmd" = up ]; then
    NRI_ACCEL_CLUSTER_UP=1 exec go test ./cluster/ -count=1 -v -run '^TestUp$' -timeout 24h "$@"
fi
exec go test ./cluster/ -count=1 -v -run '^TestCluster' -timeout "${NRI_ACCEL_CLUSTER_TIMEOUT:-60m}" "$@"
