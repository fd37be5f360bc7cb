#!/usr/bin/env bash
# Builds the images the real-node suite (tests/node) runs, with no registry, into OCI
# archives that `ctr -n k8s.io images import` takes:
#   unstick   the project's Dockerfile, built by buildah on...
#   base      ...a Python 3.11 base made from Debian's packages by mmdebstrap
#             (--build-arg BASE=...; the Dockerfile's default stays python:3.11-slim)
#   pause     the pods' sandbox image: a static Go program (hack/images/pause.go)
#   busybox   the test workload: Debian's static busybox
#   csi-*, far  the upstream programs hack/build-thirdparty.sh built (below)
# Each is cached under ~/.cache/unstick/images, keyed by a hash of its inputs (for
# unstick: the base, Dockerfile, .dockerignore, pyproject.toml, README.md, operator/;
# for every image: the shell function that builds it), so a second run only checks.
# Writes bin/node-images.json (name -> image reference and archive) for the harness.
# With --base: only the Python base, its reference on standard output (hack/build-image.sh,
# `make image`, builds the release image on it).
#
# Root only (buildah mounts, mmdebstrap): elsewhere it says so and exits 0 (the node
# suite skips there). PIP_CA (default: the machine's CA bundle) is passed to the build
# as the secret `pip-ca`, so pip trusts the package index behind a proxy.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNSTICK_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/images}
index="$root/bin/node-images.json"
pip_ca=${PIP_CA:-/etc/ssl/certs/ca-certificates.crt}
suite=bookworm
# The machine's own apt sources (its mirror, proxy, snapshot), when it has them.
mirrors=()
for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.sources /etc/apt/sources.list.d/*.list; do
  [ -s "$f" ] && mirrors+=("$f")
done

if [ "$(id -u)" != 0 ]; then
  echo "images for the node suite: not root, not built (the node tests will be skipped)" >&2
  [ "${1:-}" = --base ] && exit 1
  exit 0
fi
for cmd in mmdebstrap buildah busybox go; do
  if ! command -v "$cmd" >/dev/null; then
    echo "images for the node suite: $cmd missing (hack/install-node-deps.sh installs it); not built" >&2
    [ "${1:-}" = --base ] && exit 1
    exit 0
  fi
done

mkdir -p "$cache" "$root/bin"
exec 9>"$cache/.lock"
flock 9

# runc, not crun (podman pulls crun in; it fails here): buildah's RUN steps use this
export BUILDAH_RUNTIME=${BUILDAH_RUNTIME:-runc}
bah() { buildah --root "$cache/storage" --runroot "$cache/storage-run" --storage-driver overlay "$@"; }
key() { sha256sum | cut -c1-16; }
say() { echo "images: $*" >&2; }

# New working container from scratch, its root mounted; prints "ctr mnt".
scratch() {
  local c
  c=$(bah from scratch)
  echo "$c $(bah mount "$c")"
}

build_base() { # REF
  local tmp c mnt
  tmp=$(mktemp -d)
  # minbase: Essential packages (util-linux: nsenter) + python3 and pip; Debian marks
  # its Python externally managed: the image is the environment, so drop the marker.
  mmdebstrap --quiet --variant=minbase --include=python3,python3-pip \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    --customize-hook='ln -sf python3 "$1"/usr/bin/python' \
    "$suite" "$tmp/root.tar" "${mirrors[@]}" </dev/null
  read -r c mnt < <(scratch)
  tar -C "$mnt" -xf "$tmp/root.tar"
  bah umount "$c" >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --cmd python3 "$c"
  bah commit --quiet --rm "$c" "$1" >/dev/null
  rm -rf "$tmp"
}

build_unstick() { # REF BASE
  local secret=()
  [ -f "$pip_ca" ] && secret=(--secret "id=pip-ca,src=$pip_ca")
  bah bud --quiet --network host --layers=false --build-arg "BASE=$2" "${secret[@]}" \
    -t "$1" -f "$root/Dockerfile" "$root" >/dev/null
}

build_pause() { # REF
  local c mnt
  read -r c mnt < <(scratch)
  (cd "$root/hack/images" && GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0 \
    go build -trimpath -ldflags '-s -w' -o "$mnt/pause" pause.go)
  bah umount "$c" >/dev/null
  bah config --entrypoint '["/pause"]' --user 65535:65535 "$c"
  bah commit --quiet --rm "$c" "$1" >/dev/null
}

build_busybox() { # REF
  local c mnt applet
  read -r c mnt < <(scratch)
  mkdir -p "$mnt/bin" "$mnt/tmp"
  cp /bin/busybox "$mnt/bin/busybox"
  for applet in $(/bin/busybox --list); do
    [ "$applet" = busybox ] || ln -s busybox "$mnt/bin/$applet"
  done
  bah umount "$c" >/dev/null
  bah config --env PATH=/bin --cmd sh "$c"
  bah commit --quiet --rm "$c" "$1" >/dev/null
}

# The upstream CSI programs hack/build-thirdparty.sh built (docs/csi.md), on the base:
# the hostpath plugin needs its mount/findmnt (util-linux).
build_csi() { # REF BASE BINARY...
  local ref=$1 c
  c=$(bah from --pull=never "$2")
  shift 2
  for b in "$@"; do bah copy --quiet "$c" "$b" /usr/local/bin/ >/dev/null; done
  bah commit --quiet --rm "$c" "$ref" >/dev/null
}

# medik8s FAR's manager (hack/build-thirdparty.sh) with Debian's fence-agents (fence_docker
# and its python3, pycurl), for the kind suite's fencing test (docs/fencing.md). Its own
# mmdebstrap root: fence-agents pulls in what its other agents need (boto3, ...). FAR runs
# the agent as a child process of its manager, so both are in one image; non-root, as FAR's
# Deployment asks (runAsNonRoot).
build_far() { # REF MANAGER
  local tmp c mnt
  tmp=$(mktemp -d)
  mmdebstrap --quiet --variant=minbase --include=fence-agents \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$tmp/root.tar" "${mirrors[@]}" </dev/null
  read -r c mnt < <(scratch)
  tar -C "$mnt" -xf "$tmp/root.tar"
  install -m 0755 "$2" "$mnt/manager"
  bah umount "$c" >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    --env LANG=C.UTF-8 --user 65532:65532 --entrypoint '["/manager"]' "$c"
  bah commit --quiet --rm "$c" "$1" >/dev/null
  rm -rf "$tmp"
}

# archive NAME KEY BUILD-FUNCTION [ARGS...]: the cached archive of an image, built and
# pushed only when missing; of older archives of the same name the newest 3 stay.
declare -A refs archives
archive() {
  local name=$1 k=$2 fn=$3; shift 3
  local ref="localhost/unstick-node-$name:$k" file="$cache/$name-$k.oci.tar"
  [ "$name" = unstick ] && ref="localhost/unstick:$k"
  if [ ! -s "$file" ]; then
    local t0=$SECONDS
    say "building $name ($ref)"
    bah rmi "$ref" >/dev/null 2>&1 || true
    "$fn" "$ref" "$@"
    bah push --quiet "$ref" "oci-archive:$file.tmp:$ref" >/dev/null
    mv "$file.tmp" "$file"
    bah rmi "$ref" >/dev/null 2>&1 || true
    # Older archives of the name: the newest few stay, as another checkout sharing this
    # cache (or a test session started before this build) may still name one in its index.
    ls -t "$cache/$name"-*.oci.tar | tail -n +4 | xargs -r rm -f
    say "$name built in $((SECONDS - t0)) s"
  fi
  refs[$name]=$ref
  archives[$name]=$file
}

# The base stays in buildah's storage (the unstick build starts FROM it) rather than
# in an archive.
base_key=$( { declare -f build_base; echo "$suite"; } | key)
base_ref="localhost/unstick-node-python-base:$base_key"
if ! bah inspect --type image "$base_ref" >/dev/null 2>&1; then
  t0=$SECONDS
  say "building the Python base ($base_ref) with mmdebstrap"
  build_base "$base_ref"
  say "base built in $((SECONDS - t0)) s"
fi

if [ "${1:-}" = --base ]; then
  echo "$base_ref"
  exit 0
fi

unstick_key=$(
  cd "$root"
  {
    declare -f build_unstick
    echo "$base_key"
    find Dockerfile .dockerignore pyproject.toml README.md operator -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | sort -z | xargs -0 sha256sum
  } | key
)
archive unstick "$unstick_key" build_unstick "$base_ref"
archive pause "$( { declare -f build_pause; cat "$root/hack/images/pause.go"; go version; } | key)" build_pause
archive busybox "$( { declare -f build_busybox; sha256sum /bin/busybox; } | key)" build_busybox

# csi-hostpath-<version> (one per built version) and csi-sidecars (node-driver-registrar,
# external-provisioner, external-attacher), and far (FAR's manager + fence-agents), when
# hack/build-thirdparty.sh built them.
csi_built() { python3 -c 'import json,sys; [print(n, v, b) for n, vs in json.load(open(sys.argv[1])).items() if isinstance(vs, dict) for v, b in vs.items()]' "$root/bin/thirdparty.json" 2>/dev/null || true; }
sidecars=()
while read -r name version binary <&3; do
  case $name in
    csi-driver-host-path) archive "csi-hostpath-$version" "$( { declare -f build_csi; echo "$base_key"; sha256sum "$binary"; } | key)" build_csi "$base_ref" "$binary" ;;
    fence-agents-remediation) archive far "$( { declare -f build_far; echo "$suite"; sha256sum "$binary"; } | key)" build_far "$binary" ;;
    *) sidecars+=("$binary") ;;
  esac
done 3< <(csi_built)
if [ ${#sidecars[@]} = 3 ]; then
  archive csi-sidecars "$( { declare -f build_csi; echo "$base_key"; sha256sum "${sidecars[@]}"; } | key)" build_csi "$base_ref" "${sidecars[@]}"
fi

# Other bases left in the storage by earlier versions of this script.
for old in $(bah images --format '{{.Name}}:{{.Tag}}' 2>/dev/null); do
  case $old in
    "$base_ref") ;;
    localhost/unstick-node-python-base:*) bah rmi "$old" >/dev/null 2>&1 || true ;;
  esac
done

for name in "${!refs[@]}"; do echo "$name ${refs[$name]} ${archives[$name]}"; done | python3 -c '
import json, sys
images = {}
for line in sorted(sys.stdin):
    name, ref, archive = line.split()
    images[name] = {"ref": ref, "archive": archive}
with open(sys.argv[1] + ".tmp", "w") as f:
    json.dump(images, f, indent=2)
    f.write("\n")
' "$index"
mv "$index.tmp" "$index"
say "ready: $index"
