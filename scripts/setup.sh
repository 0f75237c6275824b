#!/usr/bin/env bash
# Installs what building and testing sliceway needs, idempotently and quietly when
# everything is already present: Debian packages for the node lab, the dated nightly
# pinned in `ebpf-toolchain` with rust-src and clippy for the kernel crate, and a
# pinned bpf-linker built against that nightly's own libLLVM (bpf-linker's LLVM must
# match the nightly's major version).
set -euo pipefail

# The one place the kernel crate's nightly is named (xtask and the agent's build
# script read the same file).
TOOLCHAIN=$(tr -d '[:space:]' < "$(dirname "${BASH_SOURCE[0]}")/../ebpf-toolchain")

BPF_LINKER_VERSION=0.13.0
TOOLS_DIR="${SLICEWAY_TOOLS:-${CARGO_HOME:-$HOME/.cargo}}"
APT_PACKAGES=(iproute2 iptables nftables conntrack ethtool tcpdump bpftool procps fonts-dejavu-core
  # The VM tier (scripts/vm.sh): qemu, a static busybox for the initramfs, depmod
  # and modprobe for the guest kernel's modules, and the tools to unpack them.
  qemu-system-x86 busybox-static kmod cpio xz-utils zstd)

say() { printf 'setup: %s\n' "$*" >&2; }
# shellcheck source=lib.sh source-path=SCRIPTDIR
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- Debian packages -------------------------------------------------------------
ensure_debian_packages "" "${APT_PACKAGES[@]}"

# --- the pinned nightly with rust-src (build-std) and clippy (`cargo xtask lint`) ----
if ! rustup run "$TOOLCHAIN" rustc --version >/dev/null 2>&1; then
  say "installing the toolchain $TOOLCHAIN with rust-src and clippy (ebpf-toolchain)"
  rustup toolchain install "$TOOLCHAIN" --profile minimal --component rust-src,clippy >/dev/null
fi
installed=$(rustup component list --toolchain "$TOOLCHAIN" --installed 2>/dev/null)
for component in rust-src clippy; do
  if ! grep -q "^$component" <<<"$installed"; then
    say "adding $component to the toolchain $TOOLCHAIN"
    rustup component add "$component" --toolchain "$TOOLCHAIN" >/dev/null
  fi
done

# --- bpf-linker, linked against the pinned nightly's libLLVM ------------------------------
llvm_major=$(rustc "+$TOOLCHAIN" -vV | sed -n 's/^LLVM version: \([0-9]*\).*/\1/p')
linker="$TOOLS_DIR/bin/bpf-linker"
stamp="$TOOLS_DIR/bin/.bpf-linker-llvm"
# `--version` also fails when the libLLVM its rpath names is gone (a toolchain removed).
if [ -x "$linker" ] && "$linker" --version 2>/dev/null | grep -qF "$BPF_LINKER_VERSION" \
   && [ "$(cat "$stamp" 2>/dev/null)" = "$llvm_major" ]; then
  exit 0
fi
sysroot=$(rustc "+$TOOLCHAIN" --print sysroot)
libllvm=$(ls "$sysroot"/lib/libLLVM.so.* 2>/dev/null | head -n 1)
if [ -z "$libllvm" ]; then
  say "no libLLVM in $sysroot/lib: cannot build bpf-linker against the nightly's LLVM"
  exit 1
fi
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
mkdir -p "$prefix/lib"
ln -s "$libllvm" "$prefix/lib/libLLVM.so"
ln -s "$libllvm" "$prefix/lib/$(basename "$libllvm")"
say "building bpf-linker $BPF_LINKER_VERSION against LLVM $llvm_major (about a minute)"
# The rpath lets the linker find the nightly's libLLVM at run time.
LLVM_PREFIX="$prefix" RUSTFLAGS="-C link-arg=-Wl,-rpath,$sysroot/lib" cargo install --quiet --force "bpf-linker@$BPF_LINKER_VERSION" \
  --no-default-features --features "llvm-$llvm_major" --root "$TOOLS_DIR" --locked 2>&1 | tail -n 20 >&2
echo "$llvm_major" > "$stamp"
