#!/usr/bin/env bash
# `make test`: formatting, then one build of every test binary, then the
# binaries, clippy and the Python library's tests in parallel lanes (as many
# as CPUs; longest first, from the last run's timings), each job's output in
# its own log. Prints the ten slowest jobs and the total at the end.
#
#   TEST_LANES=1 make test            one job at a time
#   TEST_THREADS=4 make test          --test-threads of each test binary
#   TEST_ARGS="-p heterotrain-trainer" make test    a part of the workspace
set -euo pipefail
cd "$(dirname "$0")/../.."
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
source "$CACHE/env.sh"
NPROC="$(nproc)"
LANES="${TEST_LANES:-$NPROC}"
THREADS="${TEST_THREADS:-$NPROC}"
RESULTS="$CACHE/results"
LOGS="$RESULTS/test-logs"
mkdir -p "$RESULTS"
rm -rf "$LOGS"
T0=$(date +%s)
stamp() { printf '%dm%02ds' $(( ($(date +%s) - T0) / 60 )) $(( ($(date +%s) - T0) % 60 )); }

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> building the test binaries (cargo test --no-run; a fresh clone: about 5 minutes on 2 cores)"
# shellcheck disable=SC2086
cargo test ${TEST_ARGS:---workspace} --no-run --message-format=json-render-diagnostics >"$RESULTS/test-build.json"
echo "==> built in $(stamp)"

CLIPPY="cargo clippy --workspace --all-targets -- -D warnings"
PY="\"\$HETEROTRAIN_PYTHON\" -m unittest discover -s trainer-image/python/tests -v"
extras=(--extra "python=$PY")
[ -n "${TEST_ARGS:-}" ] || extras+=(--extra "clippy=$CLIPPY")

status=0
python3 e2e/scripts/run_tests.py --cargo-json "$RESULTS/test-build.json" \
  --lanes "$LANES" --test-threads "$THREADS" --logs "$LOGS" \
  --times "$RESULTS/test-times.json" "${extras[@]}" || status=$?
echo "==> make test: $(stamp) in all (build and tests)"
exit $status
