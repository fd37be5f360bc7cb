#!/usr/bin/env bash
# The bin directory of the envtests for another Kubernetes version: prints its path.
#
#   bash hack/envtest-bin.sh v1.32.13
#
# It is bin/ (etcd, kwok, helm, ...) with the Kubernetes binaries (kube-apiserver, kubectl,
# kube-controller-manager, kube-scheduler, kubelet, kubeadm, kube-proxy) of VERSION from the
# tools cache (hack/build-tools.sh keys it by tool and version: kubernetes-<VERSION>/), as
# symbolic links under $UNSTICK_TOOLS_CACHE/../envtest-bin/<VERSION>. The envtests use it
# through UNSTICK_BIN_DIR (devcluster.find_bin_dir); `make test-envtest KUBE_VERSION=...`
# does both. A version not in the cache is built by `make test-matrix
# MATRIX_VERSIONS=<VERSION>` (its copy's hack/build-tools.sh fills the same cache).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
version=${1:?usage: hack/envtest-bin.sh v1.MINOR.PATCH}
cache=${UNSTICK_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/tools}
kube="$cache/kubernetes-$version"
out="$cache/../envtest-bin/$version"

case $version in
  v1.*.*) ;;
  *) echo "envtest-bin: '$version' is not a Kubernetes version (v1.MINOR.PATCH)" >&2; exit 2 ;;
esac
for b in kube-apiserver kubectl kube-controller-manager; do
  if [ ! -x "$kube/$b" ]; then
    echo "envtest-bin: $kube/$b missing: build $version with" \
      "\`make test-matrix MATRIX_VERSIONS=$version\` (or hack/test-matrix.sh's steps 1-3)" >&2
    exit 1
  fi
done
[ -x "$root/bin/etcd" ] || { echo "envtest-bin: $root/bin/etcd missing: run \`make tools\`" >&2; exit 1; }

mkdir -p "$out"
for f in "$root"/bin/*; do ln -sfn "$(readlink -f "$f")" "$out/$(basename "$f")"; done
for f in "$kube"/*; do ln -sfn "$f" "$out/$(basename "$f")"; done
cd "$out" && pwd -P
