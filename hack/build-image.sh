#!/usr/bin/env bash
# `make image`: the release image of unstick, from the Dockerfile, with buildah and no
# registry, as an OCI archive of an image index (one image per architecture):
#   dist/unstick-<version>.oci.tar   tagged $IMAGE:<version> (default ghcr.io/unstick-dev/unstick)
# The release workflow pushes that archive as it is (skopeo copy --all).
#
# ARCHES       architectures, e.g. "amd64 arm64" (default: this machine's). Another one is
#              built only where this machine can run its binaries (a binfmt_misc handler,
#              e.g. QEMU set up by the release workflow); otherwise it is skipped with a
#              message, or, with REQUIRE_ALL_ARCHES=1, the build fails.
# IMAGE_BASE   the Python base (the Dockerfile's BASE), e.g. python:3.11-slim where a
#              registry is reachable (the release workflow). Default: the Python base made
#              from Debian's packages by hack/build-images.sh --base (this machine's
#              architecture only; root, mmdebstrap).
# The archive is cached under ~/.cache/unstick/images keyed by its inputs (Dockerfile,
# .dockerignore, pyproject.toml, README.md, operator/, the base, the architectures, this
# script): a second run with nothing changed only copies it. Root only (buildah).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNSTICK_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/images}
dist=${DIST:-$root/dist}
image=${IMAGE:-ghcr.io/unstick-dev/unstick}
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -1)
pip_ca=${PIP_CA:-/etc/ssl/certs/ca-certificates.crt}
say() { echo "make image: $*" >&2; }

if [ "$(id -u)" != 0 ] || ! command -v buildah >/dev/null; then
  say "needs root and buildah (hack/install-node-deps.sh installs it)"
  exit 2
fi
case $(uname -m) in
  x86_64) host=amd64 ;;
  aarch64) host=arm64 ;;
  *) host=$(uname -m) ;;
esac
arches=${ARCHES:-$host}
base=${IMAGE_BASE:-}
if [ -z "$base" ]; then
  base=$(bash "$root/hack/build-images.sh" --base) || { say "no Python base (hack/build-images.sh --base failed)"; exit 1; }
fi

# Can this machine run ARCH's binaries (the Dockerfile's RUN steps)?
qemu_name() { case $1 in amd64) echo x86_64 ;; arm64) echo aarch64 ;; *) echo "$1" ;; esac; }
runnable() {
  [ "$1" = "$host" ] && return 0
  [ -n "${IMAGE_BASE:-}" ] || return 1  # the Debian-made base is this machine's arch only
  grep -qs '^enabled' "/proc/sys/fs/binfmt_misc/qemu-$(qemu_name "$1")"
}
build=()
for arch in $arches; do
  if runnable "$arch"; then
    build+=("$arch")
  elif [ "${REQUIRE_ALL_ARCHES:-0}" = 1 ]; then
    say "cannot build linux/$arch here (no binfmt_misc handler for it, or no IMAGE_BASE); REQUIRE_ALL_ARCHES=1"
    exit 1
  else
    say "skipping linux/$arch: this machine cannot run its binaries (no binfmt_misc/QEMU handler) or has no base for it (set IMAGE_BASE)"
  fi
done
[ ${#build[@]} -gt 0 ] || { say "nothing to build"; exit 1; }

mkdir -p "$cache" "$dist"
key=$(
  cd "$root"
  {
    cat "$0"; echo "$base ${build[*]} $image $version"
    find Dockerfile .dockerignore pyproject.toml README.md operator -type f \
      ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 \
      | sort -z | xargs -0 sha256sum
  } | sha256sum | cut -c1-16
)
cached="$cache/release-$version-$key.oci.tar"
target="$dist/unstick-$version.oci.tar"

if [ ! -s "$cached" ]; then
  export BUILDAH_RUNTIME=${BUILDAH_RUNTIME:-runc}
  bah() { buildah --root "$cache/storage" --runroot "$cache/storage-run" --storage-driver overlay "$@"; }
  exec 9>"$cache/.lock"
  flock 9
  list="localhost/unstick-release:$version-$key"
  bah manifest rm "$list" >/dev/null 2>&1 || true
  bah manifest create "$list" >/dev/null
  secret=()
  [ -f "$pip_ca" ] && secret=(--secret "id=pip-ca,src=$pip_ca")
  t0=$SECONDS
  for arch in "${build[@]}"; do
    say "building linux/$arch on $base"
    bah bud --quiet --network host --layers=false --platform "linux/$arch" \
      --build-arg "BASE=$base" "${secret[@]}" --manifest "$list" \
      --label "org.opencontainers.image.title=unstick" \
      --label "org.opencontainers.image.version=$version" \
      --label "org.opencontainers.image.licenses=Apache-2.0" \
      --label "org.opencontainers.image.source=https://github.com/unstick-dev/unstick" \
      -f "$root/Dockerfile" "$root" >/dev/null
  done
  bah manifest push --quiet --all "$list" "oci-archive:$cached.tmp:$image:$version" >/dev/null
  mv "$cached.tmp" "$cached"
  # the list and its images: only the archive is kept
  for digest in $(bah manifest inspect "$list" | python3 -c 'import json,sys; [print(m["digest"]) for m in json.load(sys.stdin)["manifests"]]'); do
    bah rmi "$digest" >/dev/null 2>&1 || true
  done
  bah manifest rm "$list" >/dev/null 2>&1 || true
  ls -t "$cache"/release-*.oci.tar | tail -n +4 | xargs -r rm -f
  say "built ${build[*]} in $((SECONDS - t0)) s"
fi
cp "$cached" "$target.tmp" && mv "$target.tmp" "$target"
say "$target ($image:$version; linux/${build[*]})"
echo "$target"
