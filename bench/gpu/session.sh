#!/usr/bin/env bash
# One GPU session, everything in one call that ends within $VF_SESSION_SECONDS (default 440):
#
#   A. in the background: builds the runtime for this GPU's architecture (bench/gpu/run.sh
#      --no-test --no-bench);
#   B. meanwhile, the PyTorch library on CUDA: the package's unit tests, then the examples'
#      same-weights test and the CNN's resize test (tests/integration/test_torch.py, forced onto
#      the GPU with CNN_DEVICE=cuda, GPT_DEVICE=cuda), and the resize test's schedule once more
#      with every output line timed (how long a joiner takes to be ready on this machine);
#   C. the GPU unit tests (ctest, after B: one of them reads the whole GPU's memory in use);
#      then `vf run` of the built-in model with its local workers sharing the GPU (.gpu-py's vf
#      with the CUDA library just built): the same weights on 1, 2 and 3 workers and through
#      resizes; and the PyTorch library's NCCL collectives (VF_TORCH_COLLECTIVES=nccl) with that
#      CUDA library: the CNN's weights through NCCL are Gloo's in a world of one and, resized,
#      between workers that NCCL_HOSTID makes hosts of their own; two workers sharing the GPU
#      end the job with NCCL's refusal;
#   D. then timings, one at a time: the device's speed-ups each turned off (vf-bench tuning,
#      exact and fast), the runtime's GPU benchmarks against PyTorch eager (bench/gpu/run.sh
#      --skip-build --no-test --quick), the CNN through virtualflow.torch against plain PyTorch
#      (bench/torch/bench.py overhead --device cuda), and each bench/torch/gpu_*.patch given in
#      $VF_GPU_AB_PATCHES measured by `bench.py ab` (the library without the change vs with it).
#
# VF_GPU_STAGES names the parts to run (default: all of them): build (A, and C's tests),
# vfrun (C's `vf run`, needs build), nccl (C's PyTorch NCCL test, needs build), pytest, torchtests, resize, tuning, runtime, overhead, ab. Without `build`, nothing C++ runs:
# the PyTorch parts need only .gpu-py/. VF_GPU_TORCH_TESTS and VF_GPU_NCCL_TESTS (test names), VF_GPU_CTEST (a ctest
# regex), VF_GPU_TORCH_BENCH_ARGS (bench.py's --repeats, --steps, --warmup; VF_GPU_AB_ARGS for ab
# alone) narrow the rest; VF_GPU_TORCH_SECONDS, VF_GPU_OVERHEAD_SECONDS and VF_GPU_AB_SECONDS cap
# the torch tests, overhead and ab stages (default 150, 90 and 70 s).
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
deadline=$((t0 + ${VF_SESSION_SECONDS:-440}))

stages=" ${VF_GPU_STAGES:-build vfrun nccl pytest torchtests resize tuning runtime overhead ab} "
want() { [[ "$stages" == *" $1 "* ]]; }
say() { echo "[$(($(date +%s) - t0)) s] $*" | tee -a "$work/session.log"; }
left() { echo $((deadline - $(date +%s))); }
# need STAGE...: the seconds the wanted ones of these later stages take, roughly (the reserve a
# stage leaves them).
need() {
  local total=0 st
  declare -A typical=([build]=40 [vfrun]=60 [nccl]=120 [resize]=30 [tuning]=10 [runtime]=60 [overhead]=50 [ab]=60)
  for st; do want "$st" && total=$((total + ${typical[$st]:-30})); done
  echo "$total"
}
# budget CAP RESERVE: seconds for a stage, at most CAP, leaving RESERVE for the stages after it.
budget() {
  local b=$(($(left) - $2))
  [ "$b" -gt "$1" ] && b=$1
  [ "$b" -lt 10 ] && b=10
  echo "$b"
}
pack() {
  cp "$work/session.log" "$final/summary.txt"
  tar -C "$work" -czf "$final/logs.tgz.tmp" . && mv "$final/logs.tgz.tmp" "$final/logs.tgz"
}
# results FILE: each test's line "name ... ok" from unittest's verbose output in FILE, also
# where the test printed something after the dots and its result came on a line of its own.
results() {
  awk '/ \.\.\. / { name = $1; if (match($0, / \.\.\. (ok|FAIL|ERROR|skipped.*)$/)) { print; name = "" } next }
       name != "" && /^(ok|FAIL|ERROR|skipped.*)$/ { print name " ... " $0; name = "" }' "$1"
}
# timed: prefixes each line of its input with the seconds since it started.
timed() {
  python3 -u -c 'import sys, time
t = time.monotonic()
for line in sys.stdin:
    print(f"{time.monotonic() - t:7.2f} {line}", end="", flush=True)'
}

