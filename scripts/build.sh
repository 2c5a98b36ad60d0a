#!/usr/bin/env bash
# Configures and builds VirtualFlow into build/ (or $VF_BUILD_DIR). Extra arguments are ninja
# targets (default: everything). The CUDA device and the NCCL communicator are built whenever
# scripts/setup-cuda.sh finds or installs a toolkit (no GPU needed); VF_CUDA=off builds for
# the CPU only. VF_TESTS=off configures a tree without the tests (scripts/quickstart.sh: their
# libraries need not be installed).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
# The Python environment with PyTorch for the virtualflow package (VF_PYTHON_ENV=off: none).
python_env="$("$root/scripts/setup-python.sh")"
# The CUDA toolkit: the machine's, else that environment's CUDA wheels (one set for PyTorch and
# the C++ build), else the same wheels in a cache.
mapfile -t cuda_args < <(VF_PYTHON="$python_env" "$root/scripts/setup-cuda.sh")
if [ "${#cuda_args[@]}" -eq 0 ]; then
  cuda_args=(-DVF_WITH_CUDA=OFF -DVF_WITH_NCCL=OFF)
fi
# Compiler cache: rebuilding sources already compiled once (a fresh clone of a commit built
# before, a branch switched back) takes a minute instead of a quarter of an hour on 2 cores.
# Paths under the checkout are hashed relative to it, so clones in different directories share
# the cache; the launcher carries the settings, so plain `ninja -C build` uses them too.
# VF_CCACHE=off builds without it.
launcher=()
if [ "${VF_CCACHE:-on}" != off ] && command -v ccache >/dev/null; then
  ccache_dir="${CCACHE_DIR:-${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}/ccache}"
  env_launcher="env;CCACHE_DIR=$ccache_dir;CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true;ccache"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$env_launcher" -DCMAKE_CUDA_COMPILER_LAUNCHER="$env_launcher"
            -DVF_CCACHE_DIR="$ccache_dir")
else
  launcher=(-UCMAKE_CXX_COMPILER_LAUNCHER -UCMAKE_CUDA_COMPILER_LAUNCHER -UVF_CCACHE_DIR)
fi
# CMake cannot switch an existing build to another CUDA compiler: it deletes its cache and
# configures again without the options below. Start from a clean cache instead (ccache keeps
# the rebuild short).
for arg in "${cuda_args[@]}"; do
  case "$arg" in
    -DCMAKE_CUDA_COMPILER=*)
      if [ -f "$build/CMakeCache.txt" ] &&
         ! grep -qxF "CMAKE_CUDA_COMPILER:FILEPATH=${arg#*=}" "$build/CMakeCache.txt" &&
         grep -q "^CMAKE_CUDA_COMPILER:" "$build/CMakeCache.txt"; then
        echo "build: the CUDA compiler changed to ${arg#*=}; configuring from scratch" >&2
        rm -rf "$build/CMakeCache.txt" "$build/CMakeFiles"
      fi ;;
  esac
done
tests=ON
if [ "${VF_TESTS:-on}" = off ]; then tests=OFF; fi
# --no-warn-unused-cli: a tree without the tests or the Python package does not read every option
# given here (VF_CCACHE_DIR), which is no mistake worth a warning.
cmake -S "$root" -B "$build" -G Ninja --no-warn-unused-cli \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVF_BUILD_TESTS=$tests -DVF_SANITIZER_TESTS=$tests -DVF_WERROR=ON -DVF_PYTHON="$python_env" "${cuda_args[@]}" "${launcher[@]}" >/dev/null
grep -E "^VF_WITH_(CUDA|NCCL):" "$build/CMakeCache.txt" | sed 's/^/build: /'
jobs="${VF_BUILD_JOBS:-$(nproc)}"
ninja -C "$build" -j "$jobs" "$@"
# The fuzzers (libFuzzer needs clang; scripts/setup.sh installs it) in a tree of their own,
# which the main tree's fuzz.* tests run. Only with the full build: named targets build alone.
# VF_FUZZ=off skips them.
if [ "$#" -eq 0 ] && [ "${VF_FUZZ:-on}" != off ]; then
  clang_cxx="$(command -v clang++-14 || command -v clang++ || true)"
  if [ -z "$clang_cxx" ]; then
    echo "build: no clang++ for the fuzzers (scripts/setup.sh installs clang-14)" >&2
    exit 1
  fi
  cmake -S "$root" -B "$build/fuzz" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="$clang_cxx" -DCMAKE_C_COMPILER="${clang_cxx/clang++/clang}" \
    -DVF_FUZZ=ON -DVF_BUILD_TESTS=OFF -DVF_WITH_CUDA=OFF -DVF_WITH_NCCL=OFF -DVF_PYTHON= \
    "${launcher[@]}" >/dev/null
  ninja -C "$build/fuzz" -j "$jobs" vf_fuzzers
fi
