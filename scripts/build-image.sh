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
# does not install them: `apt-get install mmdebstrap podman`), a Debian
# mirror (MIRROR, default deb.debian.org), root (mmdebstrap's root mode).
set -euo pipefail

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
  echo "usage: $0 NAME:TAG [ROOTFS_DIR]" >&2
  exit 2
fi
tag=$1
export_dir=${2:+$(realpath -m "$2")}
cd "$(dirname "$0")/.."
for tool in mmdebstrap podman; do
  command -v "$tool" >/dev/null || { echo "build-image: $tool is missing (apt-get install $tool)" >&2; exit 1; }
done
mirror=${MIRROR:-http://deb.debian.org/debian}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

scripts/package.sh "$work/shardserve.tar.gz"
mkdir "$work/pkg"
tar -C "$work/pkg" -xzf "$work/shardserve.tar.gz"
mv "$work/pkg"/shardserve-* "$work/opt-shardserve"

# The smallest set that runs both backends: libhwloc (shardserve),
# libstdc++ (ONNX Runtime), libpython3.11 (the Python backend's stub), bash for the health
# check. No apt, no shell users: the image is rebuilt, not upgraded.
mmdebstrap --variant=essential --mode=root --format=tar \
  --include=libstdc++6,libgcc-s1,libhwloc15,libpython3.11,zlib1g,libexpat1,ca-certificates \
  --customize-hook='echo "shardserve:x:10001:10001:shardserve:/opt/shardserve:/usr/sbin/nologin" >> "$1/etc/passwd"' \
  --customize-hook='echo "shardserve:x:10001:" >> "$1/etc/group"' \
  --customize-hook='mkdir -p "$1/models" && chown 10001:10001 "$1/models"' \
  --customize-hook='rm -rf "$1"/usr/share/doc/* "$1"/usr/share/man/* "$1"/usr/share/info/* "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm "$work/rootfs.tar" "$mirror"

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

# Docker format: OCI images have no HEALTHCHECK.
podman build --format docker --isolation chroot -t "$tag" -f "$work/Containerfile" "$work"
echo "build-image: $tag ($(podman image inspect --format '{{.Size}}' "$tag") bytes)"

if [ -n "$export_dir" ]; then
  rm -rf "$export_dir"
  mkdir -p "$export_dir"
  ctr=$(podman create "$tag")
  podman export "$ctr" | tar -C "$export_dir" -xf -
  podman rm -f "$ctr" >/dev/null
  echo "build-image: root file system exported to $export_dir"
fi
