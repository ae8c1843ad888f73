#!/usr/bin/env bash
# Builds the nri-accel container image without Docker, buildah or a registry: an OCI image layout
# (and a tar of it that `ctr -n k8s.io images import` and `skopeo copy oci-archive:` take), FROM
# scratch, holding the binary and only the shared libraries `ldd` says it loads.
#
#   bash packaging/image.sh [BINARY] [OUT_DIR]
#
# BINARY defaults to $NRI_ACCEL_BIN, else target/release/nri-accel (ship target/dist/nri-accel:
# `cargo build --profile dist -p nri-accel`). OUT_DIR defaults to target/image. Writes
#   OUT_DIR/rootfs/                    the image's files (also the build context of
#                                      packaging/Containerfile, for buildah or podman)
#   OUT_DIR/oci/                       the OCI image layout
#   OUT_DIR/nri-accel-<version>-oci.tar  the same as one archive
# and prints the archive's path and sizes. The image is named nri-accel:<version>
# (docker.io/library/nri-accel:<version> once normalised, which is what a pod's `image:
# nri-accel:<version>` resolves to, so an imported image is found without any registry).
#
# Reproducible: file times and the `created` label are the last commit's time
# ($SOURCE_DATE_EPOCH overrides), owners are 0:0, entries sorted, gzip without a name or time.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "image build FAILED: $*" >&2; exit 1; }
if ! command -v jq >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "installing jq from Debian" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq jq >&2
fi
for tool in ldd jq sha256sum tar gzip strip dpkg-query; do
    command -v "$tool" >/dev/null || fail "$tool is required (Debian: libc-bin, jq, coreutils, tar, gzip, binutils, dpkg)"
done

bin="${1:-${NRI_ACCEL_BIN:-target/release/nri-accel}}"
out="${2:-target/image}"
[ -x "$bin" ] || fail "no nri-accel binary at $bin: build one (cargo build --profile dist -p nri-accel) or pass its path"
version=$("$bin" --version | awk '{print $2}')
[ -n "$version" ] || fail "$bin --version printed no version"
epoch="${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 0)}"
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    *) fail "unknown machine $(uname -m): add its OCI architecture name here" ;;
esac
# Every role's pod spec names its user. The image's own default is the unprivileged 65532: the
# node roles (NRI plugin, DRA driver, device plugin) set runAsUser 0 for the host paths and the
# root-owned runtime and kubelet sockets; a role without host paths (the webhook) needs nothing.
uid=65532

rm -rf "$out/rootfs" "$out/oci" "$out/layer.tar"
mkdir -p "$out/rootfs/usr/bin" "$out/oci/blobs/sha256"
out="$(cd "$out" && pwd)"
root="$out/rootfs"

# --- the files ----------------------------------------------------------------------------------
strip --strip-unneeded -o "$root/usr/bin/nri-accel" "$bin"
chmod 0755 "$root/usr/bin/nri-accel"
# The libraries and the dynamic loader, at the paths the binary asks for (ldd prints both). A
# statically linked binary has none ("not a dynamic executable") and gets none.
libs=$(ldd "$bin" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | sort -u) || true
for lib in $libs; do
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
    # The license of each library shipped (the Debian package's copyright file).
    pkg=$({ dpkg-query -S "$lib" || dpkg-query -S "$(realpath "$lib")"; } 2>/dev/null | head -1 | cut -d: -f1) || true
    if [ -n "$pkg" ] && [ -f "/usr/share/doc/$pkg/copyright" ]; then
        mkdir -p "$root/usr/share/doc/$pkg"
        cp "/usr/share/doc/$pkg/copyright" "$root/usr/share/doc/$pkg/copyright"
    fi
done
mkdir -p "$root/usr/share/doc/nri-accel"
cp packaging/README.md "$root/usr/share/doc/nri-accel/packaging.md"
# Names for the two users (tools that print a user look them up), and the mount points the
# DaemonSets use, so a read-only root needs nothing created at start.
mkdir -p "$root/etc/nri-accel" "$root/var/lib/nri-accel" "$root/run/nri-accel" "$root/var/run" \
    "$root/tmp"
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:%s:%s:nonroot:/:/sbin/nologin\n' "$uid" "$uid" > "$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:%s:\n' "$uid" > "$root/etc/group"
chmod 1777 "$root/tmp"
"$root/usr/bin/nri-accel" --version >/dev/null || fail "the stripped binary does not run"