say "session on $(hostname), $(nproc) cores"
nvidia-smi >"$work/nvidia-smi.txt" 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a "$work/session.log"
# Both bundles unpacked once, now: run.sh and env.sh would otherwise unpack .gpu-deps into the
# same folder at the same time.
if [ ! -f .gpu-py/env.sh ]; then
  say "no .gpu-py/: run bench/gpu/bundle_python.sh where the packages are, and carry .gpu-py"
  exit 1
fi
(source .gpu-py/env.sh) || exit 1

# A. The build, in the background (before env.sh: its libraries are not the machine's CMake's).
cpp=
want build && (
  OUT="$work/cpp" VF_GPU_ARCHS=90 timeout "$(budget 240 "$(need tuning runtime)")" bench/gpu/run.sh --no-test --no-bench
  echo "run.sh rc $?"
) >"$work/cpp-build.out" 2>&1 &
want build && cpp=$!

# shellcheck disable=SC1091
source .gpu-py/env.sh
python3 -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, torch.cuda.get_device_name(0))' \
  2>&1 | tee -a "$work/session.log"

# B. The PyTorch library on the GPU.
if want pytest; then
say "B: python unit tests"
# From the root: in python/ the source package (without _core) would shadow the built one.
timeout 60 python3 -m pytest -q -p no:cacheprovider python/tests >"$work/pytest.out" 2>&1
say "B: pytest rc $?: $(tail -n 1 "$work/pytest.out")"
fi
if want torchtests; then
say "B: the examples' same weights and the CNN's resizes, on CUDA"
(
  cd tests/integration &&
    CNN_DEVICE=cuda GPT_DEVICE=cuda VF_BIN_DIR="$root/.gpu-py/bin" VF_SOURCE_DIR="$root" \
      VF_PYTHON="$(command -v python3)" PYTHONDONTWRITEBYTECODE=1 \
      timeout "$(budget "${VF_GPU_TORCH_SECONDS:-150}" "$(need resize build vfrun tuning runtime overhead ab)")" python3 -m unittest -v \
      ${VF_GPU_TORCH_TESTS:-test_torch.TorchTest.test_examples_train_to_the_same_weights_on_1_2_and_3_workers test_torch.TorchTest.test_cnn_resized_three_times_keeps_the_weights_of_a_static_run}
) >"$work/torch-tests.out" 2>&1
say "B: test_torch rc $?: $(grep -E '^(OK|FAILED)' "$work/torch-tests.out" | tail -n 1)"
results "$work/torch-tests.out" | tee -a "$work/session.log"
fi
if want resize; then
say "B: the resize test's schedule, every line timed"
cat >"$work/resize.yaml" <<'EOF'
apiVersion: virtualflow.io/v1alpha1
kind: VirtualFlowJob
metadata: {name: torch-test}
spec:
  virtualNodes: 8
  globalBatchSize: 256
  replicas: {min: 1, max: 4}
  steps: 40
  seed: 11
  template:
    spec:
      containers: [{name: worker, command: [python3, examples/torch/cnn.py]}]
  elasticity: {policy: elastic, cooldownSeconds: 0}
