#!/usr/bin/env bash
# Installs what the real-node test suite (tests/node, `pytest -m node`) needs, from
# Debian's packages: containerd, runc and the CNI plugins run the pods; mmdebstrap and
# buildah build the images; busybox-static is the test workload; podman (with netavark,
# aardvark-dns, conmon) runs the kind suite's nodes (tests/kind); libfaketime sets a
# controller's wall clock off in the leader envtests (tests/support/clock_skew.py).
# Pinned to the versions the suite was written against (Debian 12 "bookworm"); where
# the archive no longer has that exact version (a point release replaced it), the
# current one is installed and that is said.
#
# Only as root (the node suite is root-only and skips elsewhere); quiet and quick when
# everything is already there.
set -euo pipefail

pins=(
  containerd=1.6.20~ds1-1+deb12u3
  runc=1.1.5+ds1-1+deb12u1
  containernetworking-plugins=1.1.1+ds1-3+b5
  mmdebstrap=1.3.5-7
  buildah=1.28.2+ds1-3+deb12u1+b3
  busybox-static=1:1.35.0-4+deb12u1+b1
  podman=4.3.1+ds1-8+deb12u1+b3
  netavark=1.4.0-3
  aardvark-dns=1.4.0-3
  conmon=2.1.6+ds1-1
  libfaketime=0.9.10-2.1
)
# podman depends on "crun | runc": with runc listed first crun is not pulled in (and
# --no-install-recommends keeps it out). crun cannot run containers here ("cgroups in
# hybrid mode not supported"); hack/podman/containers.conf and hack/build-images.sh (BUILDAH_RUNTIME) pin
# runc all the same, for machines where crun is installed.

missing=()
for pin in "${pins[@]}"; do
  pkg=${pin%%=*}
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pin")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
  echo "node suite dependencies missing (${missing[*]%%=*}); not root, so not installing them: the node tests will be skipped" >&2
  exit 0
fi
if ! command -v apt-get >/dev/null; then
  echo "node suite dependencies missing (${missing[*]%%=*}) and no apt-get here: install them by hand, or the node tests will be skipped" >&2
  exit 0
fi

export DEBIAN_FRONTEND=noninteractive
echo "installing the node suite's packages: ${missing[*]}" >&2
apt_install() { apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }
if ! apt_install "${missing[@]}" 2>/dev/null; then
  apt-get update -qq >/dev/null
  if ! apt_install "${missing[@]}"; then
    echo "the pinned versions are not in the archive any more; installing the current ones:" >&2
    names=("${missing[@]%%=*}")
    apt-cache policy "${names[@]}" | grep -E '^[a-z]|Candidate' >&2
    apt_install "${names[@]}"
  fi
fi
