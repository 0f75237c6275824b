#!/usr/bin/env bash
# Builds the upstream Kubernetes commands that the cluster lab runs beside sliceway
# (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, kubectl) from the
# Go module proxy with the ordinary `go` client, once per version, into
#   ${SLICEWAY_CACHE:-~/.cache/sliceway}/upstream/<version>/bin
# The version is the one `require k8s.io/kubernetes` line of upstream/go.mod; its staging
# modules are replaced there by their published v0.x.y twins, and go.sum pins every
# module. Idempotent: a second run with the same go.sum builds nothing and prints the
# directory only. Prints that directory on stdout; progress goes to stderr.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
kit="$root/upstream"
say() { printf 'upstream: %s\n' "$*" >&2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

version=$(sed -n 's/^[[:space:]]*k8s.io\/kubernetes \(v[0-9.]*\)$/\1/p' "$kit/go.mod" | head -n 1)
etcd_version=$(sed -n 's/^[[:space:]]*go.etcd.io\/etcd\/server\/v3 \(v[0-9.]*\)$/\1/p' "$kit/go.mod" | head -n 1)
need_go=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$kit/go.mod")
if [ -z "$version" ] || [ -z "$etcd_version" ]; then
  say "cannot read the Kubernetes or etcd version from $kit/go.mod"
  exit 1
fi

# --- Go ---------------------------------------------------------------------------
ensure_go "$need_go" "Kubernetes $version" "upstream/go.mod"

cache="${SLICEWAY_CACHE:-$HOME/.cache/sliceway}/upstream/$version"
bin="$cache/bin"
stamp="$cache/.go.sum"
commands=(etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubectl)

complete=1
for c in "${commands[@]}"; do [ -x "$bin/$c" ] || complete=0; done
if [ "$complete" = 1 ] && cmp -s "$stamp" "$kit/go.sum"; then
  echo "$bin"
  exit 0
fi
mkdir -p "$bin"
rm -f "$stamp"

# Version stamps as upstream's release builds set them (hack/lib/version.sh).
ldflags=$(k8s_version_ldflags "$version")

cd "$kit"
export GOFLAGS="-mod=readonly -buildvcs=false"
say "downloading modules for Kubernetes $version and etcd $etcd_version (go.sum pins each)"
go mod download >/dev/null

build() { # name package minutes
  if [ -x "$bin/$1" ] && [ -f "$bin/.$1.ok" ] && cmp -s "$bin/.$1.ok" "$kit/go.sum"; then
    return
  fi
  say "building $1 $4 (about $3 minutes on 2 cores when Go's build cache is cold)"
  local start=$SECONDS
  go build -trimpath -ldflags "$ldflags" -o "$bin/$1.tmp" "$2"
  mv "$bin/$1.tmp" "$bin/$1"
  cp "$kit/go.sum" "$bin/.$1.ok"
  say "built $1 in $((SECONDS - start)) s"
}
build etcd go.etcd.io/etcd/server/v3 3 "$etcd_version"
build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver 7 "$version"
build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager 2 "$version"
build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler 1 "$version"
build kube-proxy k8s.io/kubernetes/cmd/kube-proxy 1 "$version"
build kubectl k8s.io/kubernetes/cmd/kubectl 2 "$version"
cp "$kit/go.sum" "$stamp"
say "Kubernetes $version commands ready in $bin"
echo "$bin"