EOF
CNN_DEVICE=cuda timeout "$(budget 60 "$(need build vfrun tuning runtime overhead ab)")" vf run "$work/resize.yaml" --capacity 0:2,4:3,14:1,22:2 \
  --vnode-delay-ms 60 --progress-interval 0.5 2>&1 | timed >"$work/resize-timed.out"
grep -E "resize at|error" "$work/resize-timed.out" | tee -a "$work/session.log"
fi
pack

if want build; then
wait "$cpp"
say "A: $(grep -E 'run.sh rc|build failed|built:' "$work/cpp-build.out" | tr '\n' ' ')"

# C. The GPU unit tests (the 100-communicator loop, ~1 minute, is left out for time).
say "C: GPU unit tests"
ctest --test-dir build-gpu -j 4 --output-on-failure -R "${VF_GPU_CTEST:-(cuda_device_test|executor_cuda_test|nccl_test)\.}" \
  -E 'CreatingAndDestroyingManyDoesNotLeak' --timeout 120 >"$work/ctest-gpu.log" 2>&1
say "C: ctest rc $?: $(grep -E 'tests passed|tests failed' "$work/ctest-gpu.log")"
grep -E "Passed|Failed|Skipped|Not Run" "$work/ctest-gpu.log" | grep -E "Test +#" | sed 's/^ *//' >>"$work/session.log"
pack
fi

# C'. `vf run`'s local workers of the built-in model sharing the GPU (its default where a GPU is): the
# same weights on 1, 2 and 3 workers and through three resizes.
if want vfrun && [ -f build-gpu/bin/libvirtualflow-cuda.so ]; then
  say "C: vf run on the GPU, 1, 2 and 3 workers and resized"
  # The example's job, reading the Fashion-MNIST files .gpu-py carries (env.sh: FASHION_MNIST).
  # No cooldown, so that each of the schedule's changes resizes the run.
  sed -e "s|path: /usr/share/datasets/fashion-mnist|path: $FASHION_MNIST|" \
    -e "s|cooldownSeconds: 30|cooldownSeconds: 0|" examples/fashion-mnist.yaml \
    >"$work/fashion-mnist.yaml"
  # The resized run paces its nodes (80 ms each, which changes no weight) so that joiners, whose
  # start takes seconds on a GPU, arrive inside the schedule's windows.
  for how in "--workers 1" "--workers 2" "--workers 3" \
    "--capacity 0:1,10:3,30:2,50:3 --vnode-delay-ms 80"; do
    rm -f "$work/vfrun.json"
    VF_CUDA_PLUGIN="$root/build-gpu/bin/libvirtualflow-cuda.so" \
      timeout "$(budget 60 "$(need nccl tuning runtime overhead ab)")" vf run "$work/fashion-mnist.yaml" \
      $how --steps 70 --summary-json "$work/vfrun.json" >"$work/vfrun.out" 2>&1
    rc=$?
    cat "$work/vfrun.out" >>"$work/vfrun-all.out"
    say "C: vf run $how: rc $rc, $(grep -E 'finished' "$work/vfrun.out" | tail -n 1), $(grep -E 'weights sha256' "$work/vfrun.out" | tail -n 1)"
    python3 -c 'import json, sys; print("   devices:", sorted({w.get("device", "?") for w in json.load(open(sys.argv[1]))["worker_results"]}))' \
      "$work/vfrun.json" 2>&1 | tail -n 1 | tee -a "$work/session.log"
  done
  pack
fi

