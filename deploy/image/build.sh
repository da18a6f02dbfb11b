#!/usr/bin/env bash
# Usage: deploy/image/build.sh ARCH OUT.tar
#
# Writes the Sluice container image for ARCH (amd64 or arm64) to OUT.tar as
# an OCI image archive (`oci-archive`), without a Docker daemon:
#
#   /sluice                               the static service binary (0755)
#   /bin/ratelimit -> /sluice             Envoy Gateway runs /bin/ratelimit
#   /etc/sluice/rules/example.yaml        the example rules, where CMD reads them
#   /etc/ssl/certs/ca-certificates.crt    CA certificates, for rediss:// and OTLP
#   /etc/passwd, /etc/group               root and nonroot (65532), nothing else
#
# No shell, no package manager, no C library: one layer on an empty base.
# It runs as user 65532:65532, with ENTRYPOINT ["/sluice"], CMD ["serve",
# "--rules", "/etc/sluice/rules"], and exposes 8081 (gRPC) and 8080 (admin
# HTTP), as deploy/kubernetes and deploy/envoy-gateway expect.
#
# The image is assembled with umoci (an OCI layout, one layer archive made
# by tar with fixed owners and times, the config and annotations) and
# written out by skopeo. Load it with `skopeo copy oci-archive:OUT.tar
# docker-daemon:sluice:VERSION` or `podman load -i OUT.tar`, or push it with
# `skopeo copy oci-archive:OUT.tar docker://REGISTRY/sluice:VERSION`.
#
# Environment:
#   SLUICE_BINARY        a static binary to ship instead of building one
#                        (deploy/image/binary.sh ARCH builds it)
#   SLUICE_PROFILE       the cargo profile binary.sh builds (default: dist)
#   SLUICE_IMAGE_SOURCE  org.opencontainers.image.source (default: the
#                        `repository` of Cargo.toml; a checkout's git remote
#                        may be a local path, so it is not used)
#   SOURCE_DATE_EPOCH    the image's creation time (default: HEAD's commit
#                        time), so that two builds of one commit are equal
# Missing Debian packages (umoci, skopeo, and the compilers binary.sh needs)
# are installed when running as root; otherwise the script says how.
set -euo pipefail
cd "$(dirname "$0")/../.."

say() { echo "deploy/image/build.sh: $*" >&2; }

if [ $# -ne 2 ] || { [ "$1" != amd64 ] && [ "$1" != arm64 ]; }; then
  say "usage: deploy/image/build.sh amd64|arm64 OUT.tar"
  exit 2
fi
arch="$1"
out="$2"
case "$out" in /*) ;; *) out="$PWD/$out" ;; esac

missing=()
for tool in umoci skopeo; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    say "installing ${missing[*]} ..."
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    say "${missing[*]} not found: install them (sudo apt-get install ${missing[*]}) and run again."
    exit 1
  fi
fi
certs=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$certs" ]; then
  say "$certs not found: install ca-certificates (sudo apt-get install ca-certificates) and run again."
  exit 1
fi

# --- the binary ------------------------------------------------------------
if [ -n "${SLUICE_BINARY:-}" ]; then
  binary="$SLUICE_BINARY"
  if LC_ALL=C readelf -lW "$binary" | grep -q INTERP; then
    say "SLUICE_BINARY=$binary is dynamically linked; the image needs a static binary."
    exit 1
  fi
else
  binary="$(deploy/image/binary.sh "$arch")"
fi

# --- what the image says about itself --------------------------------------
# The checkout may belong to another user (a container, CI as root).
git() { command git -c safe.directory="$PWD" "$@"; }
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -1)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
  SOURCE_DATE_EPOCH="$(git log -1 --format=%ct 2>/dev/null || date +%s)"
fi
created="$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)"
source_url="${SLUICE_IMAGE_SOURCE:-$(sed -n 's/^repository = "\(.*\)"$/\1/p' Cargo.toml | head -1)}"
description="$(sed -n 's/^description = "\(.*\)"$/\1/p' Cargo.toml | head -1)"

# --- the root filesystem, as one layer --------------------------------------
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
mkdir -p "$root/bin" "$root/etc/sluice/rules" "$root/etc/ssl/certs"
install -m 0755 "$binary" "$root/sluice"
ln -s /sluice "$root/bin/ratelimit"
install -m 0644 examples/rules.yaml "$root/etc/sluice/rules/example.yaml"
install -m 0644 "$certs" "$root/etc/ssl/certs/ca-certificates.crt"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >"$root/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$root/etc/group"
chmod 0644 "$root/etc/passwd" "$root/etc/group"
find "$root" -type d -exec chmod 0755 {} +
# Owned by root, dated SOURCE_DATE_EPOCH, in name order: the same bytes on
# every build of one commit.
(cd "$root" && tar --create --file "$work/layer.tar" --sort=name --numeric-owner \
  --owner=0 --group=0 --mtime="@$SOURCE_DATE_EPOCH" --format=pax \
  --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime ./*)

# --- the image ---------------------------------------------------------------
layout="$work/oci"
image="$layout:$version"
umoci init --layout "$layout"
umoci new --image "$image"
umoci raw add-layer --image "$image" --history.created "$created" \
  --history.created_by "deploy/image/build.sh $arch" "$work/layer.tar"
annotations=(
  "org.opencontainers.image.title=sluice"
  "org.opencontainers.image.description=$description"
  "org.opencontainers.image.source=$source_url"
  "org.opencontainers.image.version=$version"
  "org.opencontainers.image.revision=$revision"
  "org.opencontainers.image.licenses=Apache-2.0"
  "org.opencontainers.image.created=$created"
)
config=(
  --architecture "$arch" --os linux --created "$created" --no-history
  --config.user 65532:65532 --config.workingdir /
  --config.entrypoint /sluice
  --config.cmd serve --config.cmd --rules --config.cmd /etc/sluice/rules
  --config.exposedports 8081/tcp --config.exposedports 8080/tcp
  --clear config.env
)
for annotation in "${annotations[@]}"; do
  config+=(--config.label "$annotation" --manifest.annotation "$annotation")
done
umoci config --image "$image" "${config[@]}"
umoci gc --layout "$layout"

# A local copy of a local image: no signatures to ask for, whatever the
# machine's containers policy says.
echo '{"default":[{"type":"insecureAcceptAnything"}]}' >"$work/policy.json"
rm -f "$out"
skopeo --policy "$work/policy.json" copy --quiet "oci:$image" "oci-archive:$out:$version"
say "wrote $out: sluice $version ($revision) for linux/$arch"
