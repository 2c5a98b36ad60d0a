#!/usr/bin/env bash
# Checks that .gpu-py/ (bench/gpu/bundle_python.sh) works without this machine's packages, as on
# the GPU machine: no library in it needs glibc newer than 2.36; then, in a private mount
# namespace (needs unprivileged user namespaces) with this machine's copies of every library
# .gpu-py/lib.tar.xz and .gpu-deps/deps.tar.xz provide hidden, and `source .gpu-py/env.sh` (both
# unpacked afresh), CPython 3.12 imports virtualflow._core, `vf --help` runs, and both resolve
# every library beyond glibc, libstdc++ and libgcc_s from the bundles. PyTorch is not needed:
# virtualflow.torch is left to the GPU machine.
#
#   bench/gpu/bundle.sh && bench/gpu/bundle_python.sh && bench/gpu/check_python.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
py="$root/.gpu-py"
python312="${VF_PY312:-/root/.pyenv/versions/3.12.1/bin/python3}"
fail() { echo "check_python: $*" >&2; exit 1; }
[ -f "$py/env.sh" ] || fail "$py is missing: run bench/gpu/bundle_python.sh"
core="$(ls "$py"/python/virtualflow/_core.cpython-312-*.so)"

if [ "${1:-}" != "--inside" ]; then
  # glibc: the newest symbol version any carried binary needs, against the GPU machine's 2.36.
  libs="$(mktemp -d)"
  tar -C "$libs" -xJf "$py/lib.tar.xz"
  symbols="$(for f in "$libs"/lib/* "$py/bin/vf" "$core"; do objdump -T "$f"; done)"
  newest="$(grep -o 'GLIBC_[0-9.]*' <<<"$symbols" | sed 's/GLIBC_//' | sort -uV | tail -n 1)"
  [ "$(printf '%s\n2.36\n' "$newest" | sort -V | tail -n 1)" = 2.36 ] ||
    fail "a carried binary needs GLIBC_$newest, newer than 2.36"
  cxx="$(grep -o 'GLIBCXX_[0-9.]*' <<<"$symbols" | sort -uV | tail -n 1)"
  echo "check_python: newest symbol versions needed: GLIBC_$newest (<= 2.36), $cxx"
  rm -rf "$libs"
  exec unshare --user --map-root-user --mount "$0" --inside
fi

# Hide the real files behind every soname the bundles carry and every one vf and _core need
# beyond glibc, libstdc++ and libgcc_s (the Debian packages' copies).
system_libs='^(libc|libm|libpthread|libdl|librt|libresolv|libstdc\+\+|libgcc_s)\.so'
a="$(gcc -print-multiarch)"
empty_dir="$(mktemp -d)"
empty_file="$(mktemp)"
names="$(tar -tJf "$py/lib.tar.xz" | xargs -n1 basename
  tar -tJf "$root/.gpu-deps/deps.tar.xz" | grep '\.so' | xargs -n1 basename
  ldd "$py/bin/vf" "$core" | awk '$2 == "=>" {print $1}' | grep -vE "$system_libs")"
hidden=0
for name in $names; do
  for d in /usr/lib/"$a" /lib/"$a" /usr/lib; do
    [ -e "$d/$name" ] || continue
    real="$(readlink -f "$d/$name")"
    if [ -f "$real" ] && [ -s "$real" ]; then
      mount --bind "$empty_file" "$real" && hidden=$((hidden + 1))
    fi
  done
done
[ -d /usr/lib/"$a"/openblas-pthread ] && mount --bind "$empty_dir" /usr/lib/"$a"/openblas-pthread
[ "$hidden" -gt 0 ] || fail "could not hide the system's libraries"
echo "check_python: hid $hidden system libraries"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export VF_GPU_DEPS_DIR="$tmp/deps" VF_GPU_PY_DIR="$tmp/py"
cd "$root"
# shellcheck source=/dev/null
source .gpu-py/env.sh
export PATH="$(dirname "$python312"):$PATH"
python3 -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version'
python3 -c 'import virtualflow, virtualflow._core as c
print("check_python: imported", c.__name__, "from", c.__file__)'
vf --help >/dev/null || fail "vf --help failed"
echo "check_python: vf --help ran ($(command -v vf))"
# Every library beyond glibc, libstdc++ and libgcc_s comes from .gpu-py/lib or the bundle.
outside="$(ldd "$py/bin/vf" "$core" | awk '$2 == "=>" {print $1, $3}' | sort -u |
  grep -vE "$system_libs" |
  grep -vE " ($VF_GPU_PY_DIR|$VF_GPU_DEPS_DIR)/" || true)"
[ -z "$outside" ] || fail "libraries not from the bundles: $outside"
echo "check_python: every library of vf and _core resolves into the unpacked bundles"
echo "check_python: ok"
