#!/usr/bin/env bash
# Build the release binaries (trainer, operator, local control plane, demo,
# bench) and run one of them: `release.sh heterotrain-demo [args]` is
# `make demo`, `release.sh heterotrain-bench [args]` is `make bench`.
set -euo pipefail
BIN="${1:?usage: release.sh <heterotrain-demo|heterotrain-bench> [args...]}"
shift
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
source "$CACHE/env.sh"
cd "$(dirname "$0")/../.."
T0=$(date +%s)
echo "==> building release binaries (trainer, operator, local control plane, $BIN; the first time about 10 minutes on 2 cores)"
# Only the binaries this run starts: the demo does not build the bench.
cargo build --release -p heterotrain-trainer -p heterotrain-operator -p heterotrain-e2e \
  --bin heterotrain-trainer --bin heterotrain-operator --bin heterotrain-local --bin "$BIN"
echo "==> built in $(( $(date +%s) - T0 ))s"
exec "$CARGO_TARGET_DIR/release/$BIN" "$@"
