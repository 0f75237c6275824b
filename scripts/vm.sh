#!/usr/bin/env bash
# Boots another kernel under qemu and runs one command in it, on this machine's own
# files: the host's root is shared read-only over 9p (virtfs) with a tmpfs overlay on
# top, so the guest runs the binaries built here; the guest kernel's modules are
# mounted at /lib/modules. No network device: the guest's traffic stays in the
# namespaces its tests make.
#
#   scripts/vm.sh kernels                         the kernels it knows
#   scripts/vm.sh prepare KERNEL                  fetch the kernel, build the initramfs
#   scripts/vm.sh run KERNEL DIR SCRIPT           run `sh SCRIPT` in DIR inside the guest
#
# With SLICEWAY_VM_OUT=DIR, DIR is shared writable at the same path (the only place
# the guest's writes reach the host) and the console is also kept in DIR/console.log.
#
# KERNEL is `debian-6.1` (Debian bookworm's kernel, the newest 6.1 ABI that
# linux-image-amd64 depends on) or `debian-bpo` (the newest one of bookworm-backports).
# The guest's console is this script's output; its last line is
# `sliceway-vm: exit N` with the command's exit status, which is also this script's.
# KVM is used when /dev/kvm can run the guest, software emulation otherwise.
set -euo pipefail

CACHE="${SLICEWAY_VM_CACHE:-$HOME/.cache/sliceway/vm}"
MIRROR="${SLICEWAY_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
MEMORY="${SLICEWAY_VM_MEMORY:-2048}"
TIMEOUT="${SLICEWAY_VM_TIMEOUT:-3000}"

SCRIPT_SUM=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)

say() { printf 'vm: %s\n' "$*" >&2; }
die() { say "$*"; exit 1; }

# The package of a kernel entry, printed as NAME (resolved through apt's lists).
kernel_package() {
  case "$1" in
    debian-6.1)
      local signed
      signed=$(apt-cache depends linux-image-amd64 2>/dev/null \
        | awk '/Depends: linux-image-6\.1\.0-[0-9]+-amd64$/ {print $2}' | head -n 1)
      [ -n "$signed" ] || die "apt knows no linux-image-6.1.0-*-amd64 (is bookworm in the apt sources? run apt-get update)"
      # The unsigned twin: the same kernel and modules without the Secure Boot signature.
      echo "${signed}-unsigned"
      ;;
    debian-bpo)
      apt_bpo update
      local pkg
      pkg=$(apt_bpo cache depends linux-image-amd64 2>/dev/null \
        | awk '/Depends: linux-image-[0-9][^ ]*-amd64$/ {print $2}' | head -n 1)
      [ -n "$pkg" ] || die "bookworm-backports lists no linux-image-amd64 dependency"
      echo "${pkg}-unsigned"
      ;;
    *) die "unknown kernel '$1' (known: debian-6.1, debian-bpo)" ;;
  esac
}

# apt with a private list of bookworm-backports, so the host's sources stay as they are.
apt_bpo() {
  local dir="$CACHE/apt-bpo" what="$1"; shift
  mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial"
  echo "deb $MIRROR bookworm-backports main" > "$dir/sources.list"
  local opts=(-o "Dir::Etc::SourceList=$dir/sources.list" -o "Dir::Etc::SourceParts=-"
              -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache"
              -o "APT::Default-Release=bookworm-backports")
  case "$what" in
    update)
      # Once a day is enough.
      if [ -z "$(find "$dir/lists" -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null)" ]; then
        say "reading bookworm-backports' package list"
        apt-get "${opts[@]}" update -qq >/dev/null
      fi
      ;;
    cache) apt-cache "${opts[@]}" "$@" ;;
    get) apt-get "${opts[@]}" "$@" ;;
  esac
}

