#!/usr/bin/env bash
# The test run of `make test`: every test but the benchmarks, in three pytest processes at
# once — the kind suite (`-m kind`, tests/kind), the real-node suite (`-m node`: tests/node
# and the demo on the real node) and everything else.
#
# Why three: most of the suite's time is waiting, not computing — on kind's cluster and the
# real node's kubelet, on budget windows, on controllers started and killed. Run one after
# the other, those waits add up (22-25 min); side by side they overlap (the numbers are in
# the README, "Development"). The two side suites were written to run beside other work:
# each has its own cluster or node, control plane, network, cgroups and locks (docs/kind.md
# "Two runs at once"; tests/node/conftest.py), and the rest checks only what it made
# itself. Each marker's tests stay in one process, in their usual order (the demo's
# real-node test first, before the session's node takes the node lock).
#
# With arguments (`make test PYTEST_ARGS=...`) it is one plain pytest run with them: a
# developer's selection runs as asked.
#
# Output: the main run streams; each side run writes to $UNSTICK_TEST_LOGS/<marker>.log
# (default .test-logs/), printed whole once all ended. The exit code is the first failed
# run's (main, kind, node), else 0.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pytest=(.venv/bin/pytest)

if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi

logs=${UNSTICK_TEST_LOGS:-$root/.test-logs}
mkdir -p "$logs"
side=(kind node)
declare -A pid tmp
for marker in "${side[@]}"; do
  tmp[$marker]=$(mktemp -d "/tmp/unstick-$marker-tests.XXXXXX")
  # -p no:cacheprovider: the runs must not write .pytest_cache at once; --basetemp: its own
  # tmp_path root, so no run's cleanup of old numbered dirs meets another's.
  "${pytest[@]}" -m "$marker" --durations=10 -p no:cacheprovider --basetemp="${tmp[$marker]}/t" \
    >"$logs/$marker.log" 2>&1 &
  pid[$marker]=$!
  echo "the $marker suite (-m $marker) runs beside this run: pid ${pid[$marker]}, log $logs/$marker.log"
done

stop_side() {
  # Ctrl-C or a kill of make: each side run gets SIGINT, so its fixtures tear down its
  # cluster or node.
  for marker in "${side[@]}"; do kill -INT "${pid[$marker]}" 2>/dev/null; done
  for marker in "${side[@]}"; do wait "${pid[$marker]}" 2>/dev/null; rm -rf "${tmp[$marker]}"; done
}
trap 'stop_side; exit 130' INT TERM

"${pytest[@]}" -m "not bench and not kind and not node" --durations=25
code=$?
echo "================ main run (-m 'not bench and not kind and not node'): exit $code ================"

for marker in "${side[@]}"; do
  wait "${pid[$marker]}"
  rc=$?
  rm -rf "${tmp[$marker]}"
  echo
  echo "================ the $marker suite (-m $marker), run beside: $logs/$marker.log ================"
  cat "$logs/$marker.log"
  echo "================ the $marker suite: exit $rc ================"
  if [ "$code" -eq 0 ]; then code=$rc; fi
done
trap - INT TERM
exit "$code"
