#!/usr/bin/env bash
# bench_gpu.sh: one CUDA rank and one CPU rank on one GPU machine — the
# mixed cluster HeteroTrain is for, checked by hand (CI has no GPU; run it
# where a GPU is, with a trainer built on a machine that has the same torch).
#
#   1. exactness: simple_cnn and mlp, 20 SGD steps with momentum and weight
#      decay, B 32 split 24 / 8 over a CUDA and a CPU rank, and over two
#      ranks sharing the GPU, against one CUDA process with B 32 (the same
#      initial weights: rank 0 draws them on its device and broadcasts
#      them): the largest |Δ| over all final parameters;
#   2. learning: mlp on the digits (MNIST IDX from `make setup`), 24 / 8,
#      held-out accuracy after 5 epochs;
#   3. speed, resnet18 on synthetic images, B 256: the CUDA rank alone, both
#      ranks with the equal split, both with the local dynamic balancer, and
#      the CPU rank left out (plan 256 / 0); samples/s (median of RUNS) and
#      the ratios, measured in this one run;
#   4. the local dynamic balancer over a longer run (LONG_STEPS, 215): the
#      CUDA rank's batch by step (where the CPU rank is left out and
#      re-admitted), how many steps the CPU rank trained after the warm-up
#      and their seconds, and samples/s over the last 100 steps and over
#      every step after the warm-up against the CUDA rank alone, RUNS
#      interleaved pairs.
#
# env: TRAINER (the heterotrain-trainer binary), PY (python with torch and
#      safetensors, default python3), DIGITS (the digits-mnist directory),
#      CPU_THREADS (threads of the CPU rank, default 8), RUNS (3),
#      STEPS (speed: timed steps, default 60, after 15 warm-up steps),
#      LONG_STEPS (part 4, default 215; 0 skips it), PARTS (the parts to
#      run, default "1 2 3 4")
set -euo pipefail
trainer="${TRAINER:?TRAINER=<path of heterotrain-trainer>}"
py="${PY:-python3}"
digits="${DIGITS:-}"
cpu_threads="${CPU_THREADS:-8}"
runs="${RUNS:-3}"
steps="${STEPS:-60}"
long_steps="${LONG_STEPS:-215}"
parts=" ${PARTS:-1 2 3 4} "
warm=15
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

port() { "$py" -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }
say() { echo "==> [bench-gpu] $*" >&2; }

