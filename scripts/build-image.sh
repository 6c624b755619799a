#!/usr/bin/env bash
# Builds the OCI image NAME:TAG with podman, FROM scratch: a Debian bookworm
# root file system made by mmdebstrap from Debian's packages (no container
# registry needed), the package tree of scripts/package.sh in
# /opt/shardserve, a non-root user (10001), shardserve as the entrypoint
# taking tritonserver's flags, and a health check on /v2/health/ready.
#
#   scripts/build-image.sh NAME:TAG [ROOTFS_DIR]
#
# ROOTFS_DIR, when given, also receives the image's root file system (what
# tests/python/test_image.py runs in a chroot, since `podman run` is not
# allowed on the build VMs). Needs: mmdebstrap, podman (scripts/setup.sh
# installs both), a Debian mirror (MIRROR, default deb.debian.org; or
# SNAPSHOT=20261101T000000Z for snapshot.debian.org's archive of that
# moment), root (mmdebstrap's root mode).
#
# The Debian root file system (the slow part: minutes of downloads) is
# cached outside the source tree, in $SHARDSERVE_CACHE_DIR (default
# ${XDG_CACHE_HOME:-~/.cache}/shardserve), as rootfs-<key>.tar: the key is a
# hash of everything that goes into it (suite, mirror or snapshot, package
# list, customize hooks), so changing the package list rebuilds it. Without
# a SNAPSHOT the mirror moves on (security and point-release updates), so a
# cached tarball older than SHARDSERVE_ROOTFS_MAX_AGE_DAYS (default 30) is
# rebuilt too; SHARDSERVE_ROOTFS_REFRESH=1 rebuilds it now.
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 NAME:TAG [ROOTFS_DIR]" >&2
  exit 2
fi
tag=$1
export_dir=${2:+$(realpath -m "$2")}
cd "$(dirname "$0")/.."
for tool in mmdebstrap podman python3.11; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
if [ -n "${SNAPSHOT:-}" ]; then
  mirror=http://snapshot.debian.org/archive/debian/$SNAPSHOT
else
  mirror=${MIRROR:-http://deb.debian.org/debian}
fi
cache=${SHARDSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardserve}
max_age_days=${SHARDSERVE_ROOTFS_MAX_AGE_DAYS:-30}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
phase() { echo "build-image: $1 (${SECONDS} s)"; }

# The smallest set that runs both backends: libhwloc (shardserve),
# libstdc++ (ONNX Runtime), libpython3.11 (the Python backend's stub), bash for the health
# check. No apt, no shell users: the image is rebuilt, not upgraded.
mmdebstrap_args=(
  --variant=essential --mode=root --format=tar
  --include=libstdc++6,libgcc-s1,libhwloc15,libpython3.11,zlib1g,libexpat1,ca-certificates
  --customize-hook='echo "shardserve:x:10001:10001:shardserve:/opt/shardserve:/usr/sbin/nologin" >> "$1/etc/passwd"'
  --customize-hook='echo "shardserve:x:10001:" >> "$1/etc/group"'
  --customize-hook='mkdir -p "$1/models" && chown 10001:10001 "$1/models"'
  # The image runs as a non-root user, often on a read-only root file
  # system: Python cannot write bytecode there, so without it every start of
  # a Python model compiles the standard library again (seconds). Debian
  # compiles it in python3.11-minimal's postinst, which is not installed;
  # the build machine's Python 3.11 does it (same bytecode version).
  --customize-hook='python3.11 -m compileall -q -j0 --invalidation-mode checked-hash "$1/usr/lib/python3.11"'
  --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*'
  bookworm
)
key=$(printf '%s\n' "${mmdebstrap_args[@]}" "$mirror" | sha256sum | cut -c1-16)
rootfs_tar=$cache/rootfs-$key.tar
if [ -f "$rootfs_tar" ] && [ "${SHARDSERVE_ROOTFS_REFRESH:-0}" != 1 ] &&
  [ -z "$(find "$rootfs_tar" -mtime "+$max_age_days")" ]; then
  echo "build-image: Debian root file system from the cache: $rootfs_tar"
else
  mkdir -p "$cache"
  echo "build-image: making the Debian root file system (mmdebstrap, $mirror)"
  mmdebstrap "${mmdebstrap_args[@]}" "$work/rootfs.tar" "$mirror"
  # Renamed into place, so an interrupted build never leaves a partial
  # tarball under the cached name; other keys' tarballs are stale.
  mv "$work/rootfs.tar" "$rootfs_tar.partial"
  mv "$rootfs_tar.partial" "$rootfs_tar"
  find "$cache" -maxdepth 1 -name 'rootfs-*.tar' ! -name "rootfs-$key.tar" -delete
fi
# A hard link (same file system) or a copy: podman reads the build context.
ln "$rootfs_tar" "$work/rootfs.tar" 2>/dev/null || cp "$rootfs_tar" "$work/rootfs.tar"

phase "root file system ready"

scripts/package.sh "$work/shardserve.tar"
mkdir "$work/pkg"
tar -C "$work/pkg" -xf "$work/shardserve.tar"
rm "$work/shardserve.tar"
mv "$work/pkg"/shardserve-* "$work/opt-shardserve"
# The Python backend's own packages (numpy...) likewise: the package leaves
# the build tree's __pycache__ out.
if [ -d "$work/opt-shardserve/backends/python" ]; then
  python3.11 -m compileall -q -j0 --invalidation-mode checked-hash "$work/opt-shardserve/backends/python" ||
    echo "build-image: warning: some Python files of the backend did not compile" >&2
fi
phase "package staged"

cat > "$work/Containerfile" <<'CONTAINERFILE'
FROM scratch
ADD rootfs.tar /
COPY opt-shardserve /opt/shardserve
ENV PATH=/opt/shardserve/bin:/usr/bin:/bin
USER 10001:10001
WORKDIR /opt/shardserve
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
  CMD ["/bin/bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/8000 && printf 'GET /v2/health/ready HTTP/1.0\\r\\n\\r\\n' >&3 && head -n1 <&3 | grep -q ' 200 '"]
ENTRYPOINT ["/opt/shardserve/bin/shardserve"]
CMD ["--model-repository=/models"]
CONTAINERFILE

# The image this tag named before: replaced below, so it is removed then
# (rebuilding in CI would otherwise pile up a package-sized layer a run).
previous=$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
# Docker format: OCI images have no HEALTHCHECK. The rootfs layer comes from
# podman's layer cache when the tarball is unchanged.
podman build --layers --format docker --isolation chroot -t "$tag" -f "$work/Containerfile" "$work"
current=$(podman image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
  podman rmi "$previous" >/dev/null 2>&1 ||
    echo "build-image: the previous $tag ($previous) is still in use; left in place" >&2
fi
phase "image built"
echo "build-image: $tag ($(podman image inspect --format '{{.Size}}' "$tag") bytes)"

if [ -n "$export_dir" ]; then
  rm -rf "$export_dir"
  mkdir -p "$export_dir"
  ctr=$(podman create "$tag")
  # Through a file: podman 4.3's `export` to a pipe has been seen to write
  # nothing and exit 0 on this machine, where `-o FILE` wrote the image.
  podman export -o "$work/export.tar" "$ctr"
  podman rm -f "$ctr" >/dev/null
  tar -C "$export_dir" -xf "$work/export.tar"
  rm -f "$work/export.tar"
  phase "root file system exported to $export_dir"
fi
