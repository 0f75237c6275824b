#!/usr/bin/env bash
# Builds the kit of a real node of the cluster lab, once per version, into
#   ${SLICEWAY_CACHE:-~/.cache/sliceway}/node/<kubernetes version>/bin     the commands
#   ${SLICEWAY_CACHE:-~/.cache/sliceway}/node/<kubernetes version>/images  the image archives
# Commands, from the Go module proxy with the ordinary `go` client, each pinned by the
# go.mod and go.sum of its own directory under upstream/node/ (so the control-plane build
# of scripts/upstream.sh and its cache stay as they are):
#   kubelet, kube-proxy, agnhost, e2e.test,       upstream/node/kubernetes (the same
#   ginkgo (the command that runs e2e.test)        k8s.io/kubernetes as upstream/go.mod)
#   containerd, containerd-shim-runc-v2, ctr       upstream/node/containerd
#   runc (with seccomp)                            upstream/node/runc
#   crictl                                         upstream/node/cri-tools
#   ptp, host-local, portmap, loopback (CNI)       upstream/node/cni-plugins
#   coredns                                        upstream/node/coredns
#   pause                                          build/pause/linux/pause.c of k8s.io/kubernetes
# Images, without any registry or engine: a Debian root filesystem (mmdebstrap) plus the
# commands above, written as single-layer docker-archive tarballs (the `docker save`
# format) under the names the e2e suite of the pinned Kubernetes asks for
# (test/utils/image/manifest.go); images/names.txt maps each archive to its name.
# Idempotent: every product carries a stamp of what it was made from, and a second run
# builds nothing. Prints the bin directory on stdout; progress goes to stderr.
#
# Usage: scripts/node-kit.sh [--e2e]
#
# The go.sum files pin every module, so a build never asks the checksum database. They
# were written with `GOFLAGS=-mod=mod GOSUMDB=off go mod tidy` in each directory because
# sum.golang.org could not be reached from the machine that pinned them (the module proxy
# could); the hashes are the proxy's. To re-pin where the checksum database is reachable,
# run `go mod tidy` there without those variables.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
node="$root/upstream/node"
say() { printf 'node-kit: %s\n' "$*" >&2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

e2e=0
for arg in "$@"; do
  case "$arg" in
    --e2e) e2e=1 ;;
    *) say "unknown argument $arg (usage: scripts/node-kit.sh [--e2e])"; exit 2 ;;
  esac
done

# modver DIR MODULE: the version DIR's go.mod requires of MODULE.
modver() {
  sed -n "s#^[[:space:]]*\(require \)\{0,1\}$2 \(v[0-9][0-9A-Za-z.+-]*\)\( // indirect\)\{0,1\}\$#\2#p" "$node/$1/go.mod" | head -n 1
}
version=$(modver kubernetes k8s.io/kubernetes)
containerd_version=$(modver containerd github.com/containerd/containerd/v2)
runc_version=$(modver runc github.com/opencontainers/runc)
crictl_version=$(modver cri-tools sigs.k8s.io/cri-tools)
cni_version=$(modver cni-plugins github.com/containernetworking/plugins)
coredns_version=$(modver coredns github.com/coredns/coredns)
for v in version containerd_version runc_version crictl_version cni_version coredns_version; do
  if [ -z "${!v}" ]; then
    say "cannot read the ${v%_version} version from the go.mod files under $node"
    exit 1
  fi
done
if [ "$version" != "$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$root/upstream/go.mod" | head -n 1)" ]; then
  say "upstream/node/kubernetes pins k8s.io/kubernetes $version but upstream/go.mod another version; pin the same one in both"
  exit 1
fi

# --- Debian packages -------------------------------------------------------------
# gcc and libc6-dev for pause (static) and runc (cgo); libseccomp-dev and pkg-config
# for runc's seccomp; mmdebstrap for the images' root filesystem; jq writes their JSON.
APT_PACKAGES=(gcc libc6-dev pkg-config libseccomp-dev mmdebstrap jq tar coreutils)
ensure_debian_packages "about a minute" "${APT_PACKAGES[@]}"

# --- Go ---------------------------------------------------------------------------
need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$node"/*/go.mod | sort -V | tail -n 1)
ensure_go "$need_go" "the node kit" "the go lines under upstream/node"
export GOFLAGS="-mod=readonly -buildvcs=false"
# Never let a build fetch another toolchain: the check above already said what is needed.
export GOTOOLCHAIN=local

