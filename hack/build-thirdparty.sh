#!/usr/bin/env bash
# Builds the upstream Kubernetes CSI programs the real-node suite deploys (docs/csi.md):
#   csi-driver-host-path v1.11.0 (the OrphanedMount incident's driver) and v1.12.0 (its fix),
#   node-driver-registrar, external-provisioner, external-attacher;
# and for the kind suite's fencing test (docs/fencing.md) medik8s' fence-agents-remediation
# (FAR) v0.7.0's manager.
# Sources: the release archives in $UNSTICK_THIRDPARTY (default: ../shared/thirdparty next to
# the checkout), each checked against the sha256 its README.md lists; where the directory is
# absent, the same tags cloned from their public repositories (commit checked against the
# README when there is one). Nothing of theirs is copied into this repository.
# Each program is built once (vendor/, no network: GOFLAGS=-mod=vendor CGO_ENABLED=0
# GOTOOLCHAIN=local) into ${UNSTICK_TOOLS_CACHE}/<name>-<version>/; a second run only checks.
# Writes bin/thirdparty.json (name -> version, binary) for hack/build-images.sh.
# What cannot be had is said in one line and left out (the reason goes to
# bin/thirdparty.json, and the tests that need it skip with it); exit 0.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cache=${UNSTICK_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/unstick/tools}
sources=${UNSTICK_THIRDPARTY:-$root/../shared/thirdparty}
index="$root/bin/thirdparty.json"
mkdir -p "$cache" "$root/bin"
export GOFLAGS="-mod=vendor -buildvcs=false" CGO_ENABLED=0 GOTOOLCHAIN=local

# name version repository package binary
programs=(
  "csi-driver-host-path v1.11.0 github.com/kubernetes-csi/csi-driver-host-path ./cmd/hostpathplugin hostpathplugin"
  "csi-driver-host-path v1.12.0 github.com/kubernetes-csi/csi-driver-host-path ./cmd/hostpathplugin hostpathplugin"
  "node-driver-registrar v2.17.0 github.com/kubernetes-csi/node-driver-registrar ./cmd/csi-node-driver-registrar csi-node-driver-registrar"
  "external-provisioner v6.3.0 github.com/kubernetes-csi/external-provisioner ./cmd/csi-provisioner csi-provisioner"
  "external-attacher v4.12.0 github.com/kubernetes-csi/external-attacher ./cmd/csi-attacher csi-attacher"
  "fence-agents-remediation v0.7.0 github.com/medik8s/fence-agents-remediation . manager"
)

say() { echo "thirdparty: $*" >&2; }
tmp=""
trap 'rm -rf "$tmp"' EXIT  # a failed build leaves no half-unpacked tree in the cache

# readme_field ARCHIVE COLUMN: a column of the README's table row for ARCHIVE (5 commit, 6 sha256)
readme_field() {
  [ -f "$sources/README.md" ] || return 0
  awk -F'|' -v a="$1" -v c="$2" '{ gsub(/ /, "", $2) } $2 == a { v = $c; gsub(/ /, "", v); print v; exit }' \
    "$sources/README.md"
}

# unpack NAME VERSION REPO DEST: the source tree at DEST, from the archive or the repository;
# prints why not (one line) and fails when neither is possible.
unpack() {
  local name=$1 version=$2 repo=$3 dest=$4 file="$name-$version.tar.gz"
  if [ -f "$sources/$file" ]; then
    local want got
    want=$(readme_field "$file" 6)
    got=$(sha256sum "$sources/$file" | cut -d' ' -f1)
    if [ -z "$want" ] || [ "$want" != "$got" ]; then
      echo "$sources/$file: sha256 $got, README.md lists '${want:-nothing}'"
      return 1
    fi
    mkdir -p "$dest"
    tar -C "$dest" --strip-components=1 -xzf "$sources/$file"
    return 0
  fi
  local err
  if ! err=$(GIT_TERMINAL_PROMPT=0 timeout 600 git clone --quiet --depth 1 --branch "$version" \
      "https://$repo" "$dest" 2>&1); then
    echo "no $file in $sources, and https://$repo at $version failed: ${err##*$'\n'}"
    return 1
  fi
  local want got
  want=$(readme_field "$file" 5)
  got=$(git -C "$dest" rev-parse HEAD)
  if [ -n "$want" ] && [ "$want" != "$got" ]; then
    echo "https://$repo $version is commit $got, README.md lists $want"
    return 1
  fi
}

built=()
missing=()
for p in "${programs[@]}"; do
  read -r name version repo pkg binary <<<"$p"
  out="$cache/$name-$version"
  if [ ! -x "$out/$binary" ]; then
    tmp=$(mktemp -d "$cache/.$name-$version.XXXXXX")
    if ! why=$(unpack "$name" "$version" "$repo" "$tmp/src"); then
      missing+=("$name $version: $why")
      rm -rf "$tmp"
      continue
    fi
    t0=$SECONDS
    say "building $binary ($name $version) into $out"
    (cd "$tmp/src" && go build -trimpath -ldflags "-s -w -X main.version=$version" -o "$tmp/$binary" "$pkg")
    mkdir -p "$out"
    mv "$tmp/$binary" "$out/$binary"
    rm -rf "$tmp"
    say "$binary $version built in $((SECONDS - t0)) s"
  fi
  built+=("$name $version $out/$binary")
done

why=""
if [ ${#missing[@]} -gt 0 ]; then
  names=$(printf '%s\n' "${missing[@]}" | cut -d: -f1 | paste -sd, - | sed 's/,/, /g')
  detail=${missing[0]#*: }
  for m in "${missing[@]}"; do  # a refused archive says more than an absent one
    case $m in *sha256*) detail=${m#*: }; break ;; esac
  done
  why="not built: $names ($detail)"
  say "$why; the tests that need them will be skipped"
fi

WHY="$why" python3 - "$index" "${built[@]}" <<'EOF'
import json, os, sys
index, rows = sys.argv[1], sys.argv[2:]
out = {}
for row in rows:
    name, version, binary = row.split(" ", 2)
    out.setdefault(name, {})[version] = binary
if os.environ["WHY"]:
    out["missing"] = os.environ["WHY"]
with open(index + ".tmp", "w") as f:
    json.dump(out, f, indent=2, sort_keys=True)
    f.write("\n")
EOF
mv "$index.tmp" "$index"
say "ready: $index (${#built[@]} of ${#programs[@]} programs)"
