#!/usr/bin/env bash
# Every GPU check and benchmark in one call, on a machine with an NVIDIA GPU, CUDA's compiler,
# CMake, NCCL and PyTorch (no package registry needed):
#
#   1. builds the runtime, its tests and vf-bench from this working tree (VF_RUNTIME_ONLY, CUDA
#      and NCCL on) against the dependency bundle that bench/gpu/bundle.sh makes, when the
#      machine lacks yaml-cpp, GoogleTest, OpenSSL, zlib, OpenBLAS, Gloo or CLI11;
#   2. runs the runtime's unit tests, the GPU ones included (ctest);
#   3. benchmarks: our MLP against the same model in PyTorch (eager and torch.compile) at equal
#      global batch and micro-batch; virtual-node overhead on the GPU (V=8 vs V=1); peak device
#      memory at a fixed micro-batch as the global batch grows 16x;
#   4. prints a short table last.
#
#   bench/gpu/bundle.sh                 # where the packages are (this machine), once
#   bench/gpu/run.sh [--skip-build] [--no-test] [--no-bench] [--quick]
#   (Python: bench/gpu/bundle_python.sh builds virtualflow and vf into .gpu-py/; source its env.sh;
#   bench/gpu/session.sh runs this and the PyTorch checks in one call)
#
# VF_GPU_ARCHS (default: CMake's 80;90) narrows the CUDA targets to the machine's, and
# VF_GPU_TORCH_MODES (default "eager compile") the PyTorch baselines.
#
# Logs go to $OUT (or build-gpu/results): build.log, ctest.log, bench.log, summary.txt.
set -uo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
skip_build=0
no_bench=0
no_test=0
quick=0
for a in "$@"; do
  case "$a" in
    --skip-build) skip_build=1 ;;
    --no-bench) no_bench=1 ;;
    --no-test) no_test=1 ;;
    --quick) quick=1 ;;
    -h | --help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown option $a (see --help)" >&2; exit 2 ;;
  esac
done
build="${VF_GPU_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build/results}"
mkdir -p "$out"
log() { echo "gpu: $*" | tee -a "$out/bench.log" >&2; }

# 1. Build.
deps_tar="$root/.gpu-deps/deps.tar.xz"
deps="${VF_GPU_DEPS_DIR:-/tmp/vf-gpu-deps}"
extra=()
if [ -f "$deps_tar" ]; then
  if [ ! -f "$deps/.complete" ] || [ "$deps_tar" -nt "$deps/.complete" ]; then
    rm -rf "$deps" && mkdir -p "$deps" && tar -C "$deps" -xJf "$deps_tar" && touch "$deps/.complete"
  fi
  prefix="$deps/usr"
  arch="$(ls -d "$prefix"/lib/*-linux-gnu)" && arch="${arch##*/}"
  export LD_LIBRARY_PATH="$prefix/lib/$arch:$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  extra=(-DCMAKE_PREFIX_PATH="$prefix" -DOPENSSL_ROOT_DIR="$prefix" -DOPENSSL_USE_STATIC_LIBS=TRUE
         -DZLIB_ROOT="$prefix")
  log "dependencies from $deps_tar"
fi
if [ "$skip_build" = 0 ]; then
  cuda_flags="$(scripts/setup-cuda.sh)" || { log "no CUDA toolkit found"; exit 1; }
  # Warnings are errors in CI's build; not here, where the compiler is another version and
  # -O3 brings out its false positives (-Wrestrict in std::string, for one). The policy minimum
# lets a CMake 4 read the bundle's older package files.
  # shellcheck disable=SC2086
  archs=()
  [ -n "${VF_GPU_ARCHS:-}" ] && archs=(-DCMAKE_CUDA_ARCHITECTURES="$VF_GPU_ARCHS")
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVF_RUNTIME_ONLY=ON \
    -DVF_WERROR=OFF -DCMAKE_POLICY_VERSION_MINIMUM=3.5 "${extra[@]}" "${archs[@]}" $cuda_flags \
    >"$out/build.log" 2>&1 &&
    cmake --build "$build" -j "$(nproc)" >>"$out/build.log" 2>&1
  rc=$?
  tail -n 30 "$out/build.log"
  [ "$rc" = 0 ] || { log "build failed (rc $rc), see build.log"; exit 1; }
  log "built: $(grep -c 'Building CUDA' "$out/build.log") CUDA objects"
fi
bin="$build/bin"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 |
    tee "$out/gpu.txt" >&2
else
  log "no nvidia-smi: GPU tests will skip"
fi

