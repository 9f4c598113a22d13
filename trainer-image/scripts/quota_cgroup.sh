# Sourced by quota_ranks.sh and sync_bound.sh: one rank's cgroup v1 groups.
#
# quota_groups I QUOTA CPUS: creates heterotrain-quota/rI in the cpu,
# cpuset and cpuacct hierarchies with QUOTA cores of CPU time per
# $PERIOD_US, on CPUS, and $BURST × the quota of saved-up time (cgroup v1
# cpu.cfs_burst_us; 0 by default, as Kubernetes sets); sets $cpu, $set and
# $acct to the groups' directories. Needs root, $PY and $PERIOD_US.
quota_groups() {
  local i=$1 q=$2 cpus=$3 G=heterotrain-quota quota burst
  cpu=/sys/fs/cgroup/cpu/$G/r$i set=/sys/fs/cgroup/cpuset/$G/r$i acct=/sys/fs/cgroup/cpuacct/$G/r$i
  mkdir -p "$cpu" "$set" "$acct"
  cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/$G/cpuset.cpus
  cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/$G/cpuset.mems
  echo "$cpus" >"$set/cpuset.cpus"
  cat /sys/fs/cgroup/cpuset/cpuset.mems >"$set/cpuset.mems"
  echo "$PERIOD_US" >"$cpu/cpu.cfs_period_us"
  quota=$("$PY" -c "print(int($q * $PERIOD_US))")
  echo "$quota" >"$cpu/cpu.cfs_quota_us"
  burst=$("$PY" -c "print(int(${BURST:-0} * $quota))")
  if [[ -f $cpu/cpu.cfs_burst_us ]]; then
    echo "$burst" >"$cpu/cpu.cfs_burst_us"
  elif [[ $burst != 0 ]]; then
    echo "error: BURST needs cpu.cfs_burst_us (Linux 5.14+)" >&2
    exit 2
  fi
}
