#!/usr/bin/env bash
# Checks that the dependency bundle is complete: builds and tests the runtime as bench/gpu/run.sh
# does on a GPU machine, here, with this machine's copies of the bundled packages hidden (bind
# mounts in a private mount namespace; needs unprivileged user namespaces). GPU tests skip.
#
#   bench/gpu/bundle.sh && bench/gpu/check_bundle.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
if [ "${1:-}" != "--inside" ]; then
  exec unshare --user --map-root-user --mount "$0" --inside
fi
empty_dir="$(mktemp -d)"
empty_file="$(mktemp)"
a="$(gcc -print-multiarch)"
for d in /usr/include/{yaml-cpp,gtest,gmock,openssl,nlohmann,gloo,cpprest,CLI} \
  /usr/include/"$a"/{openssl,openblas-pthread} /usr/lib/"$a"/openblas-pthread \
  /usr/lib/"$a"/cmake/{yaml-cpp,GTest,openblas,cpprestsdk} /usr/share/cmake/{Gloo,nlohmann_json,CLI11}; do
  [ -d "$d" ] && mount --bind "$empty_dir" "$d"
done
# Regular files only: a bind mount over a symbolic link would hide its target, which the
# system's own programs may need (libz.so.1, libcrypto.so.3).
for f in /usr/include/{zlib.h,zconf.h} /usr/lib/"$a"/lib{gtest,gmock,crypto,ssl,z,yaml-cpp}.a \
  /usr/lib/libgloo.so.0.5.0; do
  [ -f "$f" ] && [ ! -L "$f" ] && mount --bind "$empty_file" "$f"
done
[ -z "$(ls -A /usr/include/yaml-cpp)" ] || { echo "check_bundle: could not hide packages" >&2; exit 1; }
VF_GPU_BUILD_DIR="${VF_GPU_BUILD_DIR:-$root/build-gpu-check}" VF_GPU_DEPS_DIR="$(mktemp -d)" \
  "$root/bench/gpu/run.sh" --no-bench
