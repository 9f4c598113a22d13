#!/usr/bin/env bash
# Run a gang of trainer ranks on this machine, each in its own CPU-quota
# cgroup (cgroup v1, as root), without Kubernetes: the by-hand check of
# where a quota-bound gang's step goes. See --help.
set -euo pipefail

usage() {
  cat <<'EOF'
usage: quota_ranks.sh OUT STEPS "QUOTA:CPUS:BATCH ..." [trainer args ...]

Starts one heterotrain-trainer rank per QUOTA:CPUS:BATCH (rank order), each
in cgroup v1 cpu/cpuset/cpuacct groups named heterotrain-quota/rN:
  QUOTA  cores of CPU time per 100 ms period (0.15 = 15 ms per period)
  CPUS   the cpuset (e.g. 0-1)
  BATCH  the rank's local batch in a fixed plan (a 0 leaves the rank out);
         "-" on every rank: --balancer local --policy dynamic instead
simple_cnn on the digits CIFAR-10 set from `make setup`, global batch = the
sum of the batches (or $B, 128, with "-"), one thread per rank.

Prints samples/s over the last half of the steps (by the wall clock, and
by step time as `make bench` measures: evaluation left out), each rank's median
compute and exposed communication, and its CPU time per step (cpuacct)
and throttled quota periods over the whole run. SOLO=1 runs every rank
alone (world size 1) at its batch, all at the same time: the concurrent
ideal's terms. Environment: TRAINER (default: the cache's release build),
DATA, MODEL (simple_cnn), LR (0.02), B, PERIOD_US (100000), BURST (quota a
rank may save up from idle periods, as a multiple of its quota per period:
cgroup v1 cpu.cfs_burst_us; 0, the default, as Kubernetes sets), SCRAPE (seconds:
each rank serves /metrics and is scraped that often with curl, as the
operator and Prometheus do in a cluster; unset: no metrics endpoint).

Needs root and cgroup v1 (/sys/fs/cgroup/cpu). Example, 4 ranks on 2 CPUs:
  sudo bash trainer-image/scripts/quota_ranks.sh /tmp/q 300 \
    "0.6:0-1:56 0.42:0-1:39 0.24:0-1:23 0.15:0-1:10"
EOF
}