# gang OUT DEVICES ARGS...: one rank per device in DEVICES ("cuda cpu"),
# the CPU rank with CPU_THREADS threads; fails if any rank fails.
gang() {
  local out=$1 devices=($2) p world pids=() r=0 rc=0; shift 2
  world=${#devices[@]}; p=$(port)
  for d in "${devices[@]}"; do
    local threads=1
    [ "$d" = cpu ] && threads=$cpu_threads
    RANK=$r WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$p \
      "$trainer" train --device "$d" --threads "$threads" --metrics-port 0 \
      --output-dir "$out" "$@" >"$out.rank$r.log" 2>&1 &
    pids+=($!); r=$((r + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid" || rc=$?; done
  if [ "$rc" != 0 ]; then
    tail -n 20 "$out".rank*.log >&2
    return "$rc"
  fi
}

exact_args() { # model
  echo --model "$1" --dataset synthetic_image --synthetic-samples 1024 --hidden 64 \
    --batch-size 32 --max-steps 20 --epochs 100 --momentum 0.9 --weight-decay 0.0001 \
    --seed 11 --lr "$([ "$1" = mlp ] && echo 0.005 || echo 0.05)"
}

part() { [[ "$parts" == *" $1 "* ]]; }

if part 1; then
say "1. exactness: 24 / 8 against one CUDA process, B 32"
echo '{"generation":0,"globalBatchSize":32,"batchSizes":[24,8]}' >"$tmp/plan-24-8.json"
echo "| model | ranks (24 / 8) | max abs diff of the final parameters vs one CUDA process | largest parameter |"
echo "|---|---|---|---|"
for model in mlp simple_cnn; do
  # shellcheck disable=SC2046
  gang "$tmp/one-$model" "cuda" $(exact_args "$model")
  for devices in "cuda cpu" "cuda cuda"; do
    out="$tmp/split-$model-${devices/ /-}"
    # shellcheck disable=SC2046
    gang "$out" "$devices" $(exact_args "$model") --plan-file "$tmp/plan-24-8.json"
    "$py" - "$tmp/one-$model/model.safetensors" "$out/model.safetensors" "$model" "$devices" <<'PY'
import sys
from safetensors.torch import load_file
a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
assert a.keys() == b.keys(), (sorted(a), sorted(b))
d = max((a[k].double() - b[k].double()).abs().max().item() for k in a)
m = max(a[k].double().abs().max().item() for k in a)
print(f"| {sys.argv[3]} | {sys.argv[4].replace(' ', ' + ')} | {d:.2e} | {m:.2f} |")
PY
  done
done
fi

if part 2 && [ -n "$digits" ]; then
  say "2. learning: mlp on the digits, 24 (cuda) / 8 (cpu), 5 epochs"
  gang "$tmp/digits" "cuda cpu" --model mlp --dataset mnist --data-dir "$digits" \
    --batch-size 32 --epochs 5 --lr 0.05 --plan-file "$tmp/plan-24-8.json"
  grep -h "eval accuracy" "$tmp/digits.rank0.log" | tail -n 1
fi

# speed OUT DEVICES ARGS...: global samples/s over the timed steps (the
# slowest rank's summed step time)
speed() {
  local out=$1 devices=$2; shift 2
  gang "$out" "$devices" --model resnet18 --dataset synthetic_image --synthetic-samples 8192 \
    --batch-size 256 --max-steps $((steps + warm)) --epochs 1000 --lr 0.01 "$@"
  "$py" - "$out" "$warm" "$(wc -w <<<"$devices")" <<'PY'
import json, sys
out, warm, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
tot, samples = [], 0
for r in range(world):
    st = [json.loads(l) for l in open(f"{out}/rank-{r}.jsonl") if '"event":"step"' in l][warm:]
    tot.append(sum(s["step_seconds"] for s in st))
    samples += sum(s["batch_size"] for s in st)
print(samples / max(tot))
PY
}

median() { sort -g | awk '{a[NR]=$1} END {print (NR%2 ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2)}'; }

if part 3; then
say "3. speed: resnet18, B 256, $runs runs of $steps steps each (interleaved)"
echo '{"generation":0,"globalBatchSize":256,"batchSizes":[128,128]}' >"$tmp/plan-equal.json"
echo '{"generation":0,"globalBatchSize":256,"batchSizes":[256,0]}' >"$tmp/plan-out.json"
alone=() equal=() dyn=() out=()
for i in $(seq "$runs"); do
  alone+=("$(speed "$tmp/alone-$i" "cuda")")
  equal+=("$(speed "$tmp/equal-$i" "cuda cpu" --plan-file "$tmp/plan-equal.json")")
  dyn+=("$(speed "$tmp/dyn-$i" "cuda cpu" --balancer local --policy dynamic --balance-every 5)")
  out+=("$(speed "$tmp/out-$i" "cuda cpu" --plan-file "$tmp/plan-out.json")")
done
a=$(printf '%s\n' "${alone[@]}" | median)
e=$(printf '%s\n' "${equal[@]}" | median)
d=$(printf '%s\n' "${dyn[@]}" | median)
o=$(printf '%s\n' "${out[@]}" | median)
split=$("$py" -c 'import json,sys
last=lambda r: [json.loads(l) for l in open(f"{sys.argv[1]}/rank-{r}.jsonl") if "\"event\":\"step\"" in l][-1]["batch_size"]
print(f"{last(0)} / {last(1)}")' "$tmp/dyn-$runs")
ratio() { "$py" -c 'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.2f}")' "$1" "$2"; }
echo "| variant | samples/s (median of $runs) |"
echo "|---|---|"
printf '| cuda alone, 256 | %.1f |\n' "$a"
printf '| cuda + cpu (%s threads), equal 128 / 128 | %.1f |\n' "$cpu_threads" "$e"
printf '| cuda + cpu (%s threads), dynamic (last split %s) | %.1f |\n' "$cpu_threads" "$split" "$d"
printf '| cuda + cpu, cpu left out 256 / 0 | %.1f |\n' "$o"
echo "dynamic / equal: $(ratio "$d" "$e")   dynamic / cuda alone: $(ratio "$d" "$a")   left out / cuda alone: $(ratio "$o" "$a")"
fi

part 4 && [ "$long_steps" -gt 115 ] || exit 0
say "4. the local dynamic balancer over $long_steps steps against the CUDA rank alone ($runs pairs)"
for i in $(seq "$runs"); do
  gang "$tmp/long-alone-$i" "cuda" --model resnet18 --dataset synthetic_image --synthetic-samples 8192 \
    --batch-size 256 --max-steps "$long_steps" --epochs 1000 --lr 0.01
  gang "$tmp/long-dyn-$i" "cuda cpu" --model resnet18 --dataset synthetic_image --synthetic-samples 8192 \
    --batch-size 256 --max-steps "$long_steps" --epochs 1000 --lr 0.01 \
    --balancer local --policy dynamic --balance-every 5
  "$py" - "$tmp/long-alone-$i" "$tmp/long-dyn-$i" "$i" "$warm" <<'PY'
import json, sys
def steps(out):
    return [json.loads(l) for l in open(f"{out}/rank-0.jsonl") if '"event":"step"' in l]
def rate(st):  # global samples/s: 256 a step, whoever trains them
    return 256 * len(st) / sum(s["step_seconds"] for s in st)
alone, dyn = steps(sys.argv[1]), steps(sys.argv[2])
warm = int(sys.argv[4])
changes = []
for s in dyn:
    if not changes or changes[-1][1] != s["batch_size"]:
        changes.append((s["step"], s["batch_size"]))
readmits = sum(1 for a, b in zip(changes, changes[1:]) if a[1] == 256 and b[1] < 256)
shared = [s["step_seconds"] for s in dyn[warm:] if s["batch_size"] < 256]
ra, rd = rate(alone[-100:]), rate(dyn[-100:])
wa, wd = rate(alone[warm:]), rate(dyn[warm:])
print(f"pair {sys.argv[3]}: the CUDA rank's batch from step: {changes}; "
      f"re-admissions {readmits}; steps the CPU rank trained after step {warm}: {len(shared)} "
      f"({sum(shared):.2f} s); last 100 steps: alone {ra:.1f}, dynamic {rd:.1f} samples/s, "
      f"dynamic / alone {rd / ra:.3f}; steps {warm + 1}-{len(dyn)}: alone {wa:.1f}, dynamic {wd:.1f}, "
      f"dynamic / alone {wd / wa:.3f}")
PY
done
