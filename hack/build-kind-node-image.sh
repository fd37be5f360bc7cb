#!/usr/bin/env bash
# Builds the kind suite's node image (tests/kind) here, with no registry and no
# kindest/node image: what kind's own images/base holds, from Debian's packages and the
# binaries hack/build-tools.sh built from pinned Go modules:
#   node   Debian bookworm by mmdebstrap: systemd, containerd 1.6 + runc, the CNI
#          plugins, iptables; kind's entrypoint, units and configuration (from the kind
#          module's images/base, adapted to Debian's containerd); kubeadm, kubelet,
#          kubectl; /kind/version; /kind/manifests/default-cni.yaml (hack/kind/net.yaml)
#   kube   one image, imported into every node's containerd at boot and tagged with each
#          name kubeadm expects (kube-apiserver, kube-controller-manager, kube-scheduler,
#          kube-proxy, etcd, pause): Debian minbase + iptables/iproute2 + the binaries
#   coredns  CoreDNS (tools/coredns), when bin/coredns was built
# Cached by a hash of its inputs under ~/.cache/unstick/kind; the node image is loaded
# into podman's storage as localhost/unstick-kind-node:<key>. Prints that reference on
# stdout (the last line); says on stderr what it does.
#
# Root only (mmdebstrap, buildah mounts, podman); elsewhere it says so and exits 0
# without printing a reference (the kind suite skips there).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNSTICK_KIND_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/kind}
bin="$root/bin"
suite=bookworm
export CONTAINERS_CONF=${CONTAINERS_CONF:-$root/hack/podman/containers.conf}
export BUILDAH_RUNTIME=${BUILDAH_RUNTIME:-runc}
say() { echo "kind node image: $*" >&2; }

if [ "$(id -u)" != 0 ]; then
  say "not root, not built (the kind tests will be skipped)"
  exit 0
fi
for cmd in mmdebstrap buildah podman go; do
  if ! command -v "$cmd" >/dev/null; then
    say "$cmd missing (hack/install-node-deps.sh installs it); not built"
    exit 0
  fi
done
kind_dir=$(cd "$root/tools/kind" && GOTOOLCHAIN=local GOFLAGS=-mod=mod go list -m -f '{{.Dir}}' sigs.k8s.io/kind)
k8s=$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$root/tools/kubernetes/go.mod")
for b in kubeadm kubelet kubectl kube-apiserver kube-controller-manager kube-scheduler kube-proxy etcd; do
  [ -x "$bin/$b" ] || { say "$bin/$b missing (make tools); not built"; exit 1; }
done

mirrors=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
  [ -s "$f" ] && mirrors+=("$f")
done

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

bah() { buildah --root "$cache/storage" --runroot "$cache/storage-run" --storage-driver overlay "$@"; }
key() { sha256sum | cut -c1-16; }

# The names kubeadm gives the control plane's images (and the sandbox image).
kube_images=$("$bin/kubeadm" config images list --kubernetes-version "$k8s" 2>/dev/null | grep -v coredns)
coredns_image=$("$bin/kubeadm" config images list --kubernetes-version "$k8s" 2>/dev/null | grep coredns)
pause_image=$(grep /pause: <<<"$kube_images")

build_kube() { # ARCHIVE
  local tmp c mnt b
  tmp=$(mktemp -d)
  mmdebstrap --quiet --variant=minbase --include=iptables,iproute2,conntrack,kmod,ca-certificates \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='chroot "$1" update-alternatives --set iptables /usr/sbin/iptables-legacy' \
    --customize-hook='chroot "$1" update-alternatives --set ip6tables /usr/sbin/ip6tables-legacy' \
    "$suite" "$tmp/root.tar" "${mirrors[@]}" </dev/null
  c=$(bah from scratch)
  mnt=$(bah mount "$c")
  tar -C "$mnt" -xf "$tmp/root.tar"
  for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd; do
    cp -L "$bin/$b" "$mnt/usr/local/bin/$b"
  done
  (cd "$root/hack/images" && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
    go build -trimpath -ldflags '-s -w' -o "$mnt/pause" pause.go)
  bah umount "$c" >/dev/null
  # Entrypoint: the sandbox's pause; every other container of it names its command.
  bah config --env PATH=/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --entrypoint '["/pause"]' "$c"
  bah commit --quiet --rm "$c" localhost/unstick-kind-kube:build >/dev/null
  bah push --quiet localhost/unstick-kind-kube:build "oci-archive:$1:localhost/unstick-kind-kube:build" >/dev/null
  bah rmi localhost/unstick-kind-kube:build >/dev/null
  rm -rf "$tmp"
}

