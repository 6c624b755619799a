#!/usr/bin/env bash
# Installs Triton's Python backend, unchanged, into .backends/python from the
# nvidia-pytriton wheel (PyPI), idempotently. Called by scripts/setup.sh.
#
# The wheel's layout is kept below .backends/python, because the backend
# library finds its own dependencies (libtritonserver-*.so, libarchive,
# libcudart) through RPATH $ORIGIN/../../../../nvidia_pytriton.libs:
#
#   .backends/python/
#     libtriton_python.so -> pytriton/tritonserver/backends/python/libtriton_python.so
#     triton_python_backend_stub -> pytriton/tritonserver/python_backend_stubs/3.11/...
#     triton_python_backend_utils.py        (the stub puts this folder on sys.path)
#     numpy/ ...                            (numpy<2, which the 3.11 stub was built for)
#     pytriton/tritonserver/{backends/python,python_backend_stubs/3.11,bin}/
#     nvidia_pytriton.libs/
#
# shardserve dlopens the library through its canonical path (so $ORIGIN is the
# wheel's folder) and exports every TRITONSERVER_*/TRITONBACKEND_* function
# itself: the executable comes first in the lookup scope, so the library binds
# to ours, not to the libtritonserver it also links. The stub needs the
# system's libpython3.11 (Debian package libpython3.11, see setup.sh).
# pytriton/tritonserver/bin/tritonserver is real Triton 2.51, kept to compare
# behaviour (README: "Comparing with Triton").
set -euo pipefail
cd "$(dirname "$0")/.."

PYTRITON_VERSION=0.7.0
STUB_PYTHON=3.11
NUMPY_SPEC='numpy<2'
dest=.backends/python
cache=.backends/.cache
stamp="$dest/.installed"
want="nvidia-pytriton==$PYTRITON_VERSION stub=$STUB_PYTHON $NUMPY_SPEC"

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -e "$dest/libtriton_python.so" ]; then
  exit 0
fi
pip=.venv/bin/pip
python=.venv/bin/python
if [ ! -x "$pip" ]; then
  echo "install_python_backend: $pip is missing (run scripts/setup.sh)" >&2
  exit 1
fi

mkdir -p "$cache"
wheel=$(ls "$cache"/nvidia_pytriton-"$PYTRITON_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "setup: downloading nvidia-pytriton $PYTRITON_VERSION (Triton's Python backend)"
  "$pip" download -q --no-deps "nvidia-pytriton==$PYTRITON_VERSION" -d "$cache"
  wheel=$(ls "$cache"/nvidia_pytriton-"$PYTRITON_VERSION"-*.whl | head -n1)
fi

echo "setup: installing the Python backend into $dest"
rm -rf "$dest"
mkdir -p "$dest"
"$python" - "$wheel" "$dest" "$STUB_PYTHON" <<'EOF'
import os, stat, sys, zipfile

wheel, dest, stub_python = sys.argv[1:4]
keep = (
    "pytriton/tritonserver/backends/python/",
    f"pytriton/tritonserver/python_backend_stubs/{stub_python}/",
    "pytriton/tritonserver/bin/",
    "nvidia_pytriton.libs/",
)
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        if info.is_dir() or not info.filename.startswith(keep):
            continue
        path = z.extract(info, dest)
        mode = (info.external_attr >> 16) & 0o777
        executable = info.filename.endswith(("tritonserver", "_stub"))
        if mode or executable:
            os.chmod(path, (mode or 0o644) | (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH if executable else 0))
EOF
ln -s pytriton/tritonserver/backends/python/libtriton_python.so "$dest/libtriton_python.so"
ln -s "pytriton/tritonserver/python_backend_stubs/$STUB_PYTHON/triton_python_backend_stub" \
  "$dest/triton_python_backend_stub"
cp "$dest/pytriton/tritonserver/backends/python/triton_python_backend_utils.py" "$dest/"
"$pip" install -q --no-deps --target "$dest" --cache-dir "$cache/pip" "$NUMPY_SPEC"
echo "$want" > "$stamp"
