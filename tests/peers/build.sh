#!/usr/bin/env bash
# Builds the real peers of the end-to-end suite from their published Go modules, at the release
# each tests/peers/<name>-<version>/go.mod pins (go.sum verifies every module), into a cache outside
# the checkout keyed by module and version. A cached build is reused; a missing module, a failed
# build or a missing binary fails loudly. Usage: build.sh <name>-<version>... (e.g. containerd-v1.7.0)
# A peer's optional build.env sets cgo (0/1), tags and the Debian packages (apt) its build needs,
# linker flags (ldflags: Kubernetes stamps its release version), and may define
# post_build <bin dir> <module dir> for what is not Go (CRI-O's pinns, etcd's binary name); the
# default is containerd's: CGO_ENABLED=0, no_btrfs,no_devmapper,no_zfs and no linker flags.
# Prints one line per peer: <peer> <bin dir>. Env: NRI_ACCEL_PEER_CACHE (default
# /var/cache/nri-accel/peers).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cache="${NRI_ACCEL_PEER_CACHE:-/var/cache/nri-accel/peers}"

# Debian's runc 1.1.5 and busybox-static (the test image) come from apt.
need=()
command -v runc >/dev/null || need+=(runc)
[ -x /bin/busybox ] || need+=(busybox-static)
if [ "${#need[@]}" -gt 0 ]; then
    echo "installing ${need[*]} from Debian" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
fi

[ "$#" -gt 0 ] || { echo "usage: $0 <peer>-<version>... (dirs under $here)" >&2; exit 2; }
for peer in "$@"; do
    dir="$here/$peer"
    [ -f "$dir/go.mod" ] || { echo "no pinned peer $peer ($dir/go.mod missing)" >&2; exit 1; }
    cgo=0 tags=no_btrfs,no_devmapper,no_zfs apt="" ldflags=""
    unset -f post_build
    # shellcheck disable=SC1091
    [ -f "$dir/build.env" ] && . "$dir/build.env"
    missing=()
    for p in $apt; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
    if [ "${#missing[@]}" -gt 0 ]; then
        echo "installing ${missing[*]} from Debian for $peer" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
    fi
    # The pinned module and version: the module of the peer's tools (one per peer).
    mod=$(cd "$dir" && go list -f '{{.Module.Path}}@{{.Module.Version}}' tool | sort -u)
    [ "$(wc -l <<<"$mod")" = 1 ] || { echo "$peer: its tools come from several modules: $mod" >&2; exit 1; }
    out="$cache/$mod"
    if [ -f "$out/.complete" ]; then
        echo "$peer $out/bin"
        continue
    fi
    echo "building $mod into $out" >&2
    rm -rf "$out" && mkdir -p "$out/bin"
    tools=$(cd "$dir" && go list -f '{{.ImportPath}}' tool)
    start=$(date +%s)
    # shellcheck disable=SC2086
    (cd "$dir" && CGO_ENABLED=$cgo go build -mod=readonly -trimpath -tags "$tags" -ldflags "$ldflags" \
        -o "$out/bin/" $tools) >&2
    # The binary's name is go's (a path ending in a major version, like etcd's .../server/v3, is
    # named after the element before it).
    for t in $(cd "$dir" && go list -f '{{.Target}}' tool); do
        [ -x "$out/bin/$(basename "$t")" ] || { echo "build of $mod made no $(basename "$t")" >&2; exit 1; }
    done
    if declare -F post_build >/dev/null; then
        post_build "$out/bin" "$(cd "$dir" && go list -m -f '{{.Dir}}' "${mod%@*}")" >&2
    fi
    echo "built $mod in $(($(date +%s) - start)) s" >&2
    touch "$out/.complete"
    echo "$peer $out/bin"
done
