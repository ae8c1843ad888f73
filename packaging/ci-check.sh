#!/usr/bin/env bash
# Packaging checks run by .ci/run (and by hand: `bash packaging/ci-check.sh` from the repo root):
#   1. systemd-analyze verify on the unit (against the packaged binary, see below), also with the
#      claims-group drop-in;
#   2. systemd-analyze security --offline=yes: exposure must be <= 2.0 and docs must state it;
#   3. systemd-tmpfiles creates the tmpfiles.d dirs with their modes in a temp root;
#   4. cargo deb builds the .deb; unpacked into a temp root it holds every expected path, every doc
#      an installed file names, and a one-line short description, and nri-accel is its only
#      program, with no code of the simulators (tests/nri-sim, tests/kube-sim) in it. An already
#      built .deb in target/debian/ is kept (cargo-deb would delete it).
#
# The .deb is built with the release profile: the check is about its contents, and the release
# profile is the cheap one (the demo's); the package that ships is built with --profile dist (fat
# LTO, docs/performance.md "Build cost"). DEB_PROFILE=dist checks that one.
#
# Installs what it needs when missing (systemd via apt-get, cargo-deb via cargo install).
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "packaging check FAILED: $*" >&2; exit 1; }
work=$(mktemp -d)
# cargo-deb deletes the earlier .debs of a package from target/debian/ whenever it builds one, even
# with --output elsewhere: keep a copy of any there and put them back on the way out.
kept="$work/kept"
mkdir -p "$kept"
for f in target/debian/nri-accel_*.deb target/debian/nri-accel-dbgsym_*.ddeb; do
    [ -f "$f" ] && cp -p "$f" "$kept/"