# --- the layer ----------------------------------------------------------------------------------
find "$root" -exec touch -h -d "@$epoch" {} +
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$root" -cf "$out/layer.tar" .
diff_id="sha256:$(sha256sum "$out/layer.tar" | cut -d' ' -f1)"
gzip -n -9 -c "$out/layer.tar" > "$out/layer.tar.gz"
rm "$out/layer.tar"

blob() { # blob FILE -> moves FILE into the layout, prints "<digest> <size>"
    local d
    d=$(sha256sum "$1" | cut -d' ' -f1)
    echo "sha256:$d $(stat -c %s "$1")"
    mv "$1" "$out/oci/blobs/sha256/$d"
}
read -r layer_digest layer_size < <(blob "$out/layer.tar.gz")

created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
labels=$(jq -n --arg v "$version" --arg r "$revision" --arg c "$created" '{
    "org.opencontainers.image.title": "nri-accel",
    "org.opencontainers.image.description": "Node agent handing accelerators to containers through NRI, DRA claims and CDI",
    "org.opencontainers.image.version": $v,
    "org.opencontainers.image.revision": $r,
    "org.opencontainers.image.created": $c,
    "org.opencontainers.image.licenses": "Apache-2.0",
    "org.opencontainers.image.documentation": "/usr/share/doc/nri-accel/packaging.md"
}')
jq -n -c --arg arch "$arch" --arg created "$created" --arg diff "$diff_id" --arg user "$uid:$uid" \
    --argjson labels "$labels" '{
    architecture: $arch, os: "linux", created: $created,
    config: {
        User: $user,
        Env: ["PATH=/usr/bin"],
        Entrypoint: ["/usr/bin/nri-accel"],
        Cmd: ["--version"],
        Labels: $labels
    },
    rootfs: {type: "layers", diff_ids: [$diff]},
    history: [{created: $created, created_by: "packaging/image.sh"}]
}' > "$out/config.json"
read -r config_digest config_size < <(blob "$out/config.json")

jq -n -c --arg cd "$config_digest" --argjson cs "$config_size" --arg ld "$layer_digest" \
    --argjson ls "$layer_size" --argjson labels "$labels" '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.manifest.v1+json",
    config: {mediaType: "application/vnd.oci.image.config.v1+json", digest: $cd, size: $cs},
    layers: [{mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: $ld, size: $ls}],
    annotations: $labels
}' > "$out/manifest.json"
read -r manifest_digest manifest_size < <(blob "$out/manifest.json")

jq -n -c --arg md "$manifest_digest" --argjson ms "$manifest_size" --arg arch "$arch" \
    --arg name "docker.io/library/nri-accel:$version" --arg v "$version" '{
    schemaVersion: 2,
    mediaType: "application/vnd.oci.image.index.v1+json",
    manifests: [{
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        digest: $md, size: $ms,
        platform: {architecture: $arch, os: "linux"},
        annotations: {"io.containerd.image.name": $name, "org.opencontainers.image.ref.name": $v}
    }]
}' > "$out/oci/index.json"
echo '{"imageLayoutVersion":"1.0.0"}' > "$out/oci/oci-layout"

archive="$out/nri-accel-$version-oci.tar"
find "$out/oci" -exec touch -h -d "@$epoch" {} +
tar --sort=name --mtime="@$epoch" --owner=0 --group=0 --numeric-owner --format=posix \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$out/oci" -cf "$archive" oci-layout index.json blobs
unpacked=$(du -sk --apparent-size "$root" | cut -f1)
echo "image nri-accel:$version ($manifest_digest): $archive"
echo "  layer $((layer_size / 1024)) KiB compressed, $unpacked KiB unpacked; libraries: ${libs//$'\n'/ }"
