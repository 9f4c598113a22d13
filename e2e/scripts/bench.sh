#!/usr/bin/env bash
# `make bench`: every balancing policy on every scenario on the local control
# plane, plus plan propagation, trainer vs DDP and operator scale (see README).
# Extra arguments go to heterotrain-bench (e.g. make bench BENCH_ARGS=--quick).
set -euo pipefail
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
source "$CACHE/env.sh"
cd "$(dirname "$0")/../.."
T0=$(date +%s)
echo "==> building release binaries (trainer, operator, bench; first time several minutes)"
cargo build --release -p heterotrain-trainer -p heterotrain-operator -p heterotrain-e2e
echo "==> built in $(( $(date +%s) - T0 ))s"
exec "$CARGO_TARGET_DIR/release/heterotrain-bench" "$@"
