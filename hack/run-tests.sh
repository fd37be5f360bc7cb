#!/usr/bin/env bash
# The test run of `make test`: every test but the benchmarks, in two pytest processes at
# once — the kind suite (tests/kind) in one, everything else in the other.
#
# Why two: the kind suite spends its ~5 minutes mostly waiting on its own cluster (three
# kubelets, kube-controller-manager, pods coming and going), and the rest of the suite
# spends much of its time waiting too (budget windows, the real node's kubelet); run one
# after the other, those waits add up. The kind suite was written for runs side by side
# (docs/kind.md, "Two runs at once": its own cluster, network and lock per run), and it
# shares nothing else with the other tests.
#
# With arguments (`make test PYTEST_ARGS=...`) it is one plain pytest run with them: a
# developer's selection runs as asked.
#
# Output: the main run streams; the kind run writes to $UNSTICK_TEST_LOGS/kind.log
# (default .test-logs/), printed whole once both ended. The exit code is the main run's
# if it failed, else the kind run's.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
pytest=(.venv/bin/pytest)

if [ $# -gt 0 ]; then
  exec "${pytest[@]}" "$@"
fi

logs=${UNSTICK_TEST_LOGS:-$root/.test-logs}
mkdir -p "$logs"
kind_log="$logs/kind.log"
kind_tmp=$(mktemp -d /tmp/unstick-kind-tests.XXXXXX)

# -p no:cacheprovider: the two runs must not write .pytest_cache at once; --basetemp: its
# own tmp_path root, so neither run's cleanup of old numbered dirs meets the other's.
"${pytest[@]}" -m kind -p no:cacheprovider --basetemp="$kind_tmp/t" >"$kind_log" 2>&1 &
kind_pid=$!
stop_kind() {
  # Ctrl-C or a kill of make: the kind run gets SIGINT, so its fixtures delete its cluster.
  kill -INT "$kind_pid" 2>/dev/null
  wait "$kind_pid" 2>/dev/null
  rm -rf "$kind_tmp"
}
trap 'stop_kind; exit 130' INT TERM
echo "the kind suite (tests/kind) runs beside this run, pid $kind_pid, log $kind_log"

"${pytest[@]}" -m "not bench and not kind"
main=$?

wait "$kind_pid"
kind=$?
trap - INT TERM
rm -rf "$kind_tmp"
echo
echo "================ the kind suite (tests/kind), run beside the rest: $kind_log ================"
cat "$kind_log"
echo "================ main run: exit $main; kind suite: exit $kind ================"
if [ "$main" -ne 0 ]; then exit "$main"; fi
exit "$kind"
