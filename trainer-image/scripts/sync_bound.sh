#!/usr/bin/env bash
# What a per-step synchronisation alone costs ranks on CPU quotas: the bound
# no exact synchronous step can beat on the same quotas. See --help.
set -euo pipefail

usage() {
  cat <<'TXT'
usage: sync_bound.sh MODE STEPS "QUOTA:BATCH ..."

Runs one plain-PyTorch rank (sync_bound.py: simple_cnn's layers, one thread)
per QUOTA:BATCH, each in a cgroup v1 CPU quota of QUOTA cores per period
(PERIOD_US, default 10000 as the bench), all on CPUS (default 0-1), at the
same time. MODE:
  solo     every rank alone (no group): prints each rank's samples/s and
           their sum, the concurrent ideal at this split
  barrier  one group; each step ends with a one-number all-reduce, the
           least a synchronous step needs
  grads    one group; the whole gradient all-reduced after backward
           (no overlap, no sharding)
The group modes print the gang's samples/s (global batch × steps/s over
the second half of the steps). Compare barrier with solo at the same
quotas: their ratio bounds any exact synchronous data-parallel step there.

Needs root and cgroup v1; Python from HETEROTRAIN_PYTHON (the cache's venv
after `make setup`). Example, the 4-node quotas of quota_ranks.sh:
  sudo bash trainer-image/scripts/sync_bound.sh barrier 300 "0.6:54 0.42:45 0.24:22 0.15:7"
TXT
}

if [[ $# -ne 3 || $1 == -h || $1 == --help ]]; then
  usage
  [[ $# -ge 1 && ($1 == -h || $1 == --help) ]] && exit 0
  exit 2
fi
MODE=$1 STEPS=$2
read -ra RANKS <<<"$3"
case $MODE in solo | barrier | grads) ;; *) echo "error: MODE is solo, barrier or grads" >&2; exit 2 ;; esac
[[ $STEPS =~ ^[1-9][0-9]*$ ]] || { echo "error: STEPS must be a positive number" >&2; exit 2; }
CACHE=${HETEROTRAIN_CACHE:-$HOME/.cache/heterotrain}
[[ -f $CACHE/env.sh ]] && . "$CACHE/env.sh"
PY=${HETEROTRAIN_PYTHON:-python3}
PERIOD_US=${PERIOD_US:-10000} CPUS=${CPUS:-0-1}
[[ -d /sys/fs/cgroup/cpu && -d /sys/fs/cgroup/cpuset && -d /sys/fs/cgroup/cpuacct ]] ||
  { echo "error: needs cgroup v1 cpu, cpuset and cpuacct hierarchies" >&2; exit 2; }
[[ -w /sys/fs/cgroup/cpu ]] || { echo "error: needs root (writes cgroups)" >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/quota_cgroup.sh"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
PORT=$((30000 + RANDOM % 1000))
pids=()
for i in "${!RANKS[@]}"; do
  IFS=: read -r q b <<<"${RANKS[$i]}"
  [[ $q =~ ^[0-9.]+$ && $b =~ ^[1-9][0-9]*$ ]] || { echo "error: '${RANKS[$i]}' is not QUOTA:BATCH" >&2; exit 2; }
  quota_groups "$i" "$q" "$CPUS"
  env=()
  [[ $MODE == solo ]] || env=(RANK=$i WORLD_SIZE=${#RANKS[@]} MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT)
  env "${env[@]}" OMP_NUM_THREADS=1 bash -c \
    'for g in "$1" "$2"; do echo $$ >"$g/tasks"; done; shift 2; exec "$@"' _ \
    "$cpu" "$set" "$PY" "$HERE/sync_bound.py" "$MODE" "$b" "$STEPS" "$OUT/r$i.json" \
    >"$OUT/r$i.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
for i in "${!RANKS[@]}"; do
  [[ -s $OUT/r$i.json ]] || { echo "error: rank $i wrote no result:" >&2; tail -5 "$OUT/r$i.log" >&2; exit 1; }
done
"$PY" - "$OUT" "${#RANKS[@]}" "$MODE" <<'PY'
import json, sys
out, n, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = [json.load(open(f"{out}/r{i}.json")) for i in range(n)]
batches = [x["batch"] for x in r]
if mode == "solo":
    rates = [x["batch"] * x["steps_per_second"] for x in r]
    print(f"solo {batches}: " + " + ".join(f"{v:.0f}" for v in rates) + f" = {sum(rates):.0f} samples/s")
else:
    print(f"{mode} {batches}: {sum(batches) * r[0]['steps_per_second']:.0f} samples/s")
PY
exit $rc
