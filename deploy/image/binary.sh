#!/usr/bin/env bash
# Usage: deploy/image/binary.sh ARCH
#
# Builds the service binary the image ships, for ARCH (amd64 or arm64), and
# prints its path: a static musl executable, the `dist` profile (release,
# fat LTO, stripped) and no default features (no `sluice bench`), with the
# locked dependencies. The machine's own architecture is compiled with
# Debian's musl-tools, the other one cross-compiled with Debian's
# gcc-aarch64-linux-gnu (or gcc-x86-64-linux-gnu) as C compiler and linker
# (Rust's musl targets bring their own C library). Missing Debian
# packages are installed when running as root, and the Rust target is added
# with rustup.
#
# SLUICE_PROFILE picks another cargo profile (tests/run uses the quick
# `image-check`; releases and the Dockerfile ship `dist`).
#
# deploy/image/build.sh calls this unless SLUICE_BINARY names a prebuilt
# binary; deploy/Dockerfile calls it in its build stage. cargo's target
# directory is the usual one (CARGO_TARGET_DIR is honoured), so a second
# build reuses the first.
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "deploy/image/binary.sh: $*" >&2; }

arch="${1:-}"
case "$arch" in
  amd64) machine=x86_64 ;;
  arm64) machine=aarch64 ;;
  *)
    say "usage: deploy/image/binary.sh amd64|arm64"
    exit 2
    ;;
esac
triple="$machine-unknown-linux-musl"
target_env="$(echo "$triple" | tr '-' '_')"
if [ "$(uname -m)" = "$machine" ]; then
  # Native: the C parts (mimalloc, ring) compiled by Debian's musl-gcc,
  # which the cc crate finds by itself for x86_64.
  tools=(musl-gcc)
  packages=(musl-tools)
  if [ "$machine" != x86_64 ]; then
    export "CC_$target_env=musl-gcc"
  fi
else
  # Cross: the C parts and the final link go through Debian's cross
  # compiler for the machine; the C library is the one Rust's target ships.
  cross="$machine-linux-gnu"
  tools=("$cross-gcc")
  packages=("gcc-${cross//_/-}")
  export "CC_$target_env=$cross-gcc" "AR_$target_env=$cross-ar"
  export "CARGO_TARGET_$(echo "$target_env" | tr '[:lower:]' '[:upper:]')_LINKER=$cross-gcc"
fi

missing=()
for tool in "${tools[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${packages[*]} (for ${missing[*]}) ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
  else
    say "${missing[*]} not found: install ${packages[*]} (sudo apt-get install ${packages[*]}) and run again."
    exit 1
  fi
fi

if command -v rustup >/dev/null 2>&1; then
  if ! rustup target list --installed | grep -qx "$triple"; then
    say "adding the Rust target $triple ..."
    rustup target add "$triple" >&2
  fi
fi

profile="${SLUICE_PROFILE:-dist}"
cargo build --profile "$profile" --locked --no-default-features --bin sluice --target "$triple" >&2

target_dir="${CARGO_TARGET_DIR:-target}"
binary="$target_dir/$triple/$profile/sluice"
# Static: no program interpreter (dynamic loader) to find at run time.
if LC_ALL=C readelf -lW "$binary" | grep -q 'INTERP'; then
  say "$binary is dynamically linked; the image needs a static binary."
  exit 1
fi
echo "$binary"
