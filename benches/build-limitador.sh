#!/usr/bin/env bash
# Builds Kuadrant's Limitador server (limitador-server, the Rust RLS peer)
# at the commit BENCHMARKS.md's side-by-side figures were measured with, for
# benches/side_by_side.sh. Prints the path of the built binary on stdout.
#
# Usage: benches/build-limitador.sh [SOURCE] [WORK_DIR]
#   SOURCE    a Limitador checkout or git directory to take the commit from;
#             by default https://github.com/Kuadrant/limitador is cloned
#             (needs network access)
#   WORK_DIR  where the pinned commit is checked out and built
#             (default /tmp/limitador; side_by_side.sh looks for
#             /tmp/limitador/target/release/limitador-server)
#   LIMITADOR_COMMIT  another commit to build (default: the pinned one)
#
# The build uses Limitador's release profile (LTO, one codegen unit): about
# 8 minutes on two cores. It needs a Rust toolchain, protoc, pkg-config and
# OpenSSL's headers; on Debian/Ubuntu the missing packages are installed
# (as root or with passwordless sudo), elsewhere the script names them.
#
# Two edits are made in the work tree, for this build only:
# - the server's disk store (RocksDB) is made optional and left out: it needs
#   a C++ toolchain and a long compile, and the comparison uses the memory
#   and Redis stores only;
# - the library's key helpers, which upstream compiles only with the disk
#   store although the Redis store uses them too, are compiled for the
#   Redis store as well, so a build without the disk store links.
# The system OpenSSL is linked (OPENSSL_NO_VENDOR=1) rather than a vendored
# copy compiled from source.
set -euo pipefail

# The commit of github:Kuadrant/limitador measured in BENCHMARKS.md.
pinned=2981b2b
commit=${LIMITADOR_COMMIT:-$pinned}
source=${1:-https://github.com/Kuadrant/limitador}
work=${2:-/tmp/limitador}

say() { echo "build-limitador: $*" >&2; }

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
pkg-config --exists openssl 2>/dev/null || missing+=(libssl-dev)
command -v python3 >/dev/null 2>&1 || missing+=(python3)
if [ ${#missing[@]} -gt 0 ]; then
  sudo=()
  if [ "$(id -u)" != 0 ] && sudo -n true 2>/dev/null; then
    sudo=(sudo)
  fi
  if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || [ ${#sudo[@]} -gt 0 ]; }; then
    say "installing ${missing[*]} ..."
    "${sudo[@]}" apt-get update -qq
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    say "install these (Debian package names) and run again: ${missing[*]}"
    exit 1
  fi
fi
command -v cargo >/dev/null 2>&1 || {
  say "cargo not found: install a Rust toolchain (https://rustup.rs)."
  exit 1
}

if [ ! -d "$work/.git" ]; then
  say "fetching Limitador from $source into $work ..."
  git clone -q --no-checkout "$source" "$work"
fi
cd "$work"
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  git fetch -q origin || true
fi
git cat-file -e "$commit^{commit}" 2>/dev/null || {
  say "commit $commit is not in $source: give a checkout that has it."
  exit 1
}
# Check out every file of the commit (forcing away the edits of an earlier
# run). A few stored copies of the repository lack the blob of a profiling
# artefact (default.profraw) that the build never reads: it is left out.
git ls-tree -r --name-only "$commit" | grep -v 'default\.profraw$' |
  xargs -d '\n' git checkout -q -f "$commit" --
say "building limitador-server at $commit ..."

python3 - <<'PY'
import re

def edit(path, pattern, replacement):
    """Applies one regular-expression edit to a freshly checked-out file; a
    file that no longer looks as expected stops the build."""
    text = open(path).read()
    new, n = re.subn(pattern, replacement, text, count=1)
    if n != 1:
        raise SystemExit(f"build-limitador: {path} no longer matches {pattern!r}")
    open(path, "w").write(new)

disk = '#[cfg(feature = "disk_storage")]'
both = '#[cfg(any(feature = "disk_storage", feature = "redis_storage"))]'

# Library: the key helpers the Redis store needs, without the disk store.
keys = "limitador/src/storage/keys.rs"
text = open(keys).read()
open(keys, "w").write(text.replace(disk + "\npub mod bin", "pub mod bin"))
counter = "limitador/src/counter.rs"
text = open(counter).read()
text = re.sub(r"    " + re.escape(disk) + r"\n(    pub(?:\(crate\))? fn variables_for_key)",
              "    " + both + r"\n\1", text)
open(counter, "w").write(text)

# Server: the disk store becomes a feature, off by default.
cargo = "limitador-server/Cargo.toml"
edit(cargo, r'limitador = \{ path = "\.\./limitador" \}',
     'limitador = { path = "../limitador", default-features = false, features = ["redis_storage"] }')
edit(cargo, r"\[features\]\n",
     '[features]\ndefault = []\ndisk_storage = ["limitador/disk_storage"]\n')
config = "limitador-server/src/config.rs"
edit(config, r"\n(    pub optimization: storage::disk::OptimizeFor,)",
     "\n    " + disk + r"\n\1")
main = "limitador-server/src/main.rs"
edit(main, r"\n(use limitador::storage::disk::DiskStorage;)", "\n" + disk + r"\n\1")
edit(main, r"\n(            StorageConfiguration::Disk\(cfg\) => Self::disk_limiter\(cfg\),)",
     "\n            " + disk + r"\n\1"
     "\n            #[cfg(not(feature = \"disk_storage\"))]"
     "\n            StorageConfiguration::Disk(_) => {"
     " eprintln!(\"this build has no disk storage\"); process::exit(1) }")
edit(main, r"\n(    fn disk_limiter\(cfg: DiskStorageConfiguration\) -> Self \{)",
     "\n    " + disk + r"\n\1")
text = open(main).read()
m = re.search(r"\n( +)optimization: match sub\.get_one::<String>\(\"OPTIMIZE\"\)", text)
if m and disk + "\n" + m.group(1) + "optimization" not in text:
    text = text[:m.start()] + "\n" + m.group(1) + disk + text[m.start():]
    open(main, "w").write(text)
PY

OPENSSL_NO_VENDOR=1 cargo build --release --quiet -p limitador-server 1>&2
echo "$work/target/release/limitador-server"