cache="${SLICEWAY_CACHE:-$HOME/.cache/sliceway}/node/$version"
bin="$cache/bin"
images="$cache/images"
mkdir -p "$bin" "$images" "$cache/layers"

modstamp() { cat "$node/$1/go.mod" "$node/$1/go.sum" | sha256sum | cut -d' ' -f1; }

downloaded=""
download() { # DIR: fetch DIR's modules once (go.sum pins each)
  case " $downloaded " in *" $1 "*) return ;; esac
  say "downloading the modules of upstream/node/$1 (go.sum pins each)"
  (cd "$node/$1" && go mod download >/dev/null)
  downloaded="$downloaded $1"
}

# build NAME DIR PACKAGE MINUTES CGO TAGS LDFLAGS [test]
build() {
  local name=$1 dir=$2 pkg=$3 minutes=$4 cgo=$5 tags=$6 ldflags=$7 kind=${8:-build}
  local want
  want=$(stamp "$(modstamp "$dir")" "$pkg" "$cgo" "$tags" "$ldflags" "$kind" "$have_go")
  if fresh "$bin/$name" "$bin/.$name.ok" "$want"; then
    return
  fi
  download "$dir"
  say "building $name from $pkg (about $minutes min on 2 cores when Go's build cache is cold)"
  local start=$SECONDS
  rm -f "$bin/.$name.ok"
  if [ "$kind" = test ]; then
    (cd "$node/$dir" && CGO_ENABLED=$cgo nice -n 19 go test -c -trimpath -vet=off -tags "$tags" -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
  else
    (cd "$node/$dir" && CGO_ENABLED=$cgo nice -n 19 go build -trimpath -tags "$tags" -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
  fi
  mv "$bin/$name.tmp" "$bin/$name"
  echo "$want" > "$bin/.$name.ok"
  say "built $name in $((SECONDS - start)) s"
}

# --- commands ---------------------------------------------------------------------
# Version stamps as upstream's release builds set them, as scripts/upstream.sh does.
k8s_ldflags=$(k8s_version_ldflags "$version")

k8s_dir=$(cd "$node/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes 2>/dev/null || true)
if [ -z "$k8s_dir" ] || [ ! -d "$k8s_dir" ]; then
  download kubernetes
  k8s_dir=$(cd "$node/kubernetes" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)
fi
agnhost_version=$(cat "$k8s_dir/test/images/agnhost/VERSION")

build kubelet kubernetes k8s.io/kubernetes/cmd/kubelet 15 0 "" "$k8s_ldflags"
# agnhost as upstream's image build makes it (test/images/image-util.sh): static, with
# its VERSION file as main.Version.
build agnhost kubernetes k8s.io/kubernetes/test/images/agnhost 1 0 "" "-s -w -X main.Version=$agnhost_version"
# kube-proxy for its image (a DaemonSet, as kubeadm and kind run it): the cluster a test
# replaces kube-proxy on.
build kube-proxy kubernetes k8s.io/kubernetes/cmd/kube-proxy 4 0 "" "$k8s_ldflags"
if [ "$e2e" = 1 ]; then
  # As hack/lib/golang.sh builds it for upstream's own e2e runs (go test -c).
  build e2e.test kubernetes k8s.io/kubernetes/test/e2e 25 0 "" "$k8s_ldflags" test
  # ginkgo's command, of the ginkgo module e2e.test is built with: it runs the suite as
  # several processes, as hack/ginkgo-e2e.sh does.
  build ginkgo kubernetes github.com/onsi/ginkgo/v2/ginkgo 1 0 "" "-s -w"
fi
build containerd containerd github.com/containerd/containerd/v2/cmd/containerd 3 0 "" \
  "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
build containerd-shim-runc-v2 containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 1 0 "" \
  "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
build ctr containerd github.com/containerd/containerd/v2/cmd/ctr 1 0 "" \
  "-s -w -X github.com/containerd/containerd/v2/version.Version=$containerd_version"
# Pods of the e2e suite ask for seccompProfile RuntimeDefault: runc needs seccomp (cgo).
build runc runc github.com/opencontainers/runc 1 1 seccomp "-s -w"
build crictl cri-tools sigs.k8s.io/cri-tools/cmd/crictl 2 0 "" \
  "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version"
for p in main/ptp ipam/host-local meta/portmap main/loopback; do
  build "${p#*/}" cni-plugins "github.com/containernetworking/plugins/plugins/$p" 1 0 "" \
    "-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$cni_version"
done
build coredns coredns github.com/coredns/coredns 4 0 "" \
  "-s -w -X github.com/coredns/coredns/coremain.GitCommit=$coredns_version"

# pause, as build/pause/Makefile makes it: a static C binary.
image_list="$k8s_dir/test/utils/image/manifest.go"
tag_of() { # IMAGE-ID: the tag manifest.go gives the image
  sed -n "s/^[[:space:]]*configs\[$1\] = Config{list\.[A-Za-z0-9]*, \"[^\"]*\", \"\([^\"]*\)\"}.*/\1/p" "$image_list" | head -n 1
}
pause_version=$(tag_of Pause)
want=$(stamp "$(sha256sum "$k8s_dir/build/pause/linux/pause.c")" "$pause_version" "$(gcc -dumpfullversion)")
if ! fresh "$bin/pause" "$bin/.pause.ok" "$want"; then
  say "building pause $pause_version from build/pause/linux/pause.c (a second)"
  gcc -Os -Wall -Werror -static -DVERSION="v$pause_version" -o "$bin/pause.tmp" "$k8s_dir/build/pause/linux/pause.c"
  strip "$bin/pause.tmp"
  mv "$bin/pause.tmp" "$bin/pause"
  echo "$want" > "$bin/.pause.ok"
fi

# --- images -----------------------------------------------------------------------
# The names, as the pinned e2e suite asks for them: promoterE2eRegistry and gcRegistry of
# https://github.com/kubernetes/kubernetes/blob/v1.37.2/test/utils/image/manifest.go and
# CoreDNS as cluster/addons/dns/coredns/coredns.yaml.in names it.
e2e_registry=registry.k8s.io/e2e-test-images
for id in Agnhost BusyBox Nginx GlibcDnsTesting Pause; do
  if [ -z "$(tag_of "$id")" ]; then
    say "cannot read the tag of $id from test/utils/image/manifest.go of k8s.io/kubernetes $version"
    exit 1
  fi
done
if [ "$(tag_of Agnhost)" != "$agnhost_version" ]; then
  say "the e2e suite asks for agnhost $(tag_of Agnhost) but test/images/agnhost/VERSION is $agnhost_version; the image would not match"
  exit 1
fi

# One Debian root filesystem serves agnhost, busybox, nginx and glibc-dns-testing: the
# tools of agnhost's Dockerfile (Debian's names for Alpine's), nginx-light for nginx,
# bind9-dnsutils for glibc-dns-testing, busybox-static for busybox, and iptables,
# nftables and conntrack for kube-proxy (what upstream's distroless-iptables base
# holds). One layer for all five keeps the disk down: each containerd stores it once.
suite=bookworm
debs=bash,bind9-dnsutils,busybox-static,ca-certificates,conntrack,curl,iperf,iproute2,iptables,netcat-openbsd,nftables,nginx-light,procps,socat,util-linux,wget
rootfs="$cache/rootfs"
want=$(stamp "$suite" "$debs" "$(sha256sum "$bin/agnhost")" "$(sha256sum "$k8s_dir/test/images/agnhost/porter/localhost.crt")")
if ! fresh "$rootfs" "$cache/.rootfs.ok" "$want"; then
  rm -rf "$rootfs" "$rootfs.tmp" "$cache/.rootfs.ok"
  say "making the images' Debian $suite root filesystem with mmdebstrap (about 1.5 min, from deb.debian.org)"
  start=$SECONDS
  mmdebstrap --quiet --mode=root --variant=minbase --include="$debs" \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$rootfs.tmp" >&2
  rm -rf "$rootfs.tmp/var/lib/apt/lists"/* "$rootfs.tmp/var/cache/apt"/*
  # What agnhost's Dockerfile adds: the binary at / with its agnhost-2 link, the porter's
  # certificate, /uploads, iperf in /usr/local/bin, a user and a group of the image.
  install -m 0755 "$bin/agnhost" "$rootfs.tmp/agnhost"
  ln -s agnhost "$rootfs.tmp/agnhost-2"
  install -m 0644 "$k8s_dir/test/images/agnhost/porter/localhost.crt" "$rootfs.tmp/localhost.crt"
  install -m 0644 "$k8s_dir/test/images/agnhost/porter/localhost.key" "$rootfs.tmp/localhost.key"
  mkdir -p "$rootfs.tmp/uploads"
  ln -sf /usr/bin/iperf "$rootfs.tmp/usr/local/bin/iperf"
  chroot "$rootfs.tmp" /usr/sbin/useradd --uid 1000 --create-home user-defined-in-image
  chroot "$rootfs.tmp" /usr/sbin/groupadd --gid 50000 group-defined-in-image
  chroot "$rootfs.tmp" /usr/sbin/usermod --append --groups group-defined-in-image user-defined-in-image
  mv "$rootfs.tmp" "$rootfs"
  echo "$want" > "$cache/.rootfs.ok"
  say "made the root filesystem in $((SECONDS - start)) s ($(du -sh "$rootfs" | cut -f1))"
fi

# layer NAME DIR STAMP-FILE: DIR as one layer in layers/NAME.tar (lib.sh's layer_tar),
# made again when STAMP-FILE changes.
layer() {
  local name=$1 dir=$2 want
  want=$(stamp "$(cat "$3")")
  if fresh "$cache/layers/$name.tar" "$cache/layers/.$name.ok" "$want"; then
    return
  fi
  say "writing the $name layer"
  rm -f "$cache/layers/.$name.ok"
  layer_tar "$dir" "$cache/layers/$name.tar"
  echo "$want" > "$cache/layers/.$name.ok"
}

# Layers of one command each: pause and CoreDNS (static binaries, nothing else), and
# kube-proxy at /usr/local/bin, where kubeadm's DaemonSet runs it, over the Debian layer.
single_command_dir() { # NAME BINARY [DIR]: a directory holding BINARY at DIR/NAME
  local d="$cache/layers/$1.d"
  rm -rf "$d" && mkdir -p "$d${3:-}"
  install -m 0755 "$2" "$d${3:-}/$1"
  echo "$d"
}
layer debian "$rootfs" "$cache/.rootfs.ok"
layer pause "$(single_command_dir pause "$bin/pause")" "$bin/.pause.ok"
layer coredns "$(single_command_dir coredns "$bin/coredns")" "$bin/.coredns.ok"
layer kube-proxy "$(single_command_dir kube-proxy "$bin/kube-proxy" /usr/local/bin)" "$bin/.kube-proxy.ok"
rm -rf "$cache/layers/pause.d" "$cache/layers/coredns.d" "$cache/layers/kube-proxy.d"

# image FILE REF LAYERS ENTRYPOINT CMD: a docker-archive of LAYERS (names, bottom
# first, separated by spaces) at images/FILE.tar. ENTRYPOINT and CMD are JSON (null for
# none).
: > "$images/names.txt.tmp"
image() {
  local file=$1 ref=$2 names=$3 entry=$4 cmd=$5 diff="" want name tars=()
  for name in $names; do
    diff="$diff $(cat "$cache/layers/$name.tar.sha256")"
    tars+=("$cache/layers/$name.tar")
  done
  echo "$file.tar $ref" >> "$images/names.txt.tmp"
  want=$(stamp "$ref" "$diff" "$entry" "$cmd")
  if fresh "$images/$file.tar" "$images/.$file.ok" "$want"; then
    return
  fi
  say "writing the image $ref"
  rm -f "$images/.$file.ok"
  docker_archive "$images/$file.tar" "$ref" "$entry" "$cmd" "sliceway scripts/node-kit.sh" \
    "${tars[@]}"
  echo "$want" > "$images/.$file.ok"
}
image "agnhost-$(tag_of Agnhost)" "$e2e_registry/agnhost:$(tag_of Agnhost)" debian '["/agnhost"]' '["pause"]'
image "busybox-$(tag_of BusyBox)" "$e2e_registry/busybox:$(tag_of BusyBox)" debian null '["/bin/busybox","sh"]'
image "nginx-$(tag_of Nginx)" "$e2e_registry/nginx:$(tag_of Nginx)" debian null '["nginx","-g","daemon off;"]'
image "glibc-dns-testing-$(tag_of GlibcDnsTesting)" "$e2e_registry/glibc-dns-testing:$(tag_of GlibcDnsTesting)" debian null '["/bin/sh"]'
image "pause-$pause_version" "registry.k8s.io/pause:$pause_version" pause '["/pause"]' null
image "coredns-$coredns_version" "registry.k8s.io/coredns/coredns:$coredns_version" coredns '["/coredns"]' null
image "kube-proxy-$version" "registry.k8s.io/kube-proxy:$version" "debian kube-proxy" null null
mv "$images/names.txt.tmp" "$images/names.txt"

say "node kit for Kubernetes $version ready: commands in $bin, images in $images"
echo "$bin"
