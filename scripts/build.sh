#!/usr/bin/env bash
# Configures and builds VirtualFlow into build/ (or $VF_BUILD_DIR). Extra arguments are ninja
# targets (default: everything).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DVF_BUILD_TESTS=ON -DVF_SANITIZER_TESTS=ON -DVF_WERROR=ON >/dev/null
jobs="${VF_BUILD_JOBS:-$(nproc)}"
ninja -C "$build" -j "$jobs" "$@"
