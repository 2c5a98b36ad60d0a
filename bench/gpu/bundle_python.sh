#!/usr/bin/env bash
# Builds the virtualflow Python package and the vf CLI for a GPU machine's Python and packs them,
# with what they need, into .gpu-py/ (ignored by git; carried by name like .gpu-deps/).
#
# The GPU machine has CPython 3.12 with PyTorch but no Debian development packages and no
# package registry, so neither the agent library behind virtualflow._core (cpprestsdk,
# prometheus-cpp, nlohmann_json, ...) nor `vf` can be built there. Here they are built in a
# tree of their own (build-py312/, Release, VF_WITH_CUDA=OFF: a PyTorch worker stages its CUDA
# gradients through the host) against CPython 3.12.1 (pyenv's, whose headers the extension
# needs) and nanobind (in ~/.cache/virtualflow/py312, at scripts/setup-python.sh's pin):
#
#   .gpu-py/python/virtualflow/   the package's modules and _core.cpython-312-x86_64-linux-gnu.so
#   .gpu-py/bin/vf                the CLI; `vf run` puts ../python on its workers' PYTHONPATH
#   .gpu-py/bin/virtualflow-agent the built-in model's worker, which `vf run` starts
#   .gpu-py/lib.tar.xz            lib/: the shared libraries both need beyond glibc, libstdc++
#                                 and libgcc_s, less those .gpu-deps/deps.tar.xz holds (OpenBLAS,
#                                 Gloo, yaml-cpp and theirs); no CUDA library. Packed (10 MB, 3
#                                 as xz) to keep .gpu-py/ small; env.sh unpacks both into /tmp
#   .gpu-py/data/fashion-mnist/   Fashion-MNIST (Debian's dataset-fashion-mnist), whole
#   .gpu-py/data/fortunes/        Debian's fortunes, the GPT example's corpus (2.8 MB)
#   .gpu-py/env.sh                `source .gpu-py/env.sh` from the repository root sets
#                                 LD_LIBRARY_PATH, PYTHONPATH, PATH, FASHION_MNIST and FORTUNES
#
# Debian 12's libraries need glibc 2.36 and GCC 12's libstdc++ or newer. bench/gpu/check_python.sh
# tests the result here with this machine's copies of those libraries hidden.
#
#   bench/gpu/bundle.sh && bench/gpu/bundle_python.sh     (re)writes .gpu-deps/ and .gpu-py/
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
out="$root/.gpu-py"
build="${VF_PY312_BUILD_DIR:-$root/build-py312}"
python312="${VF_PY312:-/root/.pyenv/versions/3.12.1/bin/python3}"
cache="${VF_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/virtualflow}"
venv="$cache/py312"
deps_tar="$root/.gpu-deps/deps.tar.xz"
dataset=/usr/share/datasets/fashion-mnist
log() { echo "bundle_python: $*" >&2; }

[ -x "$python312" ] || { log "$python312 not found (VF_PY312 names another CPython 3.12)"; exit 1; }
[ -f "$deps_tar" ] || { log "$deps_tar is missing: run bench/gpu/bundle.sh first"; exit 1; }
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  [ -f "$dataset/$f" ] || { log "$dataset/$f is missing (Debian's dataset-fashion-mnist)"; exit 1; }
done

# 1. nanobind for CPython 3.12, at the version the project's own environment pins.
pin="$(grep -o 'nanobind==[0-9.]*' scripts/setup-python.sh)"
if [ ! -f "$venv/.virtualflow-pins" ] || [ "$(cat "$venv/.virtualflow-pins")" != "$pin" ]; then
  log "installing $pin into $venv"
  [ -d "$venv" ] || "$python312" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    --root-user-action=ignore "$pin"
  echo "$pin" >"$venv/.virtualflow-pins"
fi

# 2. The extension and the CLI (the compiler cache as scripts/build.sh sets it up). Warnings are
# no errors here: -O3 brings out GCC 12's false positives (-Wrestrict in std::string), as in
# bench/gpu/run.sh; CI's build keeps them errors.
launcher=()
if command -v ccache >/dev/null; then
  ccache_env="CCACHE_DIR=${CCACHE_DIR:-$cache/ccache};CCACHE_BASEDIR=$root;CCACHE_NOHASHDIR=true"
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="env;$ccache_env;ccache")
fi
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DVF_BUILD_TESTS=OFF \
  -DVF_WITH_CUDA=OFF -DVF_WITH_NCCL=OFF -DVF_WERROR=OFF -DVF_PYTHON="$venv/bin/python" \
  -DPython_EXECUTABLE="$venv/bin/python" "${launcher[@]}" >/dev/null
ninja -C "$build" -j "${VF_BUILD_JOBS:-$(nproc)}" vf virtualflow-agent virtualflow_python

rm -rf "$out"
stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out/python/virtualflow" "$out/bin" "$stage/lib" "$out/data/fashion-mnist"
cp python/virtualflow/*.py "$out/python/virtualflow/"
core="$(ls "$build"/python/virtualflow/_core.cpython-312-*.so)"
cp "$core" "$out/python/virtualflow/"
cp "$build/bin/vf" "$out/bin/vf"
cp "$build/bin/virtualflow-agent" "$out/bin/virtualflow-agent"
strip --strip-unneeded "$out/bin/vf" "$out/bin/virtualflow-agent" \
  "$out/python/virtualflow/$(basename "$core")"

# 3. Shared libraries, by soname, as this machine resolves them (ldd lists the whole closure).
in_deps="$(tar -tJf "$deps_tar" | xargs -n1 basename | sort -u)"
ldd "$out/bin/vf" "$out/bin/virtualflow-agent" "$out/python/virtualflow/$(basename "$core")" |
  awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | sort -u |
  while read -r soname path; do
    case "$soname" in
      # glibc, the C++ runtime and the GCC support library: the machine's own.
      libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | libresolv.so.* | \
        libutil.so.* | ld-linux*.so.* | libstdc++.so.* | libgcc_s.so.*) continue ;;
      # CUDA's libraries are the machine's (PyTorch's wheels); none should be linked at all.
      libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnccl.so.*)
        log "$soname: a CUDA library is linked; build with VF_WITH_CUDA=OFF"; exit 1 ;;
    esac
    grep -qxF "$soname" <<<"$in_deps" && continue
    cp "$(readlink -f "$path")" "$stage/lib/$soname"
  done
tar -C "$stage" -cJf "$out/lib.tar.xz" lib

# 4. Fashion-MNIST, whole (31 MB): the CNN's accuracy on the GPU is measured on the real set.
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
  t10k-labels-idx1-ubyte.gz; do
  cp "$dataset/$f" "$out/data/fashion-mnist/$f"
done

# The GPT example's corpus, whole (its .u8 links stay links, which gpt.py skips).
[ -d /usr/share/games/fortunes ] || { log "/usr/share/games/fortunes is missing (Debian's fortunes)"; exit 1; }
rm -rf "$out/data/fortunes" && cp -a /usr/share/games/fortunes "$out/data/fortunes"

# 5. The environment, sourced on the GPU machine.
cp bench/gpu/py_env.sh "$out/env.sh"
log "wrote $out ($(du -sh "$out" | cut -f1)): $(ls "$stage/lib" | wc -l) libraries in lib.tar.xz"
