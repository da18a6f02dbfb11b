#!/usr/bin/env bash
# Usage: deploy/image/binary.sh ARCH
#
# Builds the service binary the image ships, for ARCH (amd64 or arm64), and
# prints its path: a static musl executable, the `dist` profile (release,
# fat LTO, stripped) and no default features (no `sluice bench`), with the
# locked dependencies. amd64 is compiled with Debian's musl-tools; arm64 is
# cross-compiled with Debian's gcc-aarch64-linux-gnu as C compiler and
# linker (Rust's musl targets bring their own C library). Missing Debian
# packages are installed when running as root, and the Rust target is added
# with rustup.
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
  amd64)
    triple=x86_64-unknown-linux-musl
    tools=(musl-gcc)
    packages=(musl-tools)
    ;;
  arm64)
    triple=aarch64-unknown-linux-musl
    tools=(aarch64-linux-gnu-gcc)
    packages=(gcc-aarch64-linux-gnu)
    # The C parts (mimalloc, ring) and the final link go through Debian's
    # cross compiler; the C library is the one Rust's target ships.
    export CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc
    export AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar
    export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc
    ;;
  *)
    say "usage: deploy/image/binary.sh amd64|arm64"
    exit 2
    ;;
esac

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

cargo build --profile dist --locked --no-default-features --bin sluice --target "$triple" >&2

target_dir="${CARGO_TARGET_DIR:-target}"
binary="$target_dir/$triple/dist/sluice"
# Static: no program interpreter (dynamic loader) to find at run time.
if LC_ALL=C readelf -lW "$binary" | grep -q 'INTERP'; then
  say "$binary is dynamically linked; the image needs a static binary."
  exit 1
fi
echo "$binary"
