#!/usr/bin/env bash
# `make demo`: the whole system on this machine.
set -euo pipefail
CACHE="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
source "$CACHE/env.sh"
cd "$(dirname "$0")/../.."
echo "==> building heterotrain-local"
cargo build -q --release -p heterotrain-e2e --bin heterotrain-local
LOCAL="$CARGO_TARGET_DIR/release/heterotrain-local"
"$LOCAL" up
eval "$("$LOCAL" env)"
echo "==> installing the HeteroTrainingJob CRD"
kubectl apply --validate=false -f crds/heterotrainingjob.yaml >/dev/null
kubectl wait --for=condition=Established crd/heterotrainingjobs.heterotrain.dev --timeout=60s >/dev/null
echo
echo "The local control plane is up with the HeteroTrainingJob API installed:"
echo "  export KUBECONFIG=$KUBECONFIG"
echo "  kubectl apply -f examples/quickstart.yaml && kubectl get htj"
echo
echo "NOT YET: the simulated heterogeneous nodes, the operator and the live"
echo "table of the full demo are not part of this build; jobs you apply are"
echo "stored and validated by the API server but no trainer runs them."
echo "Stop with: make demo-down"
