#!/usr/bin/env bash
# The test run of `make test`: every test but the benchmarks, in two pytest processes at
# once — the suites on real machines (`-m "kind or node"`: the demo on the real node,
# tests/kind, tests/node, in that order) in one, everything else in the other.
#
# Why two: most of the suite's time is waiting, not computing — on kind's cluster and the
# real node's kubelet, on budget windows, on controllers started and killed. Run one after
# the other, those waits add up (22-25 min); side by side they overlap (the numbers are in
# the README, "Development"). The real-machine suites have their own cluster or node,
# control plane, network, cgroups and locks, and the rest checks only what it made itself.
#
# Why the kind suite and the real node stay in one process, one after the other: run at
# the same time, the real node's pods lost their way to the API server's service IP and
# its pods' volumes showed a second mount each (podman, running kind's nodes, changes the
# host's iptables and mount propagation under a running node): 4 real-node tests failed.
# In one process the kind cluster is deleted (end of tests/kind) before tests/node's node
# starts, and the demo's real node (first: tests/demo/conftest.py) is gone before kind's
# cluster is made.
#
# With arguments (`make test PYTEST_ARGS=...`) it is one plain pytest run with them: a
# developer's selection runs as asked.
#
# Output: the main run streams; the side run writes to $UNSTICK_TEST_LOGS/machines.log
# (default .test-logs/), printed whole once both ended. The exit code is the main run's if
# it failed, else the side run's.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pytest=(.venv/bin/pytest)

if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi

logs=${UNSTICK_TEST_LOGS:-$root/.test-logs}
mkdir -p "$logs"
machines="kind or node"
side_log="$logs/machines.log"
side_tmp=$(mktemp -d /tmp/unstick-machines-tests.XXXXXX)
# -p no:cacheprovider: the two runs must not write .pytest_cache at once; --basetemp: its
# own tmp_path root, so neither run's cleanup of old numbered dirs meets the other's.
"${pytest[@]}" -m "$machines" --durations=15 -p no:cacheprovider --basetemp="$side_tmp/t" \
  >"$side_log" 2>&1 &
side_pid=$!
echo "-m '$machines' runs beside this run: pid $side_pid, log $side_log"

stop_side() {
  # Ctrl-C or a kill of make: the side run gets SIGINT, so its fixtures tear down its
  # cluster or node.
  kill -INT "$side_pid" 2>/dev/null
  wait "$side_pid" 2>/dev/null
  rm -rf "$side_tmp"
}
trap 'stop_side; exit 130' INT TERM

"${pytest[@]}" -m "not bench and not ($machines)" --durations=25
code=$?
echo "================ main run (-m 'not bench and not ($machines)'): exit $code ================"

wait "$side_pid"
side=$?
trap - INT TERM
rm -rf "$side_tmp"
echo
echo "================ -m '$machines', run beside: $side_log ================"
cat "$side_log"
echo "================ -m '$machines': exit $side ================"
if [ "$code" -eq 0 ]; then code=$side; fi
exit "$code"
