#!/usr/bin/env bash
# Configures and builds VirtualFlow into build/ (or $VF_BUILD_DIR). Extra arguments are ninja
# targets (default: everything). The CUDA device and the NCCL communicator are built whenever
# scripts/setup-cuda.sh finds or installs a toolkit (no GPU needed); VF_CUDA=off builds for
# the CPU only.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
mapfile -t cuda_args < <("$root/scripts/setup-cuda.sh")
if [ "${#cuda_args[@]}" -eq 0 ]; then
  cuda_args=(-DVF_WITH_CUDA=OFF -DVF_WITH_NCCL=OFF)
fi
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVF_BUILD_TESTS=ON -DVF_SANITIZER_TESTS=ON -DVF_WERROR=ON "${cuda_args[@]}" >/dev/null
grep -E "^VF_WITH_(CUDA|NCCL):" "$build/CMakeCache.txt" | sed 's/^/build: /'
jobs="${VF_BUILD_JOBS:-$(nproc)}"
ninja -C "$build" -j "$jobs" "$@"