build_coredns() { # ARCHIVE
  local c mnt
  c=$(bah from scratch)
  mnt=$(bah mount "$c")
  mkdir -p "$mnt/etc/ssl/certs"
  cp -L "$bin/coredns" "$mnt/coredns"
  cp /etc/ssl/certs/ca-certificates.crt "$mnt/etc/ssl/certs/"
  bah umount "$c" >/dev/null
  bah config --entrypoint '["/coredns"]' "$c"
  bah commit --quiet --rm "$c" localhost/unstick-kind-coredns:build >/dev/null
  bah push --quiet localhost/unstick-kind-coredns:build "oci-archive:$1:localhost/unstick-kind-coredns:build" >/dev/null
  bah rmi localhost/unstick-kind-coredns:build >/dev/null
}

# The node's root: kind's base image, the Debian way.
build_node_root() { # TAR KUBE-ARCHIVE COREDNS-ARCHIVE
  local files="$kind_dir/images/base/files"
  mmdebstrap --quiet --variant=minbase \
    --include=systemd,systemd-sysv,dbus,containerd,runc,containernetworking-plugins,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,e2fsprogs,ca-certificates,procps,pigz,findutils \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook="tar -C '$files' -c . | tar -C \"\$1\" -x --no-same-owner" \
    --customize-hook='chmod 0755 "$1"/usr/local/bin/* "$1"/kind/bin/*; chmod -R go-w "$1"/etc "$1"/kind' \
    --customize-hook='rm -f "$1"/usr/local/bin/clean-install' \
    --customize-hook='ln -sf /usr/bin/containerd "$1"/usr/local/bin/containerd' \
    --customize-hook='mkdir -p "$1"/opt/cni && ln -sfn /usr/lib/cni "$1"/opt/cni/bin' \
    --customize-hook='sed -i -e "/base_runtime_spec/d" -e "s|sandbox_image = .*|sandbox_image = \"'"$pause_image"'\"|" -e "s/restrict_oom_score_adj = false/restrict_oom_score_adj = true/" "$1"/etc/containerd/config.toml' \
    --customize-hook='find "$1"/lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete' \
    --customize-hook='rm -f "$1"/lib/systemd/system/multi-user.target.wants/* "$1"/etc/systemd/system/*.wants/* "$1"/lib/systemd/system/local-fs.target.wants/* "$1"/lib/systemd/system/sockets.target.wants/*udev* "$1"/lib/systemd/system/sockets.target.wants/*initctl* "$1"/lib/systemd/system/basic.target.wants/*' \
    --customize-hook='echo ReadKMsg=no >> "$1"/etc/systemd/journald.conf' \
    --customize-hook="tar -C '$root/hack/kind/node' -c . | tar -C \"\$1\" -x --no-same-owner" \
    --customize-hook='chroot "$1" systemctl enable kubelet.service containerd.service undo-mount-hacks.service kind-images.service' \
    --customize-hook='chroot "$1" systemctl mask systemd-binfmt.service' \
    --customize-hook='mkdir -p "$1"/etc/kubernetes/manifests "$1"/kind/images "$1"/kind/manifests' \
    --customize-hook="cp -L '$bin/kubeadm' '$bin/kubelet' '$bin/kubectl' \"\$1\"/usr/bin/" \
    --customize-hook="printf %s '$k8s' > \"\$1\"/kind/version" \
    --customize-hook="cp '$2' \"\$1\"/kind/images/kube.oci.tar" \
    --customize-hook="[ -z '$3' ] || cp '$3' \"\$1\"/kind/images/coredns.oci.tar" \
    --customize-hook="printf '%s\n' $(tr '\n' ' ' <<<"$kube_images") localhost/unstick-kind-net:v1 > \"\$1\"/kind/images/kube.names" \
    --customize-hook="printf '%s\n' '$coredns_image' > \"\$1\"/kind/images/coredns.names" \
    --customize-hook="cp '$root/hack/kind/net.yaml' \"\$1\"/kind/manifests/default-cni.yaml" \
    --customize-hook='rm -f "$1"/etc/machine-id && touch "$1"/etc/machine-id' \
    "$suite" "$1" "${mirrors[@]}" </dev/null
}

