# The environment for the virtualflow package and vf that bench/gpu/bundle_python.sh packed into
# .gpu-py/ (this file is its env.sh). On the GPU machine, from the repository root, in bash:
#
#   source .gpu-py/env.sh && vf run examples/torch-cnn.yaml
#
# It unpacks .gpu-py/lib.tar.xz (cpprestsdk, OpenSSL, ...) into /tmp/vf-gpu-py and
# .gpu-deps/deps.tar.xz (OpenBLAS, Gloo, yaml-cpp and what they need) where bench/gpu/run.sh
# does, unless an earlier call (or run.sh) did, and sets:
#   LD_LIBRARY_PATH  the first's lib/, then the second's libraries, then what was there;
#                    no CUDA library is among them: PyTorch keeps finding its own wheels' ones
#   PYTHONPATH       .gpu-py/python (import virtualflow; vf run adds it for its workers too)
#   PATH             .gpu-py/bin (vf); the workers' python3 stays the machine's, with PyTorch
#   FASHION_MNIST    .gpu-py/data/fashion-mnist (Debian's Fashion-MNIST files)
#   FORTUNES         .gpu-py/data/fortunes (the GPT example's corpus)
# Returns non-zero, setting no variable, when a bundle is missing. The libraries come first for
# every program this shell starts (Debian 12's OpenSSL 3.0 and zlib among them): run
# bench/gpu/run.sh (the machine's CMake) before sourcing this, or source it in a subshell.

# vf_gpu_py_unpack ARCHIVE DIR: DIR holds ARCHIVE's files, unpacked again when the archive is newer.
vf_gpu_py_unpack() {
  if [ ! -f "$1" ]; then
    echo "env.sh: $1 is missing (bench/gpu/bundle.sh and bundle_python.sh make them)" >&2
    return 1
  fi
  if [ ! -f "$2/.complete" ] || [ "$1" -nt "$2/.complete" ]; then
    rm -rf "$2" && mkdir -p "$2" && tar -C "$2" -xJf "$1" && touch "$2/.complete" ||
      { echo "env.sh: could not unpack $1 into $2" >&2; return 1; }
  fi
}

vf_gpu_py_setup() {
  local here root deps libs arch
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || return 1
  root="$(dirname "$here")"
  libs="${VF_GPU_PY_DIR:-/tmp/vf-gpu-py}"
  deps="${VF_GPU_DEPS_DIR:-/tmp/vf-gpu-deps}"
  vf_gpu_py_unpack "$here/lib.tar.xz" "$libs" || return 1
  vf_gpu_py_unpack "$root/.gpu-deps/deps.tar.xz" "$deps" || return 1
  arch="$(ls -d "$deps"/usr/lib/*-linux-gnu)" && arch="${arch##*/}" || return 1
  LD_LIBRARY_PATH="$libs/lib:$deps/usr/lib/$arch:$deps/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export LD_LIBRARY_PATH
  export PYTHONPATH="$here/python${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$here/bin:$PATH"
  export FASHION_MNIST="$here/data/fashion-mnist"
  export FORTUNES="$here/data/fortunes"
}
vf_gpu_py_setup
vf_gpu_py_rc=$?
unset -f vf_gpu_py_setup vf_gpu_py_unpack
# shellcheck disable=SC2317  # return when sourced, exit when run
return "$vf_gpu_py_rc" 2>/dev/null || exit "$vf_gpu_py_rc"
