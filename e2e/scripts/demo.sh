#!/usr/bin/env bash
# `make demo`: the whole system on this machine (see README). Pass --down to stop it.
set -euo pipefail
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
source "$CACHE/env.sh"
cd "$(dirname "$0")/../.."
T0=$(date +%s)
echo "==> building release binaries (trainer, operator, local control plane; first time several minutes)"
cargo build --release -p heterotrain-trainer -p heterotrain-operator -p heterotrain-e2e
echo "==> built in $(( $(date +%s) - T0 ))s"
exec "$CARGO_TARGET_DIR/release/heterotrain-demo" "$@"