hash_inputs() { # what the kube image is made of
  declare -f build_kube
  echo "$suite $kube_images"
  cat "$root/hack/images/pause.go"
  for b in kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl etcd; do
    readlink -f "$bin/$b"
  done
}
kube_key=$(hash_inputs | key)
kube_archive="$cache/kube-$kube_key.oci.tar"
if [ ! -s "$kube_archive" ]; then
  t0=$SECONDS
  say "building the control-plane image ($kube_archive)"
  build_kube "$kube_archive.tmp"
  mv "$kube_archive.tmp" "$kube_archive"
  say "control-plane image built in $((SECONDS - t0)) s"
fi

coredns_archive=""
if [ -x "$bin/coredns" ]; then
  coredns_key=$( { declare -f build_coredns; readlink -f "$bin/coredns"; sha256sum /etc/ssl/certs/ca-certificates.crt; } | key)
  coredns_archive="$cache/coredns-$coredns_key.oci.tar"
  if [ ! -s "$coredns_archive" ]; then
    say "building the CoreDNS image"
    build_coredns "$coredns_archive.tmp"
    mv "$coredns_archive.tmp" "$coredns_archive"
  fi
fi

node_key=$(
  {
    declare -f build_node_root
    echo "$suite $kind_dir $k8s $kube_key $coredns_archive $pause_image $coredns_image"
    readlink -f "$bin/kubeadm" "$bin/kubelet" "$bin/kubectl"
    cd "$root/hack/kind" && find . -type f -print0 | sort -z | xargs -0 sha256sum
  } | key
)
node_ref="localhost/unstick-kind-node:$node_key"
node_archive="$cache/node-$node_key.oci.tar"
if ! podman image exists "$node_ref"; then
  if [ ! -s "$node_archive" ]; then
    t0=$SECONDS
    say "building $node_ref with mmdebstrap"
    tmp=$(mktemp -d)
    build_node_root "$tmp/root.tar" "$kube_archive" "$coredns_archive"
    c=$(bah from scratch)
    mnt=$(bah mount "$c")
    tar -C "$mnt" -xf "$tmp/root.tar"
    bah umount "$c" >/dev/null
    # systemd learns it runs in a container from $container; it stops on SIGRTMIN+3.
    bah config --env container=docker --stop-signal 'SIGRTMIN+3' \
      --entrypoint '["/usr/local/bin/entrypoint", "/sbin/init"]' "$c"
    bah commit --quiet --rm "$c" "$node_ref" >/dev/null
    bah push --quiet "$node_ref" "oci-archive:$node_archive.tmp:$node_ref" >/dev/null
    bah rmi "$node_ref" >/dev/null
    mv "$node_archive.tmp" "$node_archive"
    rm -rf "$tmp"
    say "built in $((SECONDS - t0)) s"
  fi
  say "loading $node_ref into podman"
  podman load --quiet -i "$node_archive" >/dev/null
fi
# Older archives: the newest 2 of each stay; older node images leave podman's storage.
for name in kube coredns node; do
  { ls -t "$cache/$name"-*.oci.tar 2>/dev/null || true; } | tail -n +3 | xargs -r rm -f
done
podman images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/unstick-kind-node:' \
  | grep -v ":$node_key$" | xargs -r podman rmi >/dev/null 2>&1 || true
echo "$node_ref"