done
restore_kept() {
    for f in "$kept"/*; do
        [ -f "$f" ] && [ ! -e "target/debian/$(basename "$f")" ] && cp -p "$f" target/debian/
    done
    rm -rf "$work"
}
trap restore_kept EXIT

# --- tools ------------------------------------------------------------------------------------
if ! command -v systemd-analyze >/dev/null || ! command -v systemd-tmpfiles >/dev/null; then
    echo "installing systemd (for systemd-analyze, systemd-tmpfiles)"
    apt-get update -qq && apt-get install -y -qq systemd >/dev/null
fi
command -v dpkg-deb >/dev/null || fail "dpkg-deb is required (Debian's dpkg package)"
if ! cargo deb --version >/dev/null 2>&1; then
    # About 1 minute on a 2-core machine; kept in ~/.cargo/bin afterwards.
    echo "installing cargo-deb"
    cargo install cargo-deb --locked --version '^3' --quiet
fi
echo "tools: $(systemd-analyze --version | head -1), $(cargo deb --version)"

# --- tmpfiles.d ---------------------------------------------------------------------------------
troot="$work/tmpfiles-root"
mkdir -p "$troot"
systemd-tmpfiles --root="$troot" --create "$PWD/packaging/nri-accel.tmpfiles"
for want in "run/nri-accel 750" "var/lib/nri-accel 700" "run/cdi 755"; do
    set -- $want
    [ -d "$troot/$1" ] || fail "tmpfiles did not create /$1"
    mode=$(stat -c %a "$troot/$1")
    [ "$mode" = "$2" ] || fail "tmpfiles created /$1 with mode $mode, expected $2"
done
echo "tmpfiles.d: ok"

# --- .deb ---------------------------------------------------------------------------------------
[ -f packaging/config.yaml ] || fail "packaging/config.yaml (the default config) is missing"
cargo deb -p nri-accel --profile "${DEB_PROFILE:-release}" --locked --quiet \
    --output "$work/nri-accel.deb" >/dev/null
root="$work/root"
dpkg-deb -x "$work/nri-accel.deb" "$root"
dpkg-deb -e "$work/nri-accel.deb" "$work/control"
for path in \
    usr/bin/nri-accel \
    usr/lib/systemd/system/nri-accel.service \
    usr/lib/tmpfiles.d/nri-accel.conf \
    etc/nri-accel/config.yaml \
    usr/share/doc/nri-accel/copyright \
    usr/share/doc/nri-accel/operator-guide.md \
    usr/share/doc/nri-accel/configuration.md \
    usr/share/doc/nri-accel/refusals.md \
    usr/share/doc/nri-accel/messages.md \
    usr/share/doc/nri-accel/state.md \
    usr/share/doc/nri-accel/claims-api.md \
    usr/share/doc/nri-accel/policy-guide.md \
    usr/share/doc/nri-accel/packaging.md \
    usr/share/doc/nri-accel/examples/claims-group.conf \
    usr/share/doc/nri-accel/examples/device-plugin.conf \
    usr/share/doc/nri-accel/device-plugin.md \
    usr/share/doc/nri-accel/examples/containerd-1.7/nri-accel.toml \
    usr/share/doc/nri-accel/examples/containerd-2.x/nri-accel.toml \
    usr/share/doc/nri-accel/examples/crio/10-nri-accel.conf \
    usr/share/doc/nri-accel/dra.md \
    usr/share/doc/nri-accel/examples/kubernetes.conf \
    usr/share/doc/nri-accel/examples/kubernetes/rbac.yaml \
    usr/share/doc/nri-accel/examples/kubernetes/daemonset.yaml \
    usr/share/doc/nri-accel/examples/kubernetes/deviceclasses.yaml \
    usr/share/doc/nri-accel/examples/kubernetes/examples.yaml \
    usr/share/doc/nri-accel/examples/kubernetes/nri-accel-device-plugin.yaml \
    usr/share/doc/nri-accel/img/dashboard.png \
    usr/share/doc/nri-accel/glossary.md; do
    [ -f "$root/$path" ] || fail "the .deb lacks /$path"
done
[ -x "$root/usr/bin/nri-accel" ] || fail "/usr/bin/nri-accel in the .deb is not executable"
programs=$(find "$root" -type f -perm -u+x | sed "s|^$root||")
[ "$programs" = /usr/bin/nri-accel ] || fail "the .deb holds programs besides /usr/bin/nri-accel: $programs"
# Code linked into a Rust binary carries its source paths (panic locations); a simulator's would
# show here even in a stripped binary.
if grep -aqE 'tests/(nri-sim|kube-sim|demo)/src/' "$root/usr/bin/nri-accel"; then
    fail "/usr/bin/nri-accel links code of the simulators or the demo (tests/): the shipped binary never does"
fi
cmp -s "$root/usr/lib/systemd/system/nri-accel.service" packaging/nri-accel.service \
    || fail "the .deb's unit differs from packaging/nri-accel.service"
grep -qx /etc/nri-accel/config.yaml "$work/control/conffiles" \
    || fail "/etc/nri-accel/config.yaml is not a conffile"
grep -q "systemd-tmpfiles --create nri-accel.conf" "$work/control/postinst" \
    || fail "postinst does not create the tmpfiles.d dirs"
grep -q "deb-systemd-helper enable nri-accel.service" "$work/control/postinst" \
    || fail "postinst does not enable the unit"
# Every doc an installed text file names is installed too (plugin/tests/packaging.rs checks the
# same from the package metadata; this checks the built .deb).
while IFS= read -r file; do
    # docs/x.md or a bare x.md; another dir's file (packaging/README.md) is a source path.
    for doc in $(grep -oE '(^|[^/A-Za-z0-9_-]|docs/)[A-Za-z0-9_-]+\.md\b' "$file" \
            | grep -oE '[A-Za-z0-9_-]+\.md$' | sort -u); do
        [ -f "$root/usr/share/doc/nri-accel/$doc" ] \
            || fail "${file#"$root"} names $doc, which the .deb does not install"
    done
done < <(find "$root/etc" "$root/usr/share/doc/nri-accel" "$root/usr/lib/systemd" -type f \
    \( -name '*.md' -o -name '*.yaml' -o -name '*.conf' -o -name '*.service' \))
short=$(sed -n 's/^Description: //p' "$work/control/control")
[ "${#short}" -le 79 ] || fail "the short description is over 79 characters: $short"
grep -q "nri-accel cleanup" "$work/control/prerm" \
    || fail "prerm does not delete the node's ResourceSlices (nri-accel cleanup)"
# cargo-deb fills the marker wherever it stands, a comment too: the generated stop step comes once,
# and the script parses (a second fill left a stray `.` line, issue 39 item 9).
stops=$(grep -c "deb-systemd-invoke stop" "$work/control/prerm" || true)
[ "$stops" = 1 ] || fail "prerm runs the generated stop step $stops times, expected once"
sh -n "$work/control/prerm" || fail "the built prerm does not parse"
! grep -qx '[[:space:]]*\.[[:space:]]*' "$work/control/prerm" || fail "the built prerm has a stray '.' line"
awk '/deb-systemd-invoke stop/ {stop=NR} /nri-accel cleanup/ {clean=NR} END {exit !(stop && clean > stop)}' \
    "$work/control/prerm" || fail "prerm must stop the daemon before nri-accel cleanup"
echo ".deb: ok ($(du -k "$work/nri-accel.deb" | cut -f1) KiB, $(find "$root" -type f | wc -l) files)"

# --- systemd-analyze verify ---------------------------------------------------------------------
# verify fails when ExecStart's binary is absent, and only warns (exit 0) on unknown keys: check a
# copy of the packaged unit whose ExecStart points at the unpacked binary, and treat any output as
# a failure.
units="$work/units"
mkdir -p "$units/nri-accel.service.d"
sed "s|^ExecStart=/usr/bin/nri-accel |ExecStart=$root/usr/bin/nri-accel |" \
    packaging/nri-accel.service > "$units/nri-accel.service"
grep -q "^ExecStart=$root/usr/bin/nri-accel run " "$units/nri-accel.service" \
    || fail "ExecStart in packaging/nri-accel.service is not /usr/bin/nri-accel run ..."
grep -q "^CapabilityBoundingSet=CAP_CHOWN$" packaging/claims-group.conf \
    || fail "claims-group.conf must grant CAP_CHOWN (the socket and its directory go to the group)"
grep -q "^RuntimeDirectoryMode=0750$" packaging/nri-accel.service \
    && grep -q "^d  *$(echo /run/nri-accel) *0750 root root" packaging/nri-accel.tmpfiles \
    || fail "the unit and tmpfiles.d must both make /run/nri-accel 0750 root:root (the daemon opens it to claims_api.group)"
grep -q "^LimitNOFILE=[0-9]" packaging/nri-accel.service \
    || fail "packaging/nri-accel.service sets no LimitNOFILE (the claims API cap and fd reserve rely on it)"
out=$(systemd-analyze verify "$units/nri-accel.service" 2>&1) || fail "systemd-analyze verify: $out"
[ -z "$out" ] || fail "systemd-analyze verify reported: $out"
cp packaging/claims-group.conf "$units/nri-accel.service.d/"
out=$(systemd-analyze verify "$units/nri-accel.service" 2>&1) || fail "verify with drop-in: $out"
[ -z "$out" ] || fail "systemd-analyze verify (with the claims-group drop-in) reported: $out"
rm "$units/nri-accel.service.d/claims-group.conf"
echo "systemd-analyze verify: ok"

# --- systemd-analyze security -------------------------------------------------------------------
score_of() {
    systemd-analyze security --offline=yes --threshold=20 "$1" 2>&1 \
        | sed -n 's/.*Overall exposure level for nri-accel.service: \([0-9.]*\) \([A-Z]*\).*/\1 \2/p'
}
score=$(score_of packaging/nri-accel.service)
[ -n "$score" ] || fail "no exposure score from systemd-analyze security"
systemd-analyze security --offline=yes --threshold=20 packaging/nri-accel.service >/dev/null 2>&1 \
    || fail "exposure $score is over 2.0"
cp packaging/claims-group.conf "$units/nri-accel.service.d/"
score_group=$(score_of "$units/nri-accel.service")
systemd-analyze security --offline=yes --threshold=20 "$units/nri-accel.service" >/dev/null 2>&1 \
    || fail "exposure with the claims-group drop-in ($score_group) is over 2.0"
# The docs state both as: exposure level **N.N** "GRADE" ... claims-group drop-in: **N.N** "GRADE"
doc_form() { set -- $1; printf '**%s** "%s"' "$1" "$2"; }
grep -qF "exposure level $(doc_form "$score")" docs/operator-guide.md \
    || fail "docs/operator-guide.md does not state the measured exposure level $(doc_form "$score")"
grep -qF "claims-group drop-in: $(doc_form "$score_group")" docs/operator-guide.md \
    || fail "docs/operator-guide.md does not state the drop-in's exposure $(doc_form "$score_group")"
echo "systemd-analyze security: $score (with claims-group drop-in: $score_group)"
echo "packaging checks passed"
