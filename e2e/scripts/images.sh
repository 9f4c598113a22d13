#!/usr/bin/env bash
# Build the HeteroTrain container images from scratch, without a Docker
# daemon (buildah), and save each as an OCI archive a user can push:
#
#   e2e/scripts/images.sh [operator] [trainer]     (default: both)
#
# Each image holds its binary (/usr/local/bin/<name>) and exactly the shared
# libraries `ldd` says it loads (in /usr/local/lib/heterotrain, on
# LD_LIBRARY_PATH; the dynamic loader at its usual path), plus /etc/passwd
# and /etc/group naming the non-root user 65532 it runs as, and /tmp. No
# base image: nothing is pulled. The trainer also gets the cuDNN and NVRTC
# libraries its CUDA libraries load at run time (dlopen), so one image
# serves CPU and GPU nodes.
#
# OUT             where the archives go (default: out/images)
# TAG             the images' tag (default: the workspace version)
# REGISTRY        the images' name prefix (default: ghcr.io/heterotrain,
#                 the chart's default)
# OPERATOR_BINARY / TRAINER_BINARY
#                 package this binary instead of building the release one
#
# Push one:   skopeo copy oci-archive:out/images/heterotrain-operator-0.1.0.oci.tar \
#               docker://registry.example/heterotrain-operator:0.1.0
# Run one:    podman run --rm oci-archive:out/images/heterotrain-operator-0.1.0.oci.tar --help
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
OUT=${OUT:-$ROOT/out/images}
TAG=${TAG:-$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)}
REGISTRY=${REGISTRY:-ghcr.io/heterotrain}
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
BUILDAH=(buildah --root "$CACHE/containers/storage" --runroot "$CACHE/containers/run" --storage-driver vfs)
LIBDIR=/usr/local/lib/heterotrain
T0=$(date +%s)
step() { printf '==> [images %3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
die() { echo "error: $*" >&2; exit 1; }

command -v buildah >/dev/null || die "buildah is not installed (make setup installs it)"
command -v strip >/dev/null || die "strip (binutils) is not installed"
images=("$@")
[ ${#images[@]} -gt 0 ] || images=(operator trainer)
mkdir -p "$OUT"
# Working containers left by an interrupted run (this storage is ours alone).
"${BUILDAH[@]}" rm --all >/dev/null 2>&1 || true

# The binary of image $1: given, or the release build (built now).
binary_of() {
  local name=$1 given=$2
  if [ -n "$given" ]; then
    [ -x "$given" ] || die "no executable at $given"
    echo "$given"
    return
  fi
  step "cargo build --release -p $3 --bin $name" >&2
  (cd "$ROOT" && cargo build -q --release -p "$3" --bin "$name") >&2
  echo "$TARGET/release/$name"
}

# Copy $1's shared libraries (ldd) into the root file system $2.
copy_libs() {
  local bin=$1 root=$2 line name path
  mkdir -p "$root$LIBDIR" "$root/lib64"
  while read -r line; do
    case "$line" in
      *"=> not found"*) die "$bin needs a library ldd cannot find: $line" ;;
      *"=> /"*)
        name=${line%% =>*}
        path=${line#*=> }
        path=${path%% (*}
        cp -L "$path" "$root$LIBDIR/$name" ;;
      /*ld-linux*)
        path=${line%% (*}
        cp -L "$path" "$root/lib64/$(basename "$path")" ;;
    esac
  done < <(ldd "$bin")
}

# Root file system for binary $1 (image name $2) in directory $3.
rootfs() {
  local bin=$1 name=$2 root=$3
  mkdir -p "$root/usr/local/bin" "$root/etc" "$root/tmp"
  chmod 1777 "$root/tmp"
  cp -L "$bin" "$root/usr/local/bin/$name"
  chmod 0755 "$root/usr/local/bin/$name"
  # Debug info stays with the build (the symbols, for backtraces, stay in).
  strip --strip-debug "$root/usr/local/bin/$name"
  copy_libs "$bin" "$root"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
}

# Commit root file system $1 as image $2 with entrypoint binary $3.
commit() {
  local root=$1 name=$2 description=$3 ref="$REGISTRY/$2:$TAG"
  local archive="$OUT/$name-$TAG.oci.tar" c
  c=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy "$c" "$root/" / >/dev/null
  "${BUILDAH[@]}" config \
    --entrypoint "[\"/usr/local/bin/$name\"]" --cmd '' \
    --user 65532:65532 --workingdir /tmp \
    --env "LD_LIBRARY_PATH=$LIBDIR" \
    --label org.opencontainers.image.title="$name" \
    --label org.opencontainers.image.description="$description" \
    --label org.opencontainers.image.source=https://github.com/heterotrain/heterotrain \
    --label org.opencontainers.image.licenses=Apache-2.0 \
    --label org.opencontainers.image.version="$TAG" \
    "$c"
  rm -f "$archive"
  "${BUILDAH[@]}" commit --quiet --disable-compression "$c" "oci-archive:$archive:$ref" >/dev/null
  "${BUILDAH[@]}" rm "$c" >/dev/null
  step "$ref -> $archive ($(du -h "$archive" | cut -f1))"
}

for image in "${images[@]}"; do
  stage=$(mktemp -d)
  case "$image" in
    operator)
      bin=$(binary_of heterotrain-operator "${OPERATOR_BINARY:-}" heterotrain-operator)
      step "operator: $bin and its libraries"
      rootfs "$bin" heterotrain-operator "$stage"
      commit "$stage" heterotrain-operator "HeteroTrain Kubernetes operator" ;;
    trainer)
      bin=$(binary_of heterotrain-trainer "${TRAINER_BINARY:-}" heterotrain-trainer)
      step "trainer: $bin and its libraries (libtorch, CUDA)"
      rootfs "$bin" heterotrain-trainer "$stage"
      # Loaded at run time by cuDNN and torch's CUDA code (dlopen), so not
      # in ldd's list: the cuDNN sub-libraries and NVRTC next to them.
      for dir in $(ldd "$bin" | sed -n 's/.*=> \(\/[^ ]*\/nvidia\/[^ ]*\)\/lib[^/]* (.*/\1/p' | sort -u); do
        find "$dir" -maxdepth 1 \( -name 'libcudnn*.so*' -o -name 'libnvrtc*.so*' \) \
          -exec cp -Ln {} "$stage$LIBDIR/" \;
      done
      commit "$stage" heterotrain-trainer "HeteroTrain trainer (libtorch; CPU and CUDA)" ;;
    *) die "unknown image $image (operator, trainer)" ;;
  esac
  rm -rf "$stage"
done
