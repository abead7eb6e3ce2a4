#!/usr/bin/env bash
# Build a Debian bookworm base image with python3 from Debian's packages alone, for machines
# that cannot pull images from a registry (the raftkv image builds on it with
# `--build-arg BASE_IMAGE=<this tag>`).
#
#   deploy/build-base-image.sh [--force] [TAG]        (default TAG: raftkv-base:bookworm)
#
# Idempotent and cached: when TAG already exists it prints so and exits 0 (--force rebuilds).
# Needs root, debootstrap and docker. The Debian mirror is the first one found in this host's
# apt sources; set DEBIAN_MIRROR=<url> to choose another (e.g. on a non-Debian host).
# Image contents: debootstrap's minbase variant plus python3, python3-venv, ca-certificates
# and curl; apt lists and downloaded .debs are removed to keep it small (~150 MB).
set -euo pipefail

force=0
if [ "${1:-}" = "--force" ]; then force=1; shift; fi
tag="${1:-${RAFTKV_BASE_IMAGE:-raftkv-base:bookworm}}"
suite="${DEBIAN_SUITE:-bookworm}"
packages="python3,python3-venv,ca-certificates,curl"

log() { echo "build-base-image: $*" >&2; }

if [ "$force" = 0 ] && docker image inspect "$tag" >/dev/null 2>&1; then
  log "$tag exists, nothing to do (--force rebuilds it)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  log "debootstrap needs root (run with sudo)"; exit 1
fi
command -v debootstrap >/dev/null || { log "debootstrap is missing (apt-get install debootstrap)"; exit 1; }

mirror="${DEBIAN_MIRROR:-}"
if [ -z "$mirror" ]; then
  # deb822 sources (URIs: ...) first, then one-line sources (deb URL suite ...); skip the
  # security archive, which does not carry the main suite.
  mirror="$( { grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}';
               grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
                 awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}'; } |
             grep -v -- '-security' | head -n 1 || true)"
fi
if [ -z "$mirror" ]; then
  log "no Debian mirror found in /etc/apt/sources*; set DEBIAN_MIRROR=<url>"; exit 1
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/raftkv-rootfs.XXXXXX")"
trap 'rm -rf "$work"' EXIT
rootfs="$work/rootfs"
start=$(date +%s)
log "debootstrap $suite (minbase + $packages) from $mirror into $rootfs"
debootstrap --variant=minbase --include="$packages" "$suite" "$rootfs" "$mirror"

log "trimming apt caches"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
  "$rootfs"/var/log/*.log "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
# A container gets its own resolv.conf and hostname from the engine.
: >"$rootfs/etc/resolv.conf"
: >"$rootfs/etc/hostname"

log "importing as $tag"
tar --numeric-owner -C "$rootfs" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  --message "debootstrap --variant=minbase $suite + $packages" \
  - "$tag" >/dev/null
log "$tag built in $(( $(date +%s) - start )) s ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.0f MB", $1 / 1e6}'))"
