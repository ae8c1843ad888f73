#!/usr/bin/env bash
# Builds every fuzz target and runs each for SECONDS (default 15), starting from the committed
# seeds in corpus-seeds/<target>/ plus whatever corpus/<target>/ holds from earlier runs. Fails if a
# target fails to build or finds a crash, leak, timeout or over-limit allocation (the reproducer is
# left in artifacts/<target>/). Usage: fuzz/run-all.sh [seconds] [target...]
set -euo pipefail
cd "$(dirname "$0")"

secs="${1:-15}"
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    mapfile -t targets < <(cargo fuzz list)
fi

# cargo-fuzz passes -Z flags (sanitizers) to rustc; on a stable toolchain this allows them.
export RUSTC_BOOTSTRAP=1

# FUZZ_DEV=1 builds without optimizations (sanitizers kept): a cold build takes about half as long,
# which is what CI wants for its short runs; long runs should use the default (optimized) build.
dev=()
[ "${FUZZ_DEV:-0}" = 1 ] && dev=(--dev)
# FUZZ_TARGET_DIR: where the sanitized build goes (default fuzz/target); CI keeps it outside the
# checkout so a second run reuses it.
[ -n "${FUZZ_TARGET_DIR:-}" ] && dev+=(--target-dir "$FUZZ_TARGET_DIR")

start=$(date +%s)
cargo fuzz build "${dev[@]}"
echo "fuzz build: $(( $(date +%s) - start )) s"

failed=()
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    seeds=()
    [ -d "corpus-seeds/$t" ] && seeds=("corpus-seeds/$t")
    echo "=== $t (${secs} s)"
    # -malloc_limit_mb: one allocation over 256 MiB is a finding (a length taken from the input
    # without a bound). -rss_limit_mb: the whole process stays under 2 GiB. -timeout: one input
    # running 30 s is a hang.
    if ! cargo fuzz run "${dev[@]}" "$t" "corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$secs" -malloc_limit_mb=256 -rss_limit_mb=2048 -timeout=30 \
        -artifact_prefix="artifacts/$t/" -print_final_stats=1 2>"artifacts/$t.log"; then
        failed+=("$t")
        tail -40 "artifacts/$t.log"
    fi
    grep -E '^stat::number_of_executed_units|^Done [0-9]+ runs' "artifacts/$t.log" | tail -2 || true
done

echo "fuzz total: $(( $(date +%s) - start )) s"
if [ ${#failed[@]} -ne 0 ]; then
    echo "fuzz targets failed: ${failed[*]} (reproducers in fuzz/artifacts/)"
    exit 1
fi
