#!/usr/bin/env bash
# Build the heterotrain wheel: build-wheel.sh PYTHON OUT_DIR
# (from a copy of the sources, so the clone gets no build/ or egg-info).
set -euo pipefail
py="${1:?usage: build-wheel.sh PYTHON OUT_DIR}"
out="${2:?usage: build-wheel.sh PYTHON OUT_DIR}"
src="$(cd "$(dirname "$0")" && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
cp -r "$src/." "$tmp/"
rm -rf "$tmp/tests" "$tmp/build" "$tmp"/*.egg-info
mkdir -p "$out"
echo "==> building the heterotrain wheel into $out"
"$py" -m pip wheel -q --no-deps --no-build-isolation "$tmp" -w "$out"
ls -1 "$out"/heterotrain-*.whl