# 2. Tests: every runtime unit test; the GPU ones must run, not skip. The GPU machine has no
# Debian Fashion-MNIST package, so the test that loads it is left out; the GPU tests use the
# synthetic dataset.
ctest_rc=0
gpu_tests="not run"
gpu_skips="not run"
if [ "$no_test" = 0 ]; then
  ctest --test-dir "$build" -j 8 --output-on-failure -E 'LoadFashionMnist\.LoadsDebianDataset' \
    >"$out/ctest.log" 2>&1
  ctest_rc=$?
  grep -E "tests passed|tests failed" "$out/ctest.log" >&2
  gpu_tests="$(grep -cE "(cuda_device_test|executor_cuda_test|nccl_test)\..* Passed" "$out/ctest.log")"
  gpu_skips="$(grep -E "(cuda_device_test|executor_cuda_test|nccl_test)\." "$out/ctest.log" |
    grep -c "Skipped")"
fi

[ "$no_bench" = 1 ] && exit "$ctest_rc"

# 3. Benchmarks.
steps=30
repeats=3
[ "$quick" = 1 ] && steps=10 && repeats=2
common=(--dataset synthetic --steps "$steps" --repeats "$repeats")
run() {  # run CMD...: appends its output to bench.log, echoes it
  echo "\$ $*" >>"$out/bench.log"
  "$@" 2>&1 | tee -a "$out/bench.log"
}
for cfg in "4096 16" "16384 16"; do
  set -- $cfg
  for red in fast exact; do
    run "$bin/vf-bench" throughput --device cuda --reduction "$red" --global-batch "$1" \
      --virtual-nodes "$2" "${common[@]}"
  done
  for mode in ${VF_GPU_TORCH_MODES:-eager compile}; do
    for data in host device; do
      run env PYTHONUNBUFFERED=1 python3 bench/gpu/torch_mlp.py --mode "$mode" --data "$data" \
        --global-batch "$1" --virtual-nodes "$2" --steps "$steps" --repeats "$repeats"
    done
  done
done
for red in exact fast; do
  run "$bin/vf-bench" vnode-overhead --device cuda --reduction "$red" --virtual-nodes 8 \
    --micro-batches 64,256,1024 "${common[@]}"
done
run "$bin/vf-bench" memory --device cuda --virtual-nodes 8 --micro-batch 256 --dataset synthetic

# 4. Summary.
python3 - "$out/bench.log" "$ctest_rc" "$gpu_tests" "$gpu_skips" <<'EOF' | tee "$out/summary.txt"
import re, sys
log, ctest_rc, gpu_tests, gpu_skips = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
text = open(log).read()
def kv(line):
    return dict(re.findall(r"(\w+)=([^\s]+)", line))
ours, torch = {}, {}
for line in text.splitlines():
    if line.startswith("throughput "):
        d = kv(line); ours[(d["global_batch"], d["virtual_nodes"], d["reduction"])] = float(d["samples_per_second"])
    elif line.startswith("torch "):
        d = kv(line); torch[(d["global_batch"], d["virtual_nodes"], d["mode"], d["data"])] = float(d["samples_per_second"])
print(f"GPU unit tests: ctest rc {ctest_rc}; GPU cases passed {gpu_tests}, skipped {gpu_skips}")
print("(a) throughput, samples/s: ours (fast / exact) vs PyTorch; ratio = ours fast / torch")
print(f"{'B':>6} {'V':>3} {'ours fast':>10} {'ours exact':>10} {'torch':>22} {'samples/s':>10} {'ratio':>6}")
for (b, v, mode, data), t in sorted(torch.items(), key=lambda kv: (int(kv[0][0]), kv[0][2], kv[0][3])):
    f = ours.get((b, v, "fast")); e = ours.get((b, v, "exact"))
    print(f"{b:>6} {v:>3} {f or 0:>10.0f} {e or 0:>10.0f} {mode + ' data on ' + data:>22} {t:>10.0f} "
          f"{(f / t if f else float('nan')):>6.3f}")
print("(b) virtual-node overhead on the GPU, V=8 vs V=1 (target <= 1.05 at micro-batch >= 256)")
mode = None
for line in text.splitlines():
    m = re.match(r"virtual-node overhead: .* (exact|fast) reduction", line)
    if m: mode = m.group(1)
    m = re.match(r"\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$", line)
    if m and mode: print(f"  {mode:>5}  micro-batch {m.group(2):>5}: {m.group(5)}")
print("(c) peak device memory")
for line in text.splitlines():
    if line.startswith("ratio,") or re.match(r"\s+\d+\s+\d+\s+\d+\s+[\d.]+$", line):
        print("  " + line.strip())
EOF
exit "$ctest_rc"
