#!/usr/bin/env bash
# Installs everything shardserve needs on a fresh Debian 12 machine, idempotently:
# Debian packages, a Python venv (.venv) with ONNX Runtime and tritonclient,
# the ONNX Runtime library linked at .ort/libonnxruntime.so, Triton's Python
# backend in .backends/python (scripts/install_python_backend.sh), and a
# release build.
# Usage: scripts/setup.sh [--no-build]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

APT_PACKAGES=(pkg-config libhwloc-dev libudev-dev wrk nghttp2-client python3-venv binutils libpython3.11 gcc openssl)
# scripts/build-image.sh and tests/python/test_image.py: the image's Debian
# root file system and the image itself.
APT_PACKAGES+=(mmdebstrap podman)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
stamp=.venv/.requirements.sha
want=$(sha256sum scripts/requirements.txt | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "setup: installing Python packages"
  .venv/bin/pip install -q -r scripts/requirements.txt
  echo "$want" > "$stamp"
fi

# The KServe SDK's models (tests/python/test_deploy.py), in a venv of their
# own under the cache (outside the source tree, so a fresh clone in CI reuses
# it), named by the hash of its requirements: a changed pin makes a new one.
# tests/python/kserve_models.py finds it by the same rule.
cache=${SHARDSERVE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardserve}
kserve_venv=$cache/kserve-sdk-$(sha256sum scripts/requirements-kserve.txt | cut -c1-16)
if [ ! -f "$kserve_venv/.complete" ]; then
  echo "setup: installing the KServe SDK's models into $kserve_venv"
  rm -rf "$kserve_venv"
  mkdir -p "$cache"
  python3 -m venv "$kserve_venv"
  "$kserve_venv/bin/pip" install -q --no-deps -r scripts/requirements-kserve.txt
  touch "$kserve_venv/.complete"
  # Earlier pins' venvs are stale.
  find "$cache" -maxdepth 1 -name 'kserve-sdk-*' ! -path "$kserve_venv" -exec rm -rf {} +
fi

# Where a GPU is present, the GPU build of ONNX Runtime replaces the CPU one
# (same package directory and library name; it carries the CUDA execution
# provider that KIND_GPU instances register). The [cuda,cudnn] extras bring
# the CUDA 12 and cuDNN libraries as wheels. Not run on a GPU machine by this
# project yet: written from the packages' documentation.
ORT_GPU="onnxruntime-gpu[cuda,cudnn]==1.31.1"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  if ! .venv/bin/pip show onnxruntime-gpu >/dev/null 2>&1; then
    echo "setup: a GPU is present: installing $ORT_GPU in place of onnxruntime"
    .venv/bin/pip uninstall -q -y onnxruntime || true
    .venv/bin/pip install -q "$ORT_GPU"
  fi
fi

lib=$(ls "$root"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n1 || true)
if [ -z "$lib" ]; then
  echo "setup: the onnxruntime wheel holds no libonnxruntime.so.*" >&2
  exit 1
fi
mkdir -p .ort
ln -sf "$lib" .ort/libonnxruntime.so

scripts/install_python_backend.sh

if [ "${1:-}" != "--no-build" ]; then
  echo "setup: building (release)"
  cargo build --release --bins
fi
echo "setup: done"
