#!/usr/bin/env bash
# Writes sliceway's two images as docker-archive tarballs (the `docker save` format:
# `ctr -n k8s.io images import`, `docker load`, `podman load` and
# `kind load image-archive` read it), without a container engine or a registry:
#   OUT/sliceway-agent.tar        sliceway-agent:TAG, entrypoint sliceway-agent
#   OUT/sliceway-controller.tar   sliceway-controller:TAG, entrypoint sliceway-controller
# Each is two layers: a Debian root filesystem (mmdebstrap, minbase and
# ca-certificates, the same for both) and the one binary in /usr/local/bin. The layers
# are written reproducibly (sorted names, root owner, every time the epoch), so the same
# binaries on the same base give the same image digests. The base is made once per suite
# and package list under ${SLICEWAY_CACHE:-~/.cache/sliceway}/image; its package versions
# are written beside each archive (OUT/base-packages.txt).
#
# Usage: scripts/image.sh OUT TAG AGENT-BINARY CONTROLLER-BINARY
# `cargo xtask image` builds the binaries (the pinned toolchains) and runs this.
set -euo pipefail

say() { printf 'image: %s\n' "$*" >&2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

if [ $# -ne 4 ]; then
  say "usage: scripts/image.sh OUT TAG AGENT-BINARY CONTROLLER-BINARY"
  exit 2
fi
out=$1 tag=$2 agent=$3 controller=$4
for b in "$agent" "$controller"; do
  [ -x "$b" ] || { say "no executable at $b"; exit 1; }
done
if [ "$(id -u)" -ne 0 ]; then
  say "the base root filesystem is made with mmdebstrap as root: run this as root"
  exit 1
fi
ensure_debian_packages "about a minute" mmdebstrap jq tar coreutils

# The runtime base: what the binaries link against (glibc) and the certificate store;
# the suite of the machines the binaries are built on (Debian 12).
suite=bookworm
debs=ca-certificates
cache="${SLICEWAY_CACHE:-$HOME/.cache/sliceway}/image/$suite"
mkdir -p "$cache" "$out"
rootfs="$cache/rootfs"
want=$(stamp "$suite" "$debs" "$(declare -f layer_tar)")
if ! fresh "$cache/base.tar" "$cache/.base.ok" "$want"; then
  rm -rf "$rootfs" "$rootfs.tmp" "$cache/.base.ok"
  say "making the images' Debian $suite base with mmdebstrap (about a minute, from deb.debian.org)"
  start=$SECONDS
  SOURCE_DATE_EPOCH=0 mmdebstrap --quiet --mode=root --variant=minbase --include="$debs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$rootfs.tmp" >&2
  chroot "$rootfs.tmp" dpkg-query -W -f='${Package} ${Version}\n' > "$cache/packages.txt"
  rm -rf "$rootfs.tmp/var/lib/apt/lists"/* "$rootfs.tmp/var/cache/apt"/* \
    "$rootfs.tmp/var/log"/* "$rootfs.tmp/var/cache/ldconfig/aux-cache"
  layer_tar "$rootfs.tmp" "$cache/base.tar"
  rm -rf "$rootfs.tmp"
  echo "$want" > "$cache/.base.ok"
  say "made the base in $((SECONDS - start)) s ($(du -sh "$cache/base.tar" | cut -f1))"
fi
cp "$cache/packages.txt" "$out/base-packages.txt"

# image NAME BINARY: OUT/NAME.tar, the base and BINARY at /usr/local/bin/NAME.
image() {
  local name=$1 binary=$2 dir
  dir=$(mktemp -d "$out/$name.layer.XXXXXX")
  install -D -m 0755 "$binary" "$dir/root/usr/local/bin/$name"
  layer_tar "$dir/root" "$dir/layer.tar"
  docker_archive "$out/$name.tar" "$name:$tag" "[\"/usr/local/bin/$name\"]" null \
    "sliceway scripts/image.sh" "$cache/base.tar" "$dir/layer.tar"
  rm -rf "$dir"
  say "wrote $out/$name.tar ($name:$tag, $(du -h "$out/$name.tar" | cut -f1))"
}
image sliceway-agent "$agent"
image sliceway-controller "$controller"