# C''. virtualflow.torch's NCCL collectives with the CUDA library just built: in a world of one
# against Gloo; two workers sharing the GPU, which NCCL refuses (the job must end saying so);
# and workers told apart by NCCL_HOSTID, which NCCL connects as hosts of their own, resized. The library goes beside .gpu-py's vf (which has none), where
# `vf run` finds it and hands it to its workers (VF_CUDA_PLUGIN), as it does in a build with CUDA.
if want nccl && [ -f build-gpu/bin/libvirtualflow-cuda.so ]; then
  say "C: the CNN through virtualflow.torch's NCCL collectives, against Gloo"
  cp build-gpu/bin/libvirtualflow-cuda.so .gpu-py/bin/
  (
    cd tests/integration &&
      CNN_DEVICE=cuda VF_BIN_DIR="$root/.gpu-py/bin" VF_SOURCE_DIR="$root" VF_PYTHON="$(command -v python3)" \
        PYTHONDONTWRITEBYTECODE=1 timeout "$(budget 200 "$(need tuning runtime overhead ab)")" \
        python3 -m unittest -v ${VF_GPU_NCCL_TESTS:-test_torch.TorchTest.test_cnn_reduced_through_nccl_has_the_weights_of_gloo \
        test_torch.TorchTest.test_nccl_on_two_workers_sharing_a_gpu_ends_the_job_saying_why \
        test_torch.TorchTest.test_cnn_through_nccl_between_workers_resized_keeps_the_weights_of_gloo}
  ) >"$work/torch-nccl.out" 2>&1
  say "C: NCCL tests rc $?: $(grep -E '^(OK|FAILED)' "$work/torch-nccl.out" | tail -n 1)"
  results "$work/torch-nccl.out" | tee -a "$work/session.log"
  pack
fi

# D. Timings, one at a time.
bin=build-gpu/bin
if [ -x "$bin/vf-bench" ] && want tuning; then
  for red in exact fast; do
    say "D: device tuning, $red"
    timeout "$(budget 60 "$(need runtime overhead ab)")" "$bin/vf-bench" tuning --device cuda --reduction "$red" \
      --global-batch 2048 --virtual-nodes 8 --dataset synthetic --steps 20 --repeats 3 \
      >"$work/tuning-$red.out" 2>&1
    say "D: rc $?"
    tail -n 7 "$work/tuning-$red.out" | tee -a "$work/session.log"
  done
  pack
fi
if [ -x "$bin/vf-bench" ] && want runtime; then
  say "D: runtime benchmarks"
  OUT="$work/cpp" VF_GPU_TORCH_MODES=eager timeout "$(budget 150 "$(need overhead ab)")" \
    bench/gpu/run.sh --skip-build --no-test --quick >"$work/cpp-bench.out" 2>&1
  say "D: run.sh rc $?"
  cat "$work/cpp/summary.txt" 2>/dev/null | tee -a "$work/session.log"
  pack
fi
if want overhead; then
say "D: CNN through virtualflow.torch against plain PyTorch, on the GPU"
timeout "$(budget ${VF_GPU_OVERHEAD_SECONDS:-90} "$(need ab)")" python3 bench/torch/bench.py overhead --device cuda --vf .gpu-py/bin/vf \
  ${VF_GPU_TORCH_BENCH_ARGS:---repeats 3 --steps 30 --warmup 5} --out "$work/torch-overhead.json" >"$work/torch-overhead.out" 2>&1
say "D: bench.py rc $?"
tail -n 6 "$work/torch-overhead.out" | tee -a "$work/session.log"
pack
fi
want ab && for patch in ${VF_GPU_AB_PATCHES:-}; do
  say "D: bench.py ab $patch"
  timeout "$(budget ${VF_GPU_AB_SECONDS:-70} 5)" python3 bench/torch/bench.py ab --device cuda --vf .gpu-py/bin/vf \
    --patch "$patch" ${VF_GPU_AB_ARGS:-${VF_GPU_TORCH_BENCH_ARGS:---repeats 2 --steps 30 --warmup 5}} \
    --out "$work/torch-ab-$(basename "$patch" .patch).json" >"$work/torch-ab-$(basename "$patch" .patch).out" 2>&1
  say "D: bench.py ab rc $?"
  grep -E "final weights|^ab " "$work/torch-ab-$(basename "$patch" .patch).out" | tee -a "$work/session.log"
  pack
done
say "done"
pack
