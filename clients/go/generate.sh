#!/usr/bin/env bash
# Regenerates clients/go/claimsv1 (package claimsv1) from plugin/proto/claims.proto, without protoc:
# internal/gen parses the proto in pure Go and runs protoc-gen-go and containerd's
# protoc-gen-go-ttrpc, both built at the versions pinned in internal/gen/go.mod.
#
#   clients/go/generate.sh          rewrite claimsv1/*.pb.go
#   clients/go/generate.sh --check  regenerate into a temp dir and fail when the committed code
#                                   differs (CI runs this: the proto changed, the code did not)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
check=0
case "${1:-}" in
  "") ;;
  --check) check=1 ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

(
  cd "$here/internal/gen"
  # -buildvcs=false: the generator needs no VCS stamp, and a checkout git refuses to read
  # (another owner) must not stop it.
  go build -buildvcs=false -o "$tmp/bin/gen" .
  go build -o "$tmp/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
  go build -o "$tmp/bin/protoc-gen-go-ttrpc" github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc
)

mkdir -p "$tmp/out"
"$tmp/bin/gen" -proto-dir "$repo/plugin/proto" -proto claims.proto \
  -go-package 'nri-accel/clients/go/claimsv1;claimsv1' -out "$tmp/out" \
  "$tmp/bin/protoc-gen-go" "$tmp/bin/protoc-gen-go-ttrpc"
gofmt -l "$tmp/out" | grep . && { echo "generated code is not gofmt-clean" >&2; exit 1; } || true

if [ "$check" = 1 ]; then
  if ! diff -ru "$here/claimsv1" "$tmp/out" >"$tmp/diff"; then
    cat "$tmp/diff" >&2
    echo "clients/go/claimsv1 is out of date with plugin/proto/claims.proto: run clients/go/generate.sh and commit the result" >&2
    exit 1
  fi
  echo "clients/go/claimsv1 matches plugin/proto/claims.proto"
  exit 0
fi

mkdir -p "$here/claimsv1"
rm -f "$here/claimsv1"/*.pb.go
cp "$tmp/out"/*.pb.go "$here/claimsv1/"
echo "regenerated clients/go/claimsv1 from plugin/proto/claims.proto"
