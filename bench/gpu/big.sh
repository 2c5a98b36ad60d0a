#!/usr/bin/env bash
# ResNet-50 and GPT-2 small through virtualflow.torch against plain, deterministic and compiled
# PyTorch and DDP, on a machine with an NVIDIA GPU, in one call (bench/torch/big.py says what it
# measures). It needs .gpu-py/ and .gpu-deps/ (bench/gpu/bundle.sh && bench/gpu/bundle_python.sh,
# made where the Debian packages are, carried along); the library's Python sources are taken
# from this working tree, so a change to them needs no new bundle.
#
#   VF_BIG_SECONDS=430 bench/gpu/big.sh      # results in $OUT (or build-gpu/big)
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/build-gpu/big}"
mkdir -p "$out"
cp python/virtualflow/*.py .gpu-py/python/virtualflow/
# shellcheck disable=SC1091
source .gpu-py/env.sh || exit 1
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  nproc
} 2>&1 | tee "$out/machine.txt"
PYTHONUNBUFFERED=1 python3 bench/torch/big.py --vf "$root/.gpu-py/bin/vf" --out "$out" \
  --budget "${VF_BIG_SECONDS:-430}" "$@"
rc=$?
(cd "$out" && tar czf logs.tgz big.log warm-*.log 2>/dev/null)
exit "$rc"
