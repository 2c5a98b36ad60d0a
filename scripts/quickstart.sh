#!/usr/bin/env bash
# One command on a fresh machine: install what the built-in example needs, build vf and the
# agent, and train examples/fashion-mnist.yaml locally with elastic-ready workers. Extra arguments
# go to `vf run` (e.g. --workers 4). Idempotent: a second run installs and builds nothing new.
#
# Only what the example takes: the Debian packages for building vf and virtualflow-agent and the
# dataset (scripts/setup.sh example), no PyTorch environment, no tests. The GPU code (the CUDA
# toolkit, ~1 GB of wheels when the machine has none, and the CUDA plugin) only on a machine with
# an NVIDIA GPU; VF_CUDA=on or off decides instead. scripts/test.sh installs and builds everything.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
if [ -z "${VF_CUDA:-}" ]; then
  if [ -e /dev/nvidia0 ] || nvidia-smi -L >/dev/null 2>&1; then
    VF_CUDA=on
  else
    VF_CUDA=off
    echo "quickstart: no NVIDIA GPU: building for the CPU only (no CUDA toolkit, no GPU plugin)"
  fi
fi
export VF_CUDA
"$root/scripts/setup.sh" example
targets=(vf virtualflow-agent)
if [ -f "$build/build.ninja" ]; then
  # A tree configured before (by scripts/build.sh, scripts/test.sh or an earlier quick start) is
  # built as it is: configuring it for the example alone would drop its tests or GPU code.
  ninja -C "$build" "${targets[@]}"
else
  VF_PYTHON_ENV=off VF_TESTS=off "$root/scripts/build.sh" "${targets[@]}"
fi
exec "$build/bin/vf" run "$root/examples/fashion-mnist.yaml" "$@"
