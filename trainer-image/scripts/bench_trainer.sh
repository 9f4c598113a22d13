#!/usr/bin/env bash
# bench_trainer.sh: HeteroTrain trainer vs PyTorch DDP (torchrun, Gloo, same
# torch, model, global batch, threads per rank), 2 ranks on this machine.
# The compared variants run interleaved (ours, DDP, ours, DDP, ...), so drift
# on this shared machine hits both; prints the median samples/s of each and
# the median and min-max of the paired ratios. Then the update inside vs
# after backward, and the next batch gathered ahead (the default) vs at its
# step (--no-prefetch), paired the same way. Then the cost of synchronised
# BatchNorm: ours with --batch-norm sync vs local, paired the same way.
# resnet18 runs ours with --batch-norm local against DDP (DDP's BatchNorm is
# per rank too: the same maths). Then the sharded optimizer update against
# the replicated one, paired the same way, also with a slow rank (0.3 core),
# and with that slow rank who owns the update: the fast rank alone
# (fastest, the default) against shares by batch (proportional).
# Last, a very slow rank (0.05 core) left out of the plan against the same
# rank kept at 1 sample and against rank 0 training alone.
#
# env: RUNS (5), THREADS (1 per rank), TRAINER (release binary path),
#      HETEROTRAIN_PYTHON (python with torch 2.11), ONLY=ddp (the first two
#      tables alone: ours vs DDP, the update inside vs after backward),
#      ONLY=leave-out (the 0.05-core left-out rank's table alone),
#      ONLY=owners (the slow rank's owners table alone),
#      ONLY=prefetch (the next batch gathered ahead vs at the step alone)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}"
[ -f "$cache/env.sh" ] && . "$cache/env.sh"
py="${HETEROTRAIN_PYTHON:-$cache/venv/bin/python}"
runs="${RUNS:-5}"
threads="${THREADS:-1}"
trainer="${TRAINER:-$cache/target-trainer/release/heterotrain-trainer}"
if [ -z "${TRAINER:-}" ]; then
  (cd "$root" && CARGO_TARGET_DIR="$cache/target-trainer" cargo build --release -q -p heterotrain-trainer)
fi
torchrun="$(dirname "$py")/torchrun"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

