#!/usr/bin/env bash
# make test-matrix: the kind suite (tests/machines/kind, marker `kind`) once per Kubernetes
# version. Run here once on 2026-11-28 (docs/compatibility.md, "The version matrix"): the
# three versions passed, 463-548 s each with binaries and node images cached.
# Not part of `make test` (its time); meant for a scheduled CI job.
#
# For each version (MATRIX_VERSIONS, default the newest patches of 1.32, 1.35 and 1.37 on the
# Go module proxy when this was written):
#   1. a copy of this commit (git archive HEAD) under $UNSTICK_MATRIX_DIR/<version>/src;
#   2. its tools/kubernetes/go.mod requiring k8s.io/kubernetes at that version, the staging
#      modules replaced as that version's own go.mod names them (k8s.io/X => k8s.io/X
#      v0.<minor>.<patch>), `go mod tidy` through the Go module proxy; cached per version;
#   3. its bin/ from hack/build-tools.sh and hack/build-thirdparty.sh (the tools cache is keyed by tool and version: a
#      second run only relinks) and bin/node-images.json from hack/build-images.sh;
#   4. the kind suite, whose node image hack/build-kind-node-image.sh builds from that
#      version's kubeadm/kubelet (cached by its inputs).
# One line per version on stdout (and in $UNSTICK_MATRIX_DIR/results.txt): version, result,
# wall time. Exit 1 if any version failed. Root only (as the kind suite).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
versions=${MATRIX_VERSIONS:-v1.32.13 v1.35.4 v1.37.2}
work=${UNSTICK_MATRIX_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/matrix}
export GOTOOLCHAIN=local GOFLAGS=-mod=mod
# the vendored release sources (CSI driver, sidecars, medik8s) beside this repository, not
# beside the copy (hack/build-thirdparty.sh, the tests that read them)
export UNSTICK_THIRDPARTY=${UNSTICK_THIRDPARTY:-$root/../shared/thirdparty}
say() { echo "test-matrix: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "not root: the kind suite needs root (docs/kind.md)"
  exit 1
fi

# The version of staging module MOD to use for STAGING (v0.<minor>.<patch>): STAGING itself if
# the module proxy serves it, else the newest patch of the same minor it serves below it
# (the proxy here refuses some, e.g. k8s.io/endpointslice v0.32.13 — 403 — while it serves
# k8s.io/kubernetes v1.32.13 and k8s.io/endpointslice v0.32.12). Said on stderr, and kept in
# the version's results line, so a result never hides which modules it was built from.
served() { # MOD STAGING
  local m=$1 s=$2 minor best
  if go mod download "$m@$s" >/dev/null 2>&1; then echo "$s"; return; fi
  minor=${s%.*}
  best=$(go list -m -versions "$m" | tr ' ' '\n' | grep "^$minor\." | sort -t. -k3,3n |
    awk -F. -v p="${s##*.}" '$3 < p' | tail -1)
  if [ -z "$best" ]; then # not served at all (the sample-* modules): harmless unless built from
    say "$m $s is not served and no earlier $minor patch is: left at $s"
    echo "$s"
    return
  fi
  say "$m $s is not served: using $best"
  echo "$m $best" >>"$work/substitutes-$s.txt"
  echo "$best"
}

# The go.mod of tools/kubernetes for VERSION, into DIR (cached: DIR/go.mod, DIR/go.sum).
pin() { # VERSION DIR
  local v=$1 dir=$2 staging gomod
  if [ -s "$dir/go.mod" ] && [ -s "$dir/go.sum" ]; then return; fi
  staging="v0.${v#v1.}"
  gomod=$(go list -m -f '{{.GoMod}}' "k8s.io/kubernetes@$v")
  mkdir -p "$dir.tmp"
  {
    echo "module unstick.dev/tools/kubernetes"
    echo
    awk '$1=="go" {print; exit}' "$root/tools/kubernetes/go.mod"
    echo
    echo "require k8s.io/kubernetes $v"
    echo
    echo "replace ("
    for m in $(awk '$2=="=>" && $3 ~ /^\.\/staging\// {print $1}' "$gomod"); do
      echo "	$m => $m $(served "$m" "$staging")"
    done
    echo ")"
  } >"$dir.tmp/go.mod"
  cp "$root/tools/kubernetes/tools.go" "$dir.tmp/"
  (cd "$dir.tmp" && go mod tidy)
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}

mkdir -p "$work"
: >"$work/results.txt"
failed=0
for v in $versions; do
  start=$(date +%s)
  vdir="$work/$v"
  src="$vdir/src"
  say "$v: copy of $(git -C "$root" rev-parse --short HEAD) into $src"
  rm -rf "$src" && mkdir -p "$src"
  git -C "$root" archive HEAD | tar -x -C "$src"
  pin "$v" "$vdir/kubernetes-mod"
  cp "$vdir/kubernetes-mod/go.mod" "$vdir/kubernetes-mod/go.sum" "$src/tools/kubernetes/"
  result=passed
  (
    cd "$src"
    bash hack/build-tools.sh
    bash hack/build-thirdparty.sh
    bash hack/build-images.sh
    PATH="$src/bin:$root/.venv/bin:$PATH" PYTHONPATH="$src/operator:$src" \
      "$root/.venv/bin/pytest" -p no:cacheprovider -m kind tests/machines/kind
  ) || result=failed
  [ "$result" = passed ] || failed=1
  line="$v $result $(($(date +%s) - start))s"
  subs="$work/substitutes-v0.${v#v1.}.txt"
  if [ -s "$subs" ]; then line="$line (staging modules the proxy refused, built at: $(sort -u "$subs" | paste -sd, -))"; fi
  echo "$line" | tee -a "$work/results.txt"
done
exit $failed