if [[ $# -lt 3 || $1 == -h || $1 == --help ]]; then
  usage
  [[ $# -ge 1 && ($1 == -h || $1 == --help) ]] && exit 0
  exit 2
fi
OUT=$1 STEPS=$2 SPEC=$3
shift 3
CACHE=${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}
TRAINER=${TRAINER:-${CARGO_TARGET_DIR:-$CACHE/target}/release/heterotrain-trainer}
DATA=${DATA:-$CACHE/data/digits-cifar10}
MODEL=${MODEL:-simple_cnn} LR=${LR:-0.02} PERIOD_US=${PERIOD_US:-100000}
PY=${HETEROTRAIN_PYTHON:-python3}
for need in "$TRAINER" "$DATA"; do
  [[ -e $need ]] || { echo "error: $need is missing (make setup, make build)" >&2; exit 2; }
done
[[ -d /sys/fs/cgroup/cpu && -d /sys/fs/cgroup/cpuset && -d /sys/fs/cgroup/cpuacct ]] ||
  { echo "error: needs cgroup v1 cpu, cpuset and cpuacct hierarchies" >&2; exit 2; }
[[ -w /sys/fs/cgroup/cpu ]] || { echo "error: needs root (writes cgroups)" >&2; exit 2; }
[[ -f $CACHE/env.sh ]] && . "$CACHE/env.sh"
. "$(dirname "$0")/quota_cgroup.sh"

read -ra RANKS <<<"$SPEC"
WORLD=${#RANKS[@]}
batches=()
for r in "${RANKS[@]}"; do
  IFS=: read -r q c b <<<"$r"
  [[ $q =~ ^[0-9.]+$ && -n $c && $b =~ ^([0-9]+|-)$ ]] ||
    { echo "error: '$r' is not QUOTA:CPUS:BATCH" >&2; exit 2; }
  batches+=("$b")
done
if [[ ${SOLO:-0} == 1 ]]; then
  for b in "${batches[@]}"; do
    [[ $b =~ ^[1-9][0-9]*$ ]] || { echo "error: SOLO=1 needs a batch above 0 on every rank" >&2; exit 2; }
  done
fi
rm -rf "$OUT" && mkdir -p "$OUT"
plan=()
if [[ ${batches[0]} == - ]]; then
  plan=(--balancer local --policy dynamic)
  GLOBAL=${B:-128}
else
  GLOBAL=0
  for b in "${batches[@]}"; do GLOBAL=$((GLOBAL + b)); done
  printf '{"generation":0,"globalBatchSize":%s,"batchSizes":[%s]}\n' \
    "$GLOBAL" "$(IFS=,; echo "${batches[*]}")" >"$OUT/plan.json"
  plan=(--plan-file "$OUT/plan.json")
fi
PORT=$((29000 + RANDOM % 1000))
SCRAPE=${SCRAPE:-}
[[ -z $SCRAPE || $SCRAPE =~ ^[0-9]*\.?[0-9]+$ ]] || { echo "error: SCRAPE=$SCRAPE is not a number of seconds" >&2; exit 2; }
G=heterotrain-quota
pids=()
for i in "${!RANKS[@]}"; do
  IFS=: read -r q cpus b <<<"${RANKS[$i]}"
  quota_groups "$i" "$q" "$cpus"
  echo 0 >"$acct/cpuacct.usage"
  cp "$cpu/cpu.stat" "$OUT/cpu.stat.start.$i"
  if [[ ${SOLO:-0} == 1 ]]; then
    env=(RANK=0 WORLD_SIZE=1 MASTER_PORT=$((PORT + 1 + i)))
    args=(--batch-size "$b" --output-dir "$OUT/solo$i")
  else
    env=(RANK=$i WORLD_SIZE=$WORLD MASTER_PORT=$PORT)
    args=(--batch-size "$GLOBAL" --output-dir "$OUT" "${plan[@]}")
  fi
  # The child joins its groups before it execs the trainer.
  env "${env[@]}" MASTER_ADDR=127.0.0.1 bash -c \
    'for g in "$1" "$2" "$3"; do echo $$ >"$g/tasks"; done; shift 3; exec "$@"' _ \
    "$cpu" "$set" "$acct" "$TRAINER" train --model "$MODEL" --dataset cifar10 \
    --data-dir "$DATA" --lr "$LR" --max-steps "$STEPS" --threads 1 \
    --metrics-port "$([[ -n $SCRAPE ]] && echo $((PORT + 100 + i)) || echo 0)" \
    "${args[@]}" "$@" >"$OUT/r$i.log" 2>&1 &
  pids+=($!)
done
t0=$(date +%s.%N)
scraper=
if [[ -n $SCRAPE ]]; then
  (
    while sleep "$SCRAPE"; do
      for i in "${!RANKS[@]}"; do
        curl -s -m 2 -o /dev/null "http://127.0.0.1:$((PORT + 100 + i))/metrics" || true
      done
    done
  ) &
  scraper=$!
fi
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
t1=$(date +%s.%N)
[[ -z $scraper ]] || kill "$scraper" 2>/dev/null || true
for i in "${!RANKS[@]}"; do
  cp "/sys/fs/cgroup/cpu/$G/r$i/cpu.stat" "$OUT/cpu.stat.end.$i"
  cat "/sys/fs/cgroup/cpuacct/$G/r$i/cpuacct.usage" >"$OUT/cpuacct.$i"
done
[[ $rc == 0 ]] || { echo "error: a rank failed; logs in $OUT/r*.log" >&2; exit 1; }
"$PY" - "$OUT" "$WORLD" "$t0" "$t1" "${SOLO:-0}" <<'PY'
import json, statistics as st, sys
out, world, t0, t1, solo = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), sys.argv[5] == "1"
def steps(path):
    with open(path) as f:
        return [r for r in map(json.loads, f) if r.get("event") == "step"]
def rate(recs):
    h = recs[len(recs) // 2:]
    return sum(r["batch_size" if solo else "global_batch_size"] for r in h[1:]) / (h[-1]["unix_seconds"] - h[0]["unix_seconds"])
def union_rate(ranks):
    # The bench's measure: samples over the union of the ranks' step
    # intervals (last half), so pauses in which no rank steps (evaluation)
    # are left out.
    by = [{r["step"]: r for r in recs} for recs in ranks]
    common = sorted(set.intersection(*(set(d) for d in by)))
    common = common[len(common) // 2:]
    covered, secs, n = float("-inf"), 0.0, 0
    for s in common:
        rs = [d[s] for d in by]
        start = min(r["unix_seconds"] - r["step_seconds"] for r in rs)
        end = max(r["unix_seconds"] for r in rs)
        secs += max(0.0, end - max(start, covered))
        covered = max(covered, end)
        n += rs[0]["global_batch_size"] if not solo else rs[0]["batch_size"]
    return n / secs if secs > 0 else 0.0
def stat(path):
    with open(path) as f:
        return dict(l.split() for l in f)
logs = [f"{out}/solo{i}/rank-0.jsonl" if solo else f"{out}/rank-{i}.jsonl" for i in range(world)]
recs = [steps(p) for p in logs]
if solo:
    rates = [rate(r) for r in recs]
    print(f"alone at the same time: {' + '.join(f'{x:.0f}' for x in rates)} = {sum(rates):.0f} samples/s")
    steps_only = [union_rate([r]) for r in recs]
    print(f"  by step time (evaluation left out, as the bench measures): "
          f"{' + '.join(f'{x:.0f}' for x in steps_only)} = {sum(steps_only):.0f} samples/s")
else:
    print(f"together: {rate(recs[0]):.0f} samples/s over the last half of {len(recs[0])} steps")
    print(f"  by step time (the union of the ranks' step intervals, evaluation left out, "
          f"as the bench measures): {union_rate(recs):.0f} samples/s")
for i, r in enumerate(recs):
    h = r[len(r) // 2:]
    a, b = stat(f"{out}/cpu.stat.start.{i}"), stat(f"{out}/cpu.stat.end.{i}")
    with open(f"{out}/cpuacct.{i}") as f:
        cpu = int(f.read()) / 1e6
    print(f"  rank {i}: batch {h[-1]['batch_size']}, compute {st.median(x['compute_seconds'] for x in h) * 1e3:.1f} ms, "
          f"exposed comm {st.median(x['allreduce_seconds'] for x in h) * 1e3:.1f} ms (medians); "
          f"CPU {cpu / len(r):.1f} ms/step, throttled in {int(b['nr_throttled']) - int(a['nr_throttled'])} of "
          f"{int(b['nr_periods']) - int(a['nr_periods'])} periods, {cpu / 1e3 / (t1 - t0):.2f} cores")
PY
