#!/usr/bin/env bash
# `make test`: every test but the benchmarks, in five pytest processes at
# once, each with its own log:
#   machines  `-m "kind or node"`: tests/machines (the demo on the real node, kind, the
#             real node), in that order (one after the other, never at once: below)
#   envtest1, envtest2, envtest3  `-m envtest --envtest-shard K/3`: the three shares of the
#             tests on the real API server (the controller's, the agent's, the chart's
#             install, ...), wherever they live in tests/<room>/ (whole modules, or single
#             tests of a module marked shard_by_test, dealt in path order)
#   main      everything else (pure code, mounts, chart rendering, ...)
# The runs are chosen by markers and shares, never by folder, so each test is in exactly
# one of them.
#
# Why side by side: most of the suite's time is waiting, not computing — on kind's cluster
# and the real node's kubelet, on budget windows, on controllers started and killed. Run
# one after the other, those waits add up (22-25 min); side by side they overlap (the
# numbers are in the README, "Development"). Each run's tests make their own control
# plane, node, cluster, mount namespaces and cgroups and check only what they made.
#
# Why kind and the real node stay in one process: at the same time, four real-node tests
# failed while kind's cluster was up (the node's pods timed out on the API server's
# service IP; a pod volume showed a second mount): podman, running kind's nodes, changes
# the host's iptables and mount table under a running node (docs/kind.md). In one process
# kind's cluster is deleted (end of tests/machines/kind) before tests/machines/node's node
# starts, and the demo's real node (first: tests/machines/demo/conftest.py) is gone before
# kind's cluster is made.
#
# With arguments it is one plain pytest run with them: a
# developer's selection runs as asked.
#
# Output: the main run streams; the others write to $UNSTICK_TEST_LOGS/<name>.log (default
# .test-logs/), printed whole once all ended. The exit code is the first failed run's
# (main, machines, envtest1, envtest2, envtest3), else 0.
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
# The envtests (~38 min in one run at the last count, most of it waiting on leases, budget
# windows and controllers started and killed) are dealt in three shares
# (tests/conftest.py --envtest-shard), one side run each. They were two shares beside a
# main run that took the third: the share holding test_leader_election.py (~17 min on its
# own) ran 22 min. That module's tests are now dealt one by one (shard_by_test).
envtests="-m 'envtest and not bench and not ($machines)' --durations=15"
declare -A args=(
  [machines]="-m '$machines' --durations=15"
  [envtest1]="$envtests --envtest-shard 1/3"
  [envtest2]="$envtests --envtest-shard 2/3"
  [envtest3]="$envtests --envtest-shard 3/3"
)
side=(machines envtest1 envtest2 envtest3)
declare -A pid tmp
for name in "${side[@]}"; do
  tmp[$name]=$(mktemp -d "/tmp/unstick-$name-tests.XXXXXX")
  # -p no:cacheprovider: the runs must not write .pytest_cache at once; --basetemp: its
  # own tmp_path root, so no run's cleanup of old numbered dirs meets another's.
  eval "set -- ${args[$name]}"
  "${pytest[@]}" "$@" -p no:cacheprovider --basetemp="${tmp[$name]}/t" >"$logs/$name.log" 2>&1 &
  pid[$name]=$!
  echo "$name (pytest ${args[$name]}) runs beside this run: pid ${pid[$name]}, log $logs/$name.log"
done

stop_side() {
  # Ctrl-C or a kill of make: each side run gets SIGINT, so its fixtures tear down what
  # they made (control plane, node, cluster).
  for name in "${side[@]}"; do kill -INT "${pid[$name]}" 2>/dev/null; done
  for name in "${side[@]}"; do wait "${pid[$name]}" 2>/dev/null; rm -rf "${tmp[$name]}"; done
}
trap 'stop_side; exit 130' INT TERM

"${pytest[@]}" -m "not bench and not envtest and not ($machines)" --durations=25
code=$?
echo "================ main (everything else): exit $code ================"

for name in "${side[@]}"; do
  wait "${pid[$name]}"
  rc=$?
  rm -rf "${tmp[$name]}"
  echo
  echo "================ $name (pytest ${args[$name]}), run beside: $logs/$name.log ================"
  cat "$logs/$name.log"
  echo "================ $name: exit $rc ================"
  if [ "$code" -eq 0 ]; then code=$rc; fi
done
trap - INT TERM
exit "$code"
