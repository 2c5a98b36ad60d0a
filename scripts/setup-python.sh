#!/usr/bin/env bash
# Makes the Python environment the PyTorch side of VirtualFlow needs: PyTorch (the PyPI build,
# which brings its own CUDA runtime, cuBLAS and NCCL wheels), nanobind and scikit-build-core to
# build the virtualflow package, Pillow for examples/torch/images.py, pytest for its tests, ruff
# and mypy for the lint.python test
# (tests/lint/check_python.sh). A virtual environment in the cache
# directory, made once and remade only when the pins below change. Prints its python's path.
#
# usage: scripts/setup-python.sh             installs if needed; prints the interpreter
#        VF_PYTHON_ENV=off ...               prints nothing (no PyTorch side)
set -euo pipefail

[ "${VF_PYTHON_ENV:-on}" = "off" ] && exit 0

# The CUDA compiler wheels are those of the release whose runtime, cuBLAS and NCCL torch pulls
# (CUDA 13.2: nvidia-cuda-runtime 13.2.86): with them the environment is the one CUDA toolkit
# the C++ build uses too (scripts/setup-cuda.sh), so one set of CUDA libraries is installed.
PINS=(
  torch==2.15.0 numpy==2.4.6 pillow==13.0.0
  nvidia-cuda-nvcc==13.2.86 nvidia-cuda-crt==13.2.86 nvidia-nvvm==13.2.86
  nanobind==3.1.0 scikit-build-core==1.1.2
  pytest==9.2.0 ruff==0.17.6 mypy==2.4.1
)
cache="${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}"
env_dir="$cache/py"
stamp="$env_dir/.virtualflow-pins"
log() { echo "setup-python: $*" >&2; }

if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${PINS[*]}" ]; then
  command -v python3 >/dev/null || { log "python3 is needed"; exit 1; }
  # The stamp is written last, so an interrupted install is redone; the lock keeps two builds
  # of this checkout or another from installing at once.
  mkdir -p "$cache"
  exec 9>"$cache/.py.lock"
  flock 9
  if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "${PINS[*]}" ]; then
    log "installing ${PINS[*]} into $env_dir (about 5 GB with PyTorch's CUDA wheels, once)"
    [ -d "$env_dir" ] || python3 -m venv "$env_dir" >&2
    "$env_dir/bin/python" -m pip install --quiet --disable-pip-version-check \
      --root-user-action=ignore "${PINS[@]}" >&2
    echo "${PINS[*]}" > "$stamp"
  fi
  flock -u 9
fi
echo "$env_dir/bin/python"
