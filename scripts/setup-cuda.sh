#!/usr/bin/env bash
# Makes a CUDA toolkit (compiler, runtime, cuBLAS) and NCCL available to the build, and prints
# the CMake arguments that use them, one per line. Idempotent.
#
# A machine with its own toolkit (nvcc on PATH, or in $CUDA_HOME) keeps it; NCCL then comes from
# $NCCL_ROOT, the system (nccl.h in /usr/include) or the Python `nvidia.nccl` package. Otherwise
# the CUDA wheels PyTorch uses are the toolkit: with $VF_PYTHON, the interpreter of the
# environment scripts/setup-python.sh made (which adds the compiler of the same release), its
# nvidia/cu13 and nvidia/nccl; without it (VF_PYTHON_ENV=off: images, the quickstart), the same
# pinned wheels installed with pip into a cache directory (~1 GB, once). Either way they are
# arranged as a toolkit: nvcc looks for lib64/, and CMake's find_library for the unversioned
# library names. No GPU or driver is needed to build.
#
# usage: scripts/setup-cuda.sh            installs if needed; prints the CMake arguments
#        VF_CUDA=off scripts/setup-cuda.sh prints nothing (a CPU-only build)
set -euo pipefail

[ "${VF_CUDA:-on}" = "off" ] && exit 0

# The pins: what torch==2.15.0 pulls (CUDA 13.2's runtime, cuBLAS, CCCL and NCCL for CUDA 13),
# with the compiler of the same release. scripts/setup-python.sh pins the same compiler.
WHEELS=(
  nvidia-cuda-nvcc==13.2.86 nvidia-cuda-crt==13.2.86 nvidia-nvvm==13.2.86
  nvidia-cuda-runtime==13.2.86 nvidia-cuda-cccl==13.3.5.0.6 nvidia-cublas==13.4.1.3
  nvidia-nccl-cu13==2.30.7
)
cache="${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}/cuda-13.2"

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

# Links that make a tree of CUDA wheels a toolkit: lib64/ beside lib/, and the unversioned
# library names. Idempotent.
arrange() {
  local cu="$1/nvidia/cu13" lib
  ln -sfn lib "$cu/lib64"
  for lib in "$cu"/lib/lib*.so.* "$1"/nvidia/nccl/lib/lib*.so.*; do
    [ -e "${lib%%.so.*}.so" ] || ln -sfn "$(basename "$lib")" "${lib%%.so.*}.so"
  done
}

if [ -z "$nvcc" ] && [ -n "${VF_PYTHON:-}" ]; then
  site="$("$VF_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  if [ -x "$site/nvidia/cu13/bin/nvcc" ] && [ -d "$site/nvidia/nccl" ]; then
    arrange "$site"
    nvcc="$site/nvidia/cu13/bin/nvcc"
    nccl_root="$site/nvidia/nccl"
  fi
fi

if [ -z "$nvcc" ] || [ -z "$nccl_root" ]; then
  if [ ! -f "$cache/.complete" ]; then
    command -v python3 >/dev/null || { log "python3 is needed to install the CUDA wheels"; exit 1; }
    log "installing CUDA 13.2 and NCCL wheels into $cache (about 1 GB, once)"
    rm -rf "$cache.tmp"
    mkdir -p "$(dirname "$cache")"
    # --target touches no installed package, so a Python marked externally managed is fine.
    PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --target "$cache.tmp" \
      "${WHEELS[@]}" >&2
    arrange "$cache.tmp"
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