# Downloads and unpacks the kernel, builds the initramfs; prints the kernel's directory.
prepare() {
  local entry="$1" pkg dir
  # One preparation at a time: runs from several checkouts share the cache.
  mkdir -p "$CACHE"
  exec 9>"$CACHE/lock"
  flock 9
  pkg=$(kernel_package "$entry")
  dir="$CACHE/$pkg"
  if [ -f "$dir/ready" ]; then
    # The initramfs is this script's: one per version of the script, so checkouts
    # with different versions do not rebuild each other's.
    local kver
    kver=$(cat "$dir/ready")
    if [ ! -f "$dir/initramfs-$SCRIPT_SUM.gz" ]; then
      build_initramfs "$dir" "$kver"
    fi
    echo "$dir"
    return
  fi
  rm -rf "$dir"
  mkdir -p "$dir/deb"
  say "downloading $pkg from Debian's mirror"
  if [ "$entry" = debian-bpo ]; then
    (cd "$dir/deb" && apt_bpo get download -qq "$pkg" >/dev/null 2>&1) \
      || die "apt-get download $pkg (bookworm-backports) failed"
  else
    (cd "$dir/deb" && apt-get download -qq "$pkg" >/dev/null 2>&1) \
      || die "apt-get download $pkg failed"
  fi
  say "unpacking $pkg"
  dpkg -x "$dir"/deb/*.deb "$dir/root"
  local kver
  kver=$(ls "$dir/root/lib/modules")
  depmod -b "$dir/root" "$kver"
  build_initramfs "$dir" "$kver"
  rm -rf "$dir/deb"
  echo "$kver" > "$dir/ready"
  echo "$dir"
}

# A busybox initramfs that mounts the host's root over 9p under a tmpfs overlay and
# runs the script named on the kernel command line.
build_initramfs() {
  local dir="$1" kver="$2" ird
  ird=$(mktemp -d)
  mkdir -p "$ird"/{bin,dev,proc,sys,lower,rw,newroot,modules}
  cp "$(command -v busybox)" "$ird/bin/busybox"
  file "$ird/bin/busybox" 2>/dev/null | grep -q 'statically linked' \
    || ldd "$ird/bin/busybox" 2>&1 | grep -q 'not a dynamic' \
    || die "busybox is not the static one (install busybox-static)"
  # Only what mounting the host's root needs; everything else the guest loads from
  # the kernel's own module tree once it is mounted.
  modprobe -d "$dir/root" -S "$kver" --show-depends -a 9p 9pnet_virtio virtio_pci overlay \
    | awk '$1 == "insmod" {print $2}' | awk '!seen[$0]++' > "$ird/order.tmp"
  : > "$ird/modules.order"
  while read -r ko; do
    # busybox's insmod takes plain .ko files; newer Debian kernels compress theirs.
    local name
    name=$(basename "$ko"); name="${name%.xz}"; name="${name%.zst}"
    case "$ko" in
      *.xz) xz -dc "$ko" > "$ird/modules/$name" ;;
      *.zst) zstd -qdc "$ko" > "$ird/modules/$name" ;;
      *) cp "$ko" "$ird/modules/$name" ;;
    esac
    echo "/modules/$name" >> "$ird/modules.order"
  done < "$ird/order.tmp"
  rm "$ird/order.tmp"
  cat > "$ird/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for ko in $(cat /modules.order); do insmod "$ko" || echo "sliceway-vm: insmod $ko failed"; done
arg() { tr ' ' '\n' < /proc/cmdline | sed -n "s/^$1=//p"; }
fail() { echo "sliceway-vm: $*"; echo "sliceway-vm: exit 125"; poweroff -f; }
mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576,cache=loose,ro host /lower || fail "mounting the host's root"
mount -t tmpfs -o size=75% tmpfs /rw
mkdir -p /rw/upper /rw/work
mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail "overlay"
for d in proc sys dev tmp run; do mkdir -p /newroot/$d; done
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mkdir -p /newroot/dev/pts /newroot/dev/shm
mount -t devpts devpts /newroot/dev/pts
mount -t tmpfs tmpfs /newroot/dev/shm
# The guest gets a /tmp and a /run of its own; a work tree under either (a clone in
# /tmp) would be hidden by them, so its view of the host is held and put back on top.
work=$(arg sliceway.dir)
mkdir -p /held
mount --bind "/newroot$work" /held || fail "holding the work tree $work"
# The kernel's modules, from the cache (which may itself be under /tmp), bound before
# the guest's own /tmp hides them.
kver=$(uname -r)
mkdir -p /newroot/usr/lib/modules/$kver
mount --bind /newroot$(arg sliceway.modules)/$kver /newroot/usr/lib/modules/$kver || fail "modules"
mount -t tmpfs tmpfs /newroot/tmp
mount -t tmpfs tmpfs /newroot/run
case "$work" in
  /tmp/*|/run/*)
    mkdir -p "/newroot$work"
    mount --bind /held "/newroot$work" || fail "putting back the work tree $work"
    ;;
esac
mount -t bpf bpf /newroot/sys/fs/bpf
mount -t debugfs debugfs /newroot/sys/kernel/debug 2>/dev/null
mount -t tracefs tracefs /newroot/sys/kernel/tracing 2>/dev/null
mount -t cgroup2 cgroup2 /newroot/sys/fs/cgroup 2>/dev/null
out=$(arg sliceway.out)
if [ -n "$out" ]; then
  mkdir -p "/newroot$out"
  mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 out "/newroot$out" || fail "mounting the output directory"
fi
mkdir -p /newroot/.vm
cp /bin/busybox /newroot/.vm/busybox
# A clsact qdisc held on the guest's loopback for the whole run keeps the kernel's
# TC static branches (ingress and egress) switched on, so agents that attach and
# detach TC programs never have the receive path's code patched under a running
# CPU: under software emulation a soft lockup was seen with both CPUs stuck at that
# branch, the packet not yet at the TC hook. The host's tc by its path: this shell
# runs its own applets first, and busybox's tc knows no clsact.
cat > /newroot/.vm/stage2 <<STAGE2
ip link set lo up
/usr/sbin/tc qdisc add dev lo clsact || /sbin/tc qdisc add dev lo clsact || echo "sliceway-vm: no clsact on lo: the TC static branch may be patched mid-test"
cd '$(arg sliceway.dir)' && HOME='$(arg sliceway.home)' PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin sh '$(arg sliceway.script)'
echo "sliceway-vm: exit \$?"
/.vm/busybox poweroff -f
STAGE2
echo "sliceway-vm: kernel $kver up"
exec switch_root /newroot /.vm/busybox sh /.vm/stage2
INIT
  chmod +x "$ird/init"
  (cd "$ird" && find . | cpio -o -H newc --quiet | gzip -1) > "$dir/initramfs.tmp"
  mv "$dir/initramfs.tmp" "$dir/initramfs-$SCRIPT_SUM.gz"
  rm -rf "$ird"
}

# Whether KVM can run a guest here (some hosts expose /dev/kvm that cannot).
kvm_works() {
  [ -w /dev/kvm ] || return 1
  [ "${SLICEWAY_VM_KVM:-auto}" != off ] || return 1
  local stamp="$CACHE/kvm-probe"
  if [ -f "$stamp" ]; then [ "$(cat "$stamp")" = yes ]; return; fi
  local out
  out=$(timeout 60 qemu-system-x86_64 -accel kvm -cpu host -m 256 -nographic -no-reboot \
    -kernel "$1/root/boot/vmlinuz-$(cat "$1/ready")" -initrd "$1/initramfs-$SCRIPT_SUM.gz" \
    -append "console=ttyS0 panic=-1 quiet" -nic none 2>&1 || true)
  if grep -q 'sliceway-vm:' <<<"$out"; then echo yes > "$stamp"; else echo no > "$stamp"; fi
  [ "$(cat "$stamp")" = yes ]
}

run_guest() {
  local entry="$1" workdir="$2" script="$3" dir kver accel
  dir=$(prepare "$entry")
  kver=$(cat "$dir/ready")
  workdir=$(realpath "$workdir"); script=$(realpath "$script")
  if kvm_works "$dir"; then accel=(-accel kvm -cpu host); say "booting $kver (KVM)"
  else accel=(-accel tcg,thread=multi -cpu max); say "booting $kver (software emulation)"; fi
  local log out_dev=() out_arg=""
  log=$(mktemp)
  if [ -n "${SLICEWAY_VM_OUT:-}" ]; then
    mkdir -p "$SLICEWAY_VM_OUT"
    local out
    out=$(realpath "$SLICEWAY_VM_OUT")
    out_dev=(-virtfs "local,path=$out,mount_tag=out,security_model=none")
    out_arg="sliceway.out=$out"
  fi
  # The guest prints its exit status last; qemu's own status says nothing about it.
  # The firmware's terminal escapes are taken out of the console. Kernel warnings
  # (loglevel 5) reach the console, with every CPU's backtrace on a soft lockup.
  timeout --foreground "$TIMEOUT" qemu-system-x86_64 "${accel[@]}" -smp "$(nproc)" -m "$MEMORY" \
    -nographic -no-reboot -nic none \
    -virtfs "local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap" \
    "${out_dev[@]}" \
    -kernel "$dir/root/boot/vmlinuz-$kver" -initrd "$dir/initramfs-$SCRIPT_SUM.gz" \
    -append "console=ttyS0 panic=-1 quiet loglevel=5 softlockup_all_cpu_backtrace=1 sliceway.modules=$dir/root/lib/modules sliceway.dir=$workdir sliceway.script=$script sliceway.home=$HOME $out_arg" \
    2>&1 | sed -u -e 's/\x1b\[[0-9;?]*[a-zA-Z]//g' -e 's/\x1bc/\n/g' -e 's/\x1b([A-Z0-9]//g' -e 's/\r$//' -e 's/\r/\n/g' -e 's/[\x0e\x0f]//g' | tee "$log" || true
  if [ -n "${SLICEWAY_VM_OUT:-}" ]; then cp "$log" "$SLICEWAY_VM_OUT/console.log"; fi
  local rc
  rc=$(sed -n 's/^sliceway-vm: exit \([0-9]*\).*/\1/p' "$log" | tail -n 1)
  rm -f "$log"
  if [ -z "$rc" ]; then say "the guest ended without an exit status (timeout ${TIMEOUT}s, or a crash above)"; exit 124; fi
  exit "$rc"
}

case "${1:-}" in
  kernels) echo "debian-6.1 debian-bpo" ;;
  prepare) [ $# -eq 2 ] || die "usage: vm.sh prepare KERNEL"; prepare "$2" ;;
  run) [ $# -eq 4 ] || die "usage: vm.sh run KERNEL DIR SCRIPT"; run_guest "$2" "$3" "$4" ;;
  *) die "usage: vm.sh kernels | prepare KERNEL | run KERNEL DIR SCRIPT" ;;
esac
