#!/usr/bin/env bash
# Prints, one a line, the packages (dpkg) that hold the shared libraries the given binaries load,
# so that a final image stage installs exactly those and nothing else. Fails when a library
# belongs to no package, except the GPU driver's libraries, which the NVIDIA container runtime
# mounts into GPU containers at start. Used by the Dockerfiles beside it, in their build stage.
set -euo pipefail
[ "$#" -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }

DRIVER_LIBS='^(libcuda|libnvidia-ml|libnvidia-ptxjitcompiler)\.so'

owner() {  # the package holding library file $1, trying the names a merged /usr gives it
  local lib="$1" real
  real="$(readlink -f "$lib")"
  for p in "$lib" "$real" "${lib#/usr}" "${real#/usr}" "/usr$lib" "/usr$real"; do
    if out="$(dpkg -S "$p" 2>/dev/null)"; then
      echo "${out%%:*}"
      return 0
    fi
  done
  return 1
}

status=0
packages=()
for bin in "$@"; do
  [ -f "$bin" ] || { echo "runtime-packages: no such file: $bin" >&2; exit 1; }
  while read -r name arrow path _; do
    [ "$arrow" = "=>" ] || continue
    if [ "$path" = "not" ]; then
      [[ "$name" =~ $DRIVER_LIBS ]] && continue
      echo "runtime-packages: $bin needs $name, which is not found" >&2
      status=1
    elif pkg="$(owner "$path")"; then
      packages+=("${pkg%%,*}")
    else
      echo "runtime-packages: $bin needs $path, which no package holds" >&2
      status=1
    fi
  done < <(ldd "$bin")
done
[ "$status" -eq 0 ] || exit "$status"
printf '%s\n' "${packages[@]}" | sort -u
