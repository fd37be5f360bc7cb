#!/usr/bin/env bash
# Builds the control-plane binaries (the real-node suite's kubelet, the kind suite's kind,
# kubeadm and kube-proxy) unstick is tested against from pinned Go modules
# (there is no release download here) into a cache keyed by tool and version, and
# links them into bin/. A second run finds everything cached and only relinks.
#
# KUBEBUILDER_ASSETS: if set and it holds etcd, kube-apiserver and kubectl, those are
# linked instead of building them (the envtest convention).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNSTICK_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/tools}
bin="$root/bin"
mkdir -p "$bin" "$cache"
export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

# version of a module as pinned in tools/<dir>/go.mod
pinned() { awk -v m="$2" '$1==m && $2 ~ /^v/ {print $2; exit} $1=="require" && $2==m {print $3; exit}' "$root/tools/$1/go.mod"; }

link() { ln -sf "$1" "$bin/$(basename "$1")"; }

# build DIR OUTDIR NAME=PKG... [-- LDFLAGS]
build() {
  local dir=$1 out=$2; shift 2
  local ldflags=""
  local pkgs=()
  while [ $# -gt 0 ]; do
    if [ "$1" = "--" ]; then shift; ldflags="$*"; break; fi
    pkgs+=("$1"); shift
  done
  local missing=0 p
  for p in "${pkgs[@]}"; do [ -x "$out/${p%%=*}" ] || missing=1; done
  if [ $missing = 1 ]; then
    mkdir -p "$out.tmp"
    for p in "${pkgs[@]}"; do
      [ -x "$out/${p%%=*}" ] && continue  # only what is missing (e.g. a newly added tool)
      echo "building ${p%%=*} (${p#*=}) into $out" >&2
      (cd "$root/tools/$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$out.tmp/${p%%=*}" "${p#*=}")
    done
    mkdir -p "$out"
    mv "$out.tmp"/* "$out"/ && rmdir "$out.tmp"
  fi
  for p in "${pkgs[@]}"; do link "$out/${p%%=*}"; done
}

k8s=$(pinned kubernetes k8s.io/kubernetes)
if [ -n "${KUBEBUILDER_ASSETS:-}" ] && [ -x "$KUBEBUILDER_ASSETS/kube-apiserver" ] && [ -x "$KUBEBUILDER_ASSETS/etcd" ] && [ -x "$KUBEBUILDER_ASSETS/kubectl" ]; then
  echo "using etcd, kube-apiserver, kubectl from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS" >&2
  for b in etcd kube-apiserver kubectl; do link "$KUBEBUILDER_ASSETS/$b"; done
  build kubernetes "$cache/kubernetes-$k8s" kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubelet=k8s.io/kubernetes/cmd/kubelet \
    kubeadm=k8s.io/kubernetes/cmd/kubeadm kube-proxy=k8s.io/kubernetes/cmd/kube-proxy -- "$(
    minor=${k8s#v1.}; minor=${minor%%.*}
    for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      printf -- '-X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s -X %s.gitTreeState=clean -X %s.buildDate=1970-01-01T00:00:00Z ' "$p" "$k8s" "$p" "$p" "$minor" "$p" "$p"
    done)"
else
  minor=${k8s#v1.}; minor=${minor%%.*}
  kflags=""
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kflags+="-X $p.gitVersion=$k8s -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z "
  done
  build kubernetes "$cache/kubernetes-$k8s" \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kubectl=k8s.io/kubernetes/cmd/kubectl \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
    kubelet=k8s.io/kubernetes/cmd/kubelet \
    kubeadm=k8s.io/kubernetes/cmd/kubeadm \
    kube-proxy=k8s.io/kubernetes/cmd/kube-proxy -- "$kflags"
  etcd=$(pinned etcd go.etcd.io/etcd/server/v3)
  build etcd "$cache/etcd-$etcd" etcd=go.etcd.io/etcd/server/v3
fi

kwok=$(pinned kwok sigs.k8s.io/kwok)
build kwok "$cache/kwok-$kwok" kwok=sigs.k8s.io/kwok/cmd/kwok
helm=$(pinned helm helm.sh/helm/v3)
# As helm's own Makefile: the Kubernetes version `helm template` and `helm lint` assume
# (without a cluster) is that of its client-go, not the source's fallback v1.20.0, which
# the chart's kubeVersion (>=1.30) refuses.
helmk8s=$(pinned helm k8s.io/client-go); helmk8s=${helmk8s#v0.}; helmk8s=${helmk8s%%.*}
build helm "$cache/helm-$helm-k8s1.$helmk8s" helm=helm.sh/helm/v3/cmd/helm -- \
  "-X helm.sh/helm/v3/internal/version.version=$helm $(
  for p in chartutil lint/rules; do
    printf -- '-X helm.sh/helm/v3/pkg/%s.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/%s.k8sVersionMinor=%s ' "$p" "$p" "$helmk8s"
  done)"
promtool=$(pinned promtool github.com/prometheus/prometheus)
# remove_all_sd: without the cloud service discoveries (only rule files are checked): half the build
GOFLAGS="$GOFLAGS -tags=remove_all_sd" build promtool "$cache/promtool-$promtool-nosd" promtool=github.com/prometheus/prometheus/cmd/promtool
# The Prometheus server of tests/prometheus, same module and version as promtool (own go.mod:
# cmd/prometheus needs more of the module's dependencies than promtool)
prometheus=$(pinned prometheus github.com/prometheus/prometheus)
GOFLAGS="$GOFLAGS -tags=remove_all_sd" build prometheus "$cache/prometheus-$prometheus-nosd" prometheus=github.com/prometheus/prometheus/cmd/prometheus
# csi-sanity, the CSI spec's conformance suite, run against the project's CSI plugin (tests/csi)
csitest=$(pinned csi-test github.com/kubernetes-csi/csi-test/v5)
build csi-test "$cache/csi-test-$csitest" csi-sanity=github.com/kubernetes-csi/csi-test/v5/cmd/csi-sanity
# kind, for the multi-node suite (tests/kind) on podman; kubeadm and kube-proxy above go
# into its node image (hack/build-kind-node-image.sh)
kind=$(pinned kind sigs.k8s.io/kind)
build kind "$cache/kind-$kind" kind=sigs.k8s.io/kind
# CoreDNS, at the version kubeadm deploys, for the same node image
coredns=$(pinned coredns github.com/coredns/coredns)
build coredns "$cache/coredns-$coredns" coredns=github.com/coredns/coredns
# actionlint, run by `make lint` on .github/workflows/*.yml
actionlint=$(pinned actionlint github.com/rhysd/actionlint)
build actionlint "$cache/actionlint-$actionlint" actionlint=github.com/rhysd/actionlint/cmd/actionlint -- \
  "-X github.com/rhysd/actionlint.version=$actionlint"
# podman-ccm, the kind suite's cloud controller manager: upstream k8s.io/cloud-provider with
# a test-only provider for kind's podman machines (tests/machines/kind/podmanccm, docs/kind.md);
# keyed by the module's version and a hash of the provider's source
ccmdir=tests/machines/kind/podmanccm
ccm=$(awk '$1=="require" && $2=="k8s.io/cloud-provider" {print $3; exit} $1=="k8s.io/cloud-provider" && $2 ~ /^v/ {print $2; exit}' "$root/$ccmdir/go.mod")
ccmflags="-X k8s.io/component-base/version.gitVersion=v1.${ccm#v0.}"  # (the Kubernetes release of these staging modules)
ccmsum=$( (cd "$root/$ccmdir" && cat go.mod go.sum ./*.go && echo "$ccmflags") | sha256sum | cut -c1-12)
build "../$ccmdir" "$cache/podman-ccm-$ccm-$ccmsum" podman-ccm=. -- "$ccmflags"
echo "tools ready in $bin" >&2