port() { "$py" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# ours: global samples/s over the steps after warm-up (max over ranks of the
# summed step time); WORLD ranks (default 2)
ours() { # model batch steps warmup extra...
  local model=$1 b=$2 steps=$3 warm=$4; shift 4
  local out="$tmp/ours-$RANDOM" p world=${WORLD:-2}; p=$(port)
  for r in $(seq 0 $((world - 1))); do
    (
      # SLOW_CGROUP: rank 1 runs in this CPU-quota cgroup (the slow node).
      if [ "$r" = 1 ] && [ -n "${SLOW_CGROUP:-}" ]; then echo "$BASHPID" > "$SLOW_CGROUP/cgroup.procs"; fi
      # FAST_CGROUP: rank 0's; PIN=1: rank r on CPU r (nodes on CPUs of their own).
      if [ "$r" = 0 ] && [ -n "${FAST_CGROUP:-}" ]; then echo "$BASHPID" > "$FAST_CGROUP/cgroup.procs"; fi
      pin=(); if [ -n "${PIN:-}" ]; then pin=(taskset -c "$r"); fi
      exec env RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$p "${pin[@]}" "$trainer" train \
        --model "$model" --dataset synthetic_image --synthetic-samples 4096 --batch-size "$b" \
        --max-steps $((steps + warm)) --epochs 1000 --lr 0.01 --threads "$threads" \
        --metrics-port 0 --output-dir "$out" "$@" 2>/dev/null
    ) &
  done
  wait
  "$py" - "$out" "$b" "$warm" "$world" <<'PY'
import json, sys
out, b, warm, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
tot = []
for r in range(world):
    st = [json.loads(l) for l in open(f"{out}/rank-{r}.jsonl") if '"event":"step"' in l]
    tot.append(sum(s["step_seconds"] for s in st[warm:]))
    n = len(st[warm:])
print(b * n / max(tot))
PY
}

# DDP: rank 0 prints its JSON line before the group is torn down; a rank
# that exits non-zero in the teardown after it (seen now and then with
# Gloo) does not void the measurement, a missing line does.
ddp() { # model batch steps warmup extra...
  local model=$1 b=$2 steps=$3 warm=$4; shift 4
  { OMP_NUM_THREADS=$threads "$torchrun" --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$(port)" \
    "$here/ddp_bench.py" --model "$model" --batch-size "$b" --steps "$steps" --warmup "$warm" \
    --threads "$threads" "$@" 2>/dev/null || true; } | "$py" -c 'import json,sys;print([json.loads(l) for l in sys.stdin if l.startswith("{")][0]["samples_per_second"])'
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }
minmax() { sort -g | awk 'NR==1{lo=$1} {hi=$1} END {printf "%.2f–%.2f", lo, hi}'; }

# paired NAME A-command B-command: runs A then B, RUNS times; prints a row.
paired() {
  local name=$1 a=$2 b=$3 as=() bs=() rs=() x y
  for _ in $(seq "$runs"); do
    x=$(eval "$a"); y=$(eval "$b")
    as+=("$x"); bs+=("$y"); rs+=("$(awk -v a="$x" -v b="$y" 'BEGIN { print a / b }')")
  done
  printf '| %s | %.1f | %.1f | %.2f | %s |\n' "$name" \
    "$(printf '%s\n' "${as[@]}" | median)" "$(printf '%s\n' "${bs[@]}" | median)" \
    "$(printf '%s\n' "${rs[@]}" | median)" "$(printf '%s\n' "${rs[@]}" | minmax)"
}

# The next batch gathered ahead on the idle-priority thread (the default)
# vs gathered when its step starts (--no-prefetch).
prefetch_table() {
  echo
  echo "the next batch gathered ahead (the default) vs at the step, --no-prefetch (ours, $runs interleaved pairs)"
  printf '| model, global batch | ahead samples/s | at the step samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
  paired "mlp (hidden 512), 256" "ours mlp 256 100 5 --hidden 512" "ours mlp 256 100 5 --hidden 512 --no-prefetch"
  paired "resnet18, 64" "ours resnet18 64 15 3 --batch-norm local" "ours resnet18 64 15 3 --batch-norm local --no-prefetch"
}
if [ "${ONLY:-}" = prefetch ]; then
  prefetch_table
  exit 0
fi

if [ "${ONLY:-}" != leave-out ] && [ "${ONLY:-}" != owners ]; then
echo "ours vs PyTorch DDP (2 ranks, $threads thread(s) each, $runs interleaved pairs)"
printf '| model, global batch | ours samples/s | DDP samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
paired "resnet18, 64" "ours resnet18 64 15 3 --batch-norm local" "ddp resnet18 64 15 3"
paired "mlp (hidden 512), 256" "ours mlp 256 100 5 --hidden 512" "ddp mlp 256 100 5 --hidden 512"
echo
echo "the sharded update inside backward (the default) vs after it (ours, $runs interleaved pairs)"
printf '| model, global batch | inside samples/s | after samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
paired "resnet18, 64" "ours resnet18 64 15 3 --batch-norm local" "ours resnet18 64 15 3 --batch-norm local --update-after-backward"
paired "mlp (hidden 512), 256" "ours mlp 256 100 5 --hidden 512" "ours mlp 256 100 5 --hidden 512 --update-after-backward"
[ "${ONLY:-}" = ddp ] && exit 0
prefetch_table
echo
echo "synchronised BatchNorm vs per-rank (ours, resnet18, global batch 64, $runs interleaved pairs)"
printf '| split | sync samples/s | local samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
paired "32 / 32" "ours resnet18 64 15 3 --batch-norm sync" "ours resnet18 64 15 3 --batch-norm local"
echo
echo "optimizer update sharded in proportion to the local batches vs replicated on every rank (ours, $runs interleaved pairs)"
printf '| model, split | sharded samples/s | replicated samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
paired "resnet18, 32 / 32" "ours resnet18 64 15 3 --batch-norm local" "ours resnet18 64 15 3 --batch-norm local --optimizer-sharding replicated"
paired "mlp (hidden 512), 128 / 128" "ours mlp 256 100 5 --hidden 512" "ours mlp 256 100 5 --hidden 512 --optimizer-sharding replicated"

fi

# A slow rank: rank 1 in a cgroup at QUOTA/PERIOD of a core (the kernel's
# smallest quota is 1 ms). Needs a writable cgroup (root).
slow_cgroup() { # quota-us period-us
  local v1=/sys/fs/cgroup/cpu v2=/sys/fs/cgroup d
  if [ -d "$v1" ] && [ -w "$v1" ]; then
    d="$v1/ht-bench-slow-$$-$1"; mkdir -p "$d" && echo "$2" > "$d/cpu.cfs_period_us" && echo "$1" > "$d/cpu.cfs_quota_us" && echo "$d"
  elif [ -f "$v2/cgroup.controllers" ] && [ -w "$v2" ]; then
    d="$v2/ht-bench-slow-$$-$1"; mkdir -p "$d" && echo "$1 $2" > "$d/cpu.max" && echo "$d"
  fi
}
# At 0.3 core the update's cost on the slow rank shows.
if [ "${ONLY:-}" != leave-out ] && [ "${ONLY:-}" != ddp ]; then
if SLOW_CGROUP=$(slow_cgroup 3000 10000 2>/dev/null) && [ -n "$SLOW_CGROUP" ]; then
  export SLOW_CGROUP
  plan="$tmp/plan-52-12.json"
  echo '{"generation":0,"globalBatchSize":64,"batchSizes":[52,12]}' > "$plan"
  if [ "${ONLY:-}" != owners ]; then
    echo
    echo "the same with rank 1 at 0.3 core, plan 52 / 12 (ours, $runs interleaved pairs)"
    printf '| model, split | sharded samples/s | replicated samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
    paired "resnet18, 52 / 12" "ours resnet18 64 6 2 --batch-norm local --plan-file $plan" "ours resnet18 64 6 2 --batch-norm local --plan-file $plan --optimizer-sharding replicated"
  fi
  rmdir "$SLOW_CGROUP" 2>/dev/null || true
else
  echo
  echo "(no writable cgroup: the slow-rank comparisons are skipped)"
fi
fi
# Who updates, on two simulated nodes as in `make bench`'s two-node
# scenario: rank 0 at 0.6 core on CPU 0, rank 1 at a smaller quota on CPU 1.
# The fast rank alone (fastest, the default) against shares by batch
# (proportional), each plan balanced for its rank 1 speed.
if [ "${ONLY:-}" != leave-out ] && [ "${ONLY:-}" != ddp ] && [ "$(nproc)" -ge 2 ] \
  && FAST_CGROUP=$(slow_cgroup 6000 10000 2>/dev/null) && [ -n "$FAST_CGROUP" ]; then
  export FAST_CGROUP PIN=1
  echo
  echo "who updates: rank 0 at 0.6 core on CPU 0, rank 1 on CPU 1; fastest (rank 0 updates everything) vs proportional (ours, simple_cnn, B 128, $runs interleaved pairs)"
  printf '| rank 1, split | fastest samples/s | proportional samples/s | ratio (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
  for q in "2000 104 24" "3600 80 48" "4700 72 56"; do
    set -- $q
    if SLOW_CGROUP=$(slow_cgroup "$1" 10000 2>/dev/null) && [ -n "$SLOW_CGROUP" ]; then
      export SLOW_CGROUP
      pf="$tmp/plan-$2-$3.json"
      echo "{\"generation\":0,\"globalBatchSize\":128,\"batchSizes\":[$2,$3]}" > "$pf"
      paired "0.$(( $1 / 1000 ))$(( $1 % 1000 / 100 )) core, $2 / $3" "ours simple_cnn 128 200 20 --plan-file $pf" "ours simple_cnn 128 200 20 --plan-file $pf --optimizer-sharding proportional"
      rmdir "$SLOW_CGROUP" 2>/dev/null || true
    fi
  done
  rmdir "$FAST_CGROUP" 2>/dev/null || true
  unset FAST_CGROUP PIN SLOW_CGROUP
fi
# At 0.05 core even one sample makes rank 1 the last to finish: left out
# (0 samples, no part in the exchange) against kept at 1 sample, and
# against rank 0 training alone (the best subset), and against the same
# plan with every control word waited at the end of its own step
# (--control-lag-steps 0: the left-out rank's CPU quota then stalls rank 0).
if [ "${ONLY:-}" != owners ] && SLOW_CGROUP=$(slow_cgroup 1000 20000 2>/dev/null) && [ -n "$SLOW_CGROUP" ]; then
  export SLOW_CGROUP
  out_plan="$tmp/plan-256-0.json" keep_plan="$tmp/plan-255-1.json"
  echo '{"generation":0,"globalBatchSize":256,"batchSizes":[256,0]}' > "$out_plan"
  echo '{"generation":0,"globalBatchSize":256,"batchSizes":[255,1]}' > "$keep_plan"
  mlp="ours mlp 256 60 5 --hidden 512"
  echo
  echo "rank 1 at 0.05 core: left out vs kept at 1 sample vs rank 0 alone (ours, mlp hidden 512, B 256, $runs interleaved pairs)"
  printf '| comparison | A samples/s | B samples/s | ratio A/B (median) | ratio (min–max) |\n|---|---|---|---|---|\n'
  paired "A 256 / 0 (left out), B 255 / 1" "$mlp --plan-file $out_plan" "$mlp --plan-file $keep_plan"
  paired "A 256 / 0 (left out), B rank 0 alone" "$mlp --plan-file $out_plan" "WORLD=1 $mlp"
  paired "A 256 / 0 (left out), B the same waiting each control word in its own step" "$mlp --plan-file $out_plan" "$mlp --plan-file $out_plan --control-lag-steps 0"
  rmdir "$SLOW_CGROUP" 2>/dev/null || true
fi
