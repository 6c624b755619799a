#!/usr/bin/env bash
# Makes a relocatable tarball of the shipped build: it runs from wherever it
# is unpacked and from any working directory, since the binary finds ONNX
# Runtime in <prefix>/lib and the backends in <prefix>/backends from its own
# location (docs/deploy.md).
#
#   scripts/package.sh OUT.tar.gz     (OUT.tar: uncompressed, for
#                                      scripts/build-image.sh, which
#                                      unpacks it at once)
#
#   shardserve-<version>-linux-<arch>/
#     bin/shardserve, bin/shardserve-bench   (stripped)
#     lib/libonnxruntime.so.<v> (+ libonnxruntime.so link)
#     backends/python/                       (Triton's Python backend: library,
#                                             stub for Python 3.11, numpy<2, and the
#                                             libraries the backend links)
#     tuning/  deploy/  docs/deploy.md  LICENSE  README.md  CHANGELOG.md
#
# Needs target/$PROFILE/{shardserve,shardserve-bench}: PROFILE=dist by
# default (`cargo build --profile dist --bins`: one codegen unit and fat
# LTO, 6-13 % fewer instructions per request than `release`, see
# Cargo.toml), PROFILE=release for the build the tests use; and what
# scripts/setup.sh installs (.ort, .backends/python). Either backend
# may be absent: the package then serves the other models and says which is
# missing. The target machine needs the build machine's glibc or newer,
# libhwloc 2 (Debian: libhwloc15) and libstdc++ (ONNX Runtime), and for
# Python models libpython3.11 (Debian bookworm: libpython3.11; the stub was
# built for 3.11).
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUT.tar.gz" >&2
  exit 2
fi
out=$(realpath -m "$1")
cd "$(dirname "$0")/.."

profile=${PROFILE:-dist}
for exe in "target/$profile/shardserve" "target/$profile/shardserve-bench"; do
  if [ ! -x "$exe" ]; then
    echo "package: $exe is missing (cargo build --profile $profile --bins)" >&2
    exit 1
  fi
done

version=$(sed -n 's/^version *= *"\(.*\)"/\1/p' Cargo.toml | head -n1)
name="shardserve-${version}-linux-$(uname -m)"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
pkg="$stage/$name"
mkdir -p "$pkg/bin" "$pkg/lib" "$pkg/backends"

for exe in shardserve shardserve-bench; do
  install -m 0755 "target/$profile/$exe" "$pkg/bin/$exe"
  # --strip-all keeps .dynsym: the TRITONSERVER_*/TRITONBACKEND_* functions
  # that backends bind to stay exported.
  strip --strip-all "$pkg/bin/$exe"
done

ort=$(readlink -f .ort/libonnxruntime.so 2>/dev/null || true)
if [ -n "$ort" ] && [ -f "$ort" ]; then
  cp "$ort" "$pkg/lib/"
  base=$(basename "$ort")
  [ "$base" = libonnxruntime.so ] || ln -s "$base" "$pkg/lib/libonnxruntime.so"
  # Loaded by ONNX Runtime itself for execution providers; harmless on CPU.
  shared="$(dirname "$ort")/libonnxruntime_providers_shared.so"
  [ -f "$shared" ] && cp "$shared" "$pkg/lib/"
else
  echo "package: warning: .ort/libonnxruntime.so is missing; the package will not serve ONNX models" >&2
fi

python_backend=$(readlink -f .backends/python 2>/dev/null || true)
if [ -n "$python_backend" ] && [ -e "$python_backend/libtriton_python.so" ]; then
  mkdir -p "$pkg/backends/python"
  # The wheel's layout is kept (libtriton_python.so finds its libraries
  # through RPATH $ORIGIN/../../../../nvidia_pytriton.libs). Left out: real
  # tritonserver (only for comparing behaviour in the build tree), caches.
  tar -C "$python_backend" -cf - \
    --exclude=./pytriton/tritonserver/bin \
    --exclude=__pycache__ \
    --exclude=./bin \
    --exclude=./.installed \
    . | tar -C "$pkg/backends/python" -xf -
else
  echo "package: warning: .backends/python is missing; the package will not serve Python models" >&2
fi

cp -r tuning "$pkg/tuning"
for f in LICENSE README.md CHANGELOG.md; do
  cp "$f" "$pkg/"
done
mkdir -p "$pkg/docs"
[ -f docs/deploy.md ] && cp docs/deploy.md "$pkg/docs/"
[ -d deploy ] && cp -r deploy "$pkg/deploy"

mkdir -p "$(dirname "$out")"
compress=(-I gzip)
command -v pigz >/dev/null && compress=(-I pigz)
case "$out" in *.tar) compress=() ;; esac
tar -C "$stage" --owner=0 --group=0 --numeric-owner --sort=name \
  "${compress[@]}" -cf "$out" "$name"
echo "package: $out ($(du -h "$out" | cut -f1), unpacks to $(du -sh "$pkg" | cut -f1))"
