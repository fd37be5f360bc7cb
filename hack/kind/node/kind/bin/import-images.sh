#!/bin/bash
# Imports the images the node image carries (/kind/images/NAME.oci.tar) into containerd's
# k8s.io namespace and tags each with the names kubeadm gives them (NAME.names): the
# node image is built without a registry (hack/build-kind-node-image.sh). Once per boot,
# before the kubelet (kind-images.service).
set -euo pipefail
snapshotter=$(sed -n 's/^ *snapshotter = "\(.*\)"/\1/p' /etc/containerd/config.toml | head -n 1)
for names in /kind/images/*.names; do
  archive=${names%.names}.oci.tar
  [ -f "$archive" ] || continue
  src=$(ctr -n k8s.io images import --snapshotter="${snapshotter:-overlayfs}" "$archive" | awk '/^unpacking/ {print $2; exit}')
  while read -r name; do
    [ -n "$name" ] && ctr -n k8s.io images tag --force "$src" "$name" >/dev/null
  done <"$names"
  echo "imported $archive as $(tr '\n' ' ' <"$names")"
done
