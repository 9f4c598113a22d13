#!/usr/bin/env bash
# Package kubectl-heterotrain for krew: an archive of the plugin binary and
# the krew manifest (heterotrain.yaml) pointing at where the archive will be
# published, with its sha256.
#
#   operator/kubectl-plugin/krew/release.sh OUT_DIR [BASE_URL]
#
# BINARY   the plugin binary to package (default: the release build in
#          $CARGO_TARGET_DIR, built first)
# VERSION  the manifest's version (default: v<workspace version>)
# BASE_URL where the archive will be downloadable (default: the
#          repository's GitHub release of VERSION)
#
# Install from the output without publishing anything:
#   kubectl krew install --manifest=OUT_DIR/heterotrain.yaml \
#     --archive=OUT_DIR/kubectl-heterotrain_linux_amd64.tar.gz
set -euo pipefail
out=${1:?usage: release.sh OUT_DIR [BASE_URL]}
root=$(cd "$(dirname "$0")/../../.." && pwd)
version=${VERSION:-v$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)}
base=${2:-https://github.com/heterotrain/heterotrain/releases/download/$version}
if [ -z "${BINARY:-}" ]; then
  echo "==> cargo build --release -p kubectl-heterotrain"
  (cd "$root" && cargo build -q --release -p kubectl-heterotrain)
  BINARY=${CARGO_TARGET_DIR:-$root/target}/release/kubectl-heterotrain
fi
[ -x "$BINARY" ] || { echo "error: no plugin binary at $BINARY" >&2; exit 1; }
case "$(uname -m)" in
  x86_64) arch=amd64 ;;
  aarch64) arch=arm64 ;;
  *) echo "error: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
archive=kubectl-heterotrain_linux_${arch}.tar.gz
mkdir -p "$out"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp "$BINARY" "$stage/kubectl-heterotrain"
printf 'kubectl-heterotrain %s, Apache-2.0. See %s\n' "$version" \
  "https://github.com/heterotrain/heterotrain" > "$stage/LICENSE"
tar -C "$stage" --owner=0 --group=0 -czf "$out/$archive" kubectl-heterotrain LICENSE
sha=$(sha256sum "$out/$archive" | cut -d' ' -f1)
cat > "$out/heterotrain.yaml" <<MANIFEST
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: heterotrain
spec:
  version: $version
  homepage: https://github.com/heterotrain/heterotrain
  shortDescription: Inspect HeteroTrain training jobs
  description: |
    Shows what a HeteroTrainingJob is doing, from the API server alone:
    its worker groups, ranks, local batch sizes, throughput and balance
    (status, top), the history of its batch plans (plan), and the
    hardware comparison of its ranks (profile). list and get print jobs
    like kubectl get (-A, -o wide|json|yaml).
  platforms:
    - selector:
        matchLabels:
          os: linux
          arch: $arch
      uri: $base/$archive
      sha256: $sha
      files:
        - from: kubectl-heterotrain
          to: .
        - from: LICENSE
          to: .
      bin: kubectl-heterotrain
MANIFEST
echo "wrote $out/$archive and $out/heterotrain.yaml (sha256 $sha)"
