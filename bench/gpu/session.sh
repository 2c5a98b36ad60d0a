#!/usr/bin/env bash
# One GPU session, everything in one call that ends within $VF_SESSION_SECONDS (default 500):
#
#   A. in the background: bench/gpu/run.sh --no-bench (builds the runtime for this GPU's
#      architecture and runs its unit tests, the GPU ones included);
#   B. meanwhile, the PyTorch library on CUDA: the CNN example's full run for its accuracy (in
#      the background), the package's unit tests, then the integration
#      tests of the examples (tests/integration/test_torch.py: the same weights on 1, 2 and 3
#      workers sharing the GPU, three resizes, two kill -9, the misuse errors), with the examples
#      forced onto the GPU (CNN_DEVICE=cuda, GPT_DEVICE=cuda);
#   C. then, one at a time: the CNN through virtualflow.torch against plain PyTorch on the GPU
#      (bench/torch/bench.py overhead --device cuda), two gradient buffers in flight against one
#      (bench.py ab with bench/torch/gpu_one_slot.patch), and the runtime's GPU benchmarks
#      (bench/gpu/run.sh --skip-build --no-test --quick, PyTorch eager baselines).
#
# It needs .gpu-deps/ (bench/gpu/bundle.sh) and .gpu-py/ (bench/gpu/bundle_python.sh), made on a
# machine with the Debian packages and carried along. Logs: $OUT/logs.tgz (rewritten after each
# stage, so a run cut short still returns what it did) and $OUT/summary.txt.
#
#   bench/gpu/session.sh
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
final="${OUT:-$root/build-gpu/session}"
work="$(mktemp -d /tmp/vf-gpu-session.XXXXXX)"
mkdir -p "$final"
t0=$(date +%s)
deadline=$((t0 + ${VF_SESSION_SECONDS:-500}))

say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$work/session.log"; }
left() { echo $((deadline - $(date +%s))); }
# budget CAP RESERVE: seconds for a stage, at most CAP, leaving RESERVE for the stages after it.
budget() {
  local b=$(($(left) - $2))
  [ "$b" -gt "$1" ] && b=$1
  [ "$b" -lt 10 ] && b=10
  echo "$b"
}
pack() { tar -C "$work" -czf "$final/logs.tgz.tmp" . && mv "$final/logs.tgz.tmp" "$final/logs.tgz"; }

say "session on $(hostname), $(nproc) cores"
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$work/session.log"
# Both bundles unpacked once, now: run.sh and env.sh would otherwise unpack .gpu-deps into the
# same folder at the same time.
if [ -f .gpu-py/env.sh ]; then
  (source .gpu-py/env.sh) || exit 1
fi
# A. Build and unit tests, in the background (before env.sh: its libraries are not the
# machine's CMake's).
(
  OUT="$work/cpp" VF_GPU_ARCHS=90 timeout "$(budget 300 150)" bench/gpu/run.sh --no-bench
  echo "run.sh rc $?"
) >"$work/cpp-build-test.out" 2>&1 &
cpp=$!

if [ ! -f .gpu-py/env.sh ]; then
  say "no .gpu-py/: run bench/gpu/bundle_python.sh where the packages are, and carry .gpu-py"
  exit 1
fi
# shellcheck disable=SC1091
source .gpu-py/env.sh
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))' \
  2>&1 | tee -a "$work/session.log"
python3 -m pip list 2>/dev/null | grep -iE '^(torch|nvidia-(nccl|cublas|cuda-runtime))' >>"$work/session.log"

# B. The PyTorch library on the GPU. First, in the background: the CNN example's whole run
# (10 epochs of the full Fashion-MNIST, 2 workers) for its test accuracy.
(
  CNN_DEVICE=cuda timeout "$(budget 280 170)" vf run examples/torch-cnn.yaml --workers 2 \
    --progress-interval 15 --summary-json "$work/cnn-quality.json"
  echo "vf run rc $?"
) >"$work/cnn-quality.out" 2>&1 &
quality=$!
say "B: python unit tests"
# From the root: in python/ the source package (without _core) would shadow the built one.
timeout 60 python3 -m pytest -q -p no:cacheprovider python/tests >"$work/pytest.out" 2>&1
say "B: pytest rc $?: $(tail -n 1 "$work/pytest.out")"
say "B: integration tests of the examples on CUDA"
(
  cd tests/integration &&
    CNN_DEVICE=cuda GPT_DEVICE=cuda VF_BIN_DIR="$root/.gpu-py/bin" VF_SOURCE_DIR="$root" \
      VF_PYTHON="$(command -v python3)" PYTHONDONTWRITEBYTECODE=1 \
      timeout "$(budget 260 200)" python3 -m unittest -v test_torch
) >"$work/torch-tests.out" 2>&1
say "B: test_torch rc $?: $(grep -E '^(OK|FAILED)' "$work/torch-tests.out" | tail -n 1)"
grep -E ' \.\.\. (ok|FAIL|ERROR|skipped)' "$work/torch-tests.out" | tee -a "$work/session.log"
pack

wait "$cpp"
say "A: $(grep -E 'tests passed|tests failed|run.sh rc|build failed' "$work/cpp-build-test.out" | tr '\n' ' ')"
grep -E "(cuda_device_test|executor_cuda_test|nccl_test)\." "$work/cpp/ctest.log" 2>/dev/null |
  sed 's/^ *//' >>"$work/session.log"
grep -E "\*\*\*Failed|Exception|Timeout" "$work/cpp/ctest.log" 2>/dev/null | head -n 20 | tee -a "$work/session.log"
pack

wait "$quality"
say "B: CNN quality run: $(grep -E 'accuracy|rc ' "$work/cnn-quality.out" | tr '\n' ' ')"
pack

# C. Timings, one at a time.
say "C: CNN through virtualflow.torch against plain PyTorch, on the GPU"
timeout "$(budget 150 130)" python3 bench/torch/bench.py overhead --device cuda --vf .gpu-py/bin/vf \
  --repeats 3 --steps 30 --warmup 5 --out "$work/torch-overhead.json" >"$work/torch-overhead.out" 2>&1
say "C: bench.py rc $?"
tail -n 6 "$work/torch-overhead.out" | tee -a "$work/session.log"
pack
say "C: two gradient slots in flight against one (bench.py ab, gpu_one_slot.patch)"
timeout "$(budget 120 110)" python3 bench/torch/bench.py ab --device cuda --vf .gpu-py/bin/vf \
  --patch bench/torch/gpu_one_slot.patch --repeats 2 --steps 30 --warmup 5 \
  --out "$work/torch-ab.json" >"$work/torch-ab.out" 2>&1
say "C: bench.py ab rc $?"
grep -E "final weights|^ab " "$work/torch-ab.out" | tee -a "$work/session.log"
pack
if [ -x build-gpu/bin/vf-bench ]; then
  say "C: runtime benchmarks"
  OUT="$work/cpp" VF_GPU_TORCH_MODES=eager timeout "$(budget 240 5)" \
    bench/gpu/run.sh --skip-build --no-test --quick >"$work/cpp-bench.out" 2>&1
  say "C: run.sh rc $?"
  cat "$work/cpp/summary.txt" 2>/dev/null | tee -a "$work/session.log"
fi
pack
cp "$work/session.log" "$final/summary.txt"
say "done"
