#!/usr/bin/env bash
# Makes a CUDA toolkit (compiler, runtime, cuBLAS) and NCCL available to the build, and prints
# the CMake arguments that use them, one per line. Idempotent.
#
# A machine with its own toolkit (nvcc on PATH, or in $CUDA_HOME) keeps it; NCCL then comes from
# $NCCL_ROOT, the system (nccl.h in /usr/include) or the Python `nvidia.nccl` package. Otherwise
# the official Python wheels of one CUDA 13.0 release are installed with pip into a cache
# directory (~1 GB, once) and arranged as a toolkit: nvcc looks for lib64/, and CMake's
# find_library for the unversioned library names. No GPU or driver is needed to build.
#
# usage: scripts/setup-cuda.sh            installs if needed; prints the CMake arguments
#        VF_CUDA=off scripts/setup-cuda.sh prints nothing (a CPU-only build)
set -euo pipefail

[ "${VF_CUDA:-on}" = "off" ] && exit 0

# The pins: CUDA 13.0 Update 2 and the NCCL built for CUDA 13.
WHEELS=(
  nvidia-cuda-nvcc==13.0.88 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88
  nvidia-cuda-runtime==13.0.96 nvidia-cuda-cccl==13.0.85 nvidia-cublas==13.0.2.14
  nvidia-nccl-cu13==2.28.9
)
cache="${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}/cuda-13.0.2"

log() { echo "setup-cuda: $*" >&2; }

nvcc=""
if [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  nvcc="$CUDA_HOME/bin/nvcc"
elif command -v nvcc >/dev/null; then
  nvcc="$(command -v nvcc)"
elif [ -x /usr/local/cuda/bin/nvcc ]; then
  nvcc=/usr/local/cuda/bin/nvcc
fi

nccl_root="${NCCL_ROOT:-}"
if [ -z "$nccl_root" ] && [ -n "$nvcc" ]; then
  if [ -f /usr/include/nccl.h ]; then
    nccl_root=/usr
  else
    # The wheel's nvidia/nccl is a namespace package: no __file__, one __path__ entry.
    nccl_root="$(python3 -c 'import nvidia.nccl as m; print(list(m.__path__)[0])' 2>/dev/null || true)"
  fi
fi

if [ -z "$nvcc" ] || [ -z "$nccl_root" ]; then
  if [ ! -f "$cache/.complete" ]; then
    command -v python3 >/dev/null || { log "python3 is needed to install the CUDA wheels"; exit 1; }
    log "installing CUDA 13.0 and NCCL wheels into $cache (about 1 GB, once)"
    rm -rf "$cache.tmp"
    mkdir -p "$(dirname "$cache")"
    # --target touches no installed package, so a Python marked externally managed is fine.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$cache.tmp" \
      "${WHEELS[@]}" >&2
    cu="$cache.tmp/nvidia/cu13"
    ln -sfn lib "$cu/lib64"
    for lib in "$cu"/lib/lib*.so.* "$cache.tmp"/nvidia/nccl/lib/lib*.so.*; do
      ln -sfn "$(basename "$lib")" "${lib%%.so.*}.so"
    done
    touch "$cache.tmp/.complete"
    rm -rf "$cache"
    mv "$cache.tmp" "$cache"
  fi
  [ -n "$nvcc" ] || nvcc="$cache/nvidia/cu13/bin/nvcc"
  [ -n "$nccl_root" ] || nccl_root="$cache/nvidia/nccl"
fi

"$nvcc" --version >/dev/null || { log "$nvcc does not run"; exit 1; }
echo "-DVF_WITH_CUDA=ON"
echo "-DVF_WITH_NCCL=ON"
echo "-DCMAKE_CUDA_COMPILER=$nvcc"
echo "-DVF_NCCL_ROOT=$nccl_root"
