#!/usr/bin/env bash
# Packs the runtime's build dependencies that a GPU build host lacks into .gpu-deps/deps.tar.xz.
#
# The GPU machine has a compiler, CMake, CUDA, NCCL and PyTorch but no Debian development
# packages and no package registry. bench/gpu/run.sh builds the runtime there (VF_RUNTIME_ONLY)
# against this bundle: headers, CMake package files and libraries of yaml-cpp, GoogleTest,
# OpenSSL's libcrypto, zlib, OpenBLAS and Gloo, and CLI11 (headers only), copied from this
# machine's Debian packages (run scripts/setup.sh first). Debian 12's libraries need glibc 2.36
# and GCC 12's libstdc++ or newer. The result is ~15 MB; .gpu-deps/ is ignored by git, so it
# travels only when named explicitly.
#
#   bench/gpu/bundle.sh        (re)writes .gpu-deps/deps.tar.xz
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
out="$root/.gpu-deps"
arch="$(gcc -print-multiarch)"
inc=/usr/include
lib="/usr/lib/$arch"

stage="$(mktemp -d)"
trap 'rm -rf "$stage"' EXIT
p="$stage/usr"
mkdir -p "$p/include/openssl" "$p/lib/$arch/cmake"

need() {
  for f; do
    [ -e "$f" ] || { echo "bundle: $f is missing (run scripts/setup.sh first)" >&2; exit 1; }
  done
}

# Headers. OpenSSL's configuration headers live in Debian's multiarch include directory, which
# is no search path under another prefix, so they join the others.
need "$inc/yaml-cpp" "$inc/gtest" "$inc/gmock" "$inc/openssl" "$inc/$arch/openssl" \
  "$inc/zlib.h" "$inc/zconf.h" "$inc/$arch/openblas-pthread/cblas.h" "$inc/gloo" "$inc/CLI"
cp -r "$inc/yaml-cpp" "$inc/gtest" "$inc/gmock" "$inc/gloo" "$inc/CLI" "$p/include/"
cp "$inc"/openssl/*.h "$inc/$arch"/openssl/*.h "$p/include/openssl/"
cp "$inc/zlib.h" "$inc/zconf.h" "$p/include/"
mkdir -p "$p/include/openblas-pthread"
cp "$inc/$arch"/openblas-pthread/*.h "$p/include/openblas-pthread/"

# Libraries: static where Debian ships them, else the shared library and what it needs.
need "$lib/libgtest.a" "$lib/libgmock.a" "$lib/libcrypto.a" "$lib/libz.a"
cp "$lib"/libgtest.a "$lib"/libgtest_main.a "$lib"/libgmock.a "$lib"/libgmock_main.a \
  "$lib"/libcrypto.a "$lib"/libz.a "$p/lib/$arch/"
yaml="$(readlink -f "$lib/libyaml-cpp.so")"
need "$yaml"
cp "$yaml" "$p/lib/$arch/"
(cd "$p/lib/$arch" && ln -s "$(basename "$yaml")" libyaml-cpp.so &&
  ln -s "$(basename "$yaml")" "$(objdump -p "$yaml" | awk '/SONAME/ {print $2}')")
openblas="$(readlink -f "$lib/openblas-pthread/libopenblas.so.0")"
need "$openblas"
cp "$openblas" "$p/lib/$arch/libopenblas.so.0"
ln -s libopenblas.so.0 "$p/lib/$arch/libopenblas.so"
# Gloo (Debian installs it outside the multiarch directory) and the libraries it needs.
gloo="$(readlink -f /usr/lib/libgloo.so)"
need "$gloo" /usr/share/cmake/Gloo
cp "$gloo" "$p/lib/"
(cd "$p/lib" && ln -s "$(basename "$gloo")" libgloo.so.0 && ln -s libgloo.so.0 libgloo.so)
for so in libgfortran.so.5 libquadmath.so.0 libhiredis.so.0.14 libibverbs.so.1 \
  libnl-route-3.so.200 libnl-3.so.200; do
  need "$lib/$so"
  cp "$(readlink -f "$lib/$so")" "$p/lib/$arch/$so"
done

# CMake package files: they locate their prefix relative to themselves.
need "$lib/cmake/yaml-cpp" "$lib/cmake/GTest"
cp -r "$lib/cmake/yaml-cpp" "$lib/cmake/GTest" "$p/lib/$arch/cmake/"
need /usr/share/cmake/CLI11
mkdir -p "$p/share/cmake"
cp -r /usr/share/cmake/Gloo /usr/share/cmake/CLI11 "$p/share/cmake/"
# Gloo's names its library by absolute path; made relative to its prefix like the others.
sed -i "s|$(dirname "$gloo")/|\${_IMPORT_PREFIX}/lib/|g" "$p"/share/cmake/Gloo/GlooTargets-*.cmake

mkdir -p "$out"
tar -C "$stage" -cJf "$out/deps.tar.xz.tmp" usr
mv "$out/deps.tar.xz.tmp" "$out/deps.tar.xz"
echo "bundle: wrote $out/deps.tar.xz ($(du -h "$out/deps.tar.xz" | cut -f1))"
