# shellcheck shell=bash
# What several scripts under scripts/ share, sourced by them (never run on its own):
# the idempotent install of Debian packages, the check for a new enough Go, the version
# stamps of a Kubernetes build, and image archives written without a container engine.
# The caller defines say (its progress line, on stderr) first; a failed check exits
# the calling script with status 1.

# ensure_debian_packages NOTE PACKAGE...: installs, with apt-get, those PACKAGEs that
# dpkg does not list as installed; says nothing when none is missing. NOTE, when not
# empty, is added in parentheses to the progress line (how long it takes, say). Exits
# when some are missing and this is not root, or when installing them would remove a
# package.
ensure_debian_packages() {
  local note=$1 p removals
  shift
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
      say "missing Debian packages ${missing[*]}; run this script as root to install them"
      exit 1
    fi
    say "installing Debian packages: ${missing[*]}${note:+ ($note)}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >/dev/null
    # Never let an install take something away (qemu-system-x86 can conflict with a
    # newer qemu-utils from elsewhere): say what it would remove and stop.
    removals=$(apt-get install -s --no-install-recommends "${missing[@]}" 2>/dev/null | sed -n 's/^Remv \([^ ]*\).*/\1/p')
    if [ -n "$removals" ]; then
      say "installing ${missing[*]} would remove: $removals; install them by hand, or make room, and run again"
      exit 1
    fi
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# ensure_go NEED WHO WHERE: puts a Go toolchain on PATH (trying the usual install
# directories when PATH has none) and sets have_go to its version. Exits unless there is
# one of version NEED or newer; the messages say that WHO needs NEED, as WHERE says.
ensure_go() {
  local need=$1 who=$2 where=$3 g
  if ! command -v go >/dev/null 2>&1; then
    for g in /usr/local/go/bin/go /usr/lib/go/bin/go; do
      [ -x "$g" ] && PATH="$(dirname "$g"):$PATH" && break
    done
  fi
  if ! command -v go >/dev/null 2>&1; then
    say "no Go toolchain on PATH: $who needs Go $need or newer."
    say "install it (for example from your distribution or the Go project's release archive) and run again."
    exit 1
  fi
  have_go=$(go env GOVERSION | sed 's/^go//')
  if [ "$(printf '%s\n%s\n' "$need" "$have_go" | sort -V | head -n 1)" != "$need" ]; then
    say "Go $have_go is too old: $who needs Go $need or newer ($where)."
    say "install a newer Go and run again."
    exit 1
  fi
}

# k8s_version_ldflags VERSION: the -ldflags of a Kubernetes command of VERSION (v1.x.y),
# stripped and with the version stamps upstream's release builds set
# (hack/lib/version.sh), so the components report VERSION and derive their default
# emulation version from it.
k8s_version_ldflags() {
  local minor
  minor=$(echo "$1" | cut -d. -f2)
  echo "-s -w \
 -X k8s.io/component-base/version.gitVersion=$1 \
 -X k8s.io/component-base/version.gitMajor=1 \
 -X k8s.io/component-base/version.gitMinor=$minor \
 -X k8s.io/component-base/version.gitTreeState=clean \
 -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z \
 -X k8s.io/client-go/pkg/version.gitVersion=$1 \
 -X k8s.io/client-go/pkg/version.gitMajor=1 \
 -X k8s.io/client-go/pkg/version.gitMinor=$minor"
}

# stamp WORDS...: a digest of what a product is made from.
stamp() { printf '%s\n' "$@" | sha256sum | cut -d' ' -f1; }
# fresh PRODUCT STAMP-FILE WANT: whether PRODUCT exists and was made from WANT.
fresh() { [ -e "$1" ] && [ "$(cat "$2" 2>/dev/null)" = "$3" ]; }

# layer_tar DIR TAR: DIR as one uncompressed, reproducible layer (names sorted, owner
# root, every time the epoch, extended attributes kept, no access or change times in
# the pax headers) at TAR, and its sha256 in TAR.sha256.
layer_tar() {
  local dir=$1 tar=$2
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --xattrs \
    --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime \
    -C "$dir" -cf "$tar.tmp" .
  sha256sum "$tar.tmp" | cut -d' ' -f1 > "$tar.sha256"
  mv "$tar.tmp" "$tar"
}

# docker_archive FILE REF ENTRYPOINT CMD CREATED-BY LAYER-TAR...: an image of those
# layers (each made by layer_tar, bottom first) as a docker-archive at FILE (the
# `docker save` format, which `ctr images import`, `docker load`, `podman load` and
# `kind load image-archive` read), tagged REF. ENTRYPOINT and CMD are JSON (null for
# none). Needs jq.
docker_archive() {
  local file=$1 ref=$2 entry=$3 cmd=$4 by=$5 work cfg l diff
  shift 5
  file="$(cd "$(dirname "$file")" && pwd)/$(basename "$file")"
  work=$(mktemp -d "$(dirname "$file")/image.XXXXXX")
  local diffs=() paths=()
  for l in "$@"; do
    diff=$(cat "$l.sha256")
    diffs+=("sha256:$diff")
    paths+=("$diff/layer.tar")
    mkdir -p "$work/$diff"
    ln "$l" "$work/$diff/layer.tar" 2>/dev/null || cp "$l" "$work/$diff/layer.tar"
  done
  jq -n --argjson diffs "$(printf '%s\n' "${diffs[@]}" | jq -R . | jq -s .)" \
    --argjson entry "$entry" --argjson cmd "$cmd" --arg by "$by" '{
    architecture: "amd64", os: "linux", created: "1970-01-01T00:00:00Z",
    config: {Env: ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
             Entrypoint: $entry, Cmd: $cmd, WorkingDir: "/"},
    rootfs: {type: "layers", diff_ids: $diffs},
    history: [$diffs[] | {created: "1970-01-01T00:00:00Z", created_by: $by}]}' > "$work/config.json"
  cfg=$(sha256sum "$work/config.json" | cut -d' ' -f1)
  mv "$work/config.json" "$work/$cfg.json"
  jq -n --arg cfg "$cfg.json" --arg ref "$ref" \
    --argjson layers "$(printf '%s\n' "${paths[@]}" | jq -R . | jq -s .)" \
    '[{Config: $cfg, RepoTags: [$ref], Layers: $layers}]' > "$work/manifest.json"
  (cd "$work" && tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 \
    --hard-dereference -cf "$file.tmp" manifest.json "$cfg.json" "${paths[@]%/layer.tar}")
  rm -rf "$work"
  mv "$file.tmp" "$file"
}
