#!/usr/bin/env bash
# Prints, one a line, the packages (dpkg) that hold the shared libraries the given binaries load,
# so that an image installs exactly those and nothing else. Fails when a library belongs to no
# package, except the GPU driver's libraries, which the NVIDIA container runtime mounts into GPU
# containers at start. With --bundle-into DIR, a library no package holds (the CUDA runtime,
# cuBLAS and NCCL from the toolkit's wheels, which libvirtualflow-cuda.so links) is copied into
# DIR instead, for the image to carry it; with --bundle-list FILE, such a library is named in FILE
# ("PATH NAME" a line) instead.
#
# usage: runtime-packages.sh [--bundle-into DIR | --bundle-list FILE] BINARY...
#        runtime-packages.sh --check LIST [--bundle-into DIR | --bundle-list FILE] BINARY...
# With --check it prints nothing and fails unless LIST (docker/packages-<image>.txt) names exactly
# those packages plus others that each carry a comment saying why (`name   # reason`). Used by
# the Dockerfiles beside it, in their build stage, and by scripts/images.sh.
set -euo pipefail

DRIVER_LIBS='^(libcuda|libnvidia-ml|libnvidia-ptxjitcompiler)\.so'
check=""
bundle_into=""
bundle_list=""
while [ "$#" -gt 0 ]; do
  case "$1" in
    --check) check="$2"; shift 2 ;;
    --bundle-into) bundle_into="$2"; shift 2 ;;
    --bundle-list) bundle_list="$2"; : > "$bundle_list"; shift 2 ;;
    *) break ;;
  esac
done
[ "$#" -gt 0 ] || { echo "usage: $0 [--check LIST] [--bundle-into DIR] BINARY..." >&2; exit 2; }

names() {  # the names a merged /usr gives library file $1
  local lib="$1" real
  real="$(readlink -f "$lib")"
  printf '%s\n' "$lib" "$real" "${lib#/usr}" "${real#/usr}" "/usr$lib" "/usr$real"
}

# The owners of every name of every library the binaries load, from one dpkg -S: each call reads
# dpkg's whole file database, seconds under load, and a binary loads dozens of libraries.
declare -A owners=()
mapfile -t all_names < <(for bin in "$@"; do
                           [ -f "$bin" ] && ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}'
                         done | sort -u | while read -r lib; do names "$lib"; done | sort -u)
while IFS= read -r line; do
  [[ "$line" == "diversion by "* ]] && continue
  path="${line##*: }"
  [ -n "${owners[$path]:-}" ] || owners[$path]="${line%: *}"
done < <([ "${#all_names[@]}" -eq 0 ] || dpkg -S "${all_names[@]}" 2>/dev/null || true)

owner() {  # the package holding library file $1, under any of its names
  local p
  for p in $(names "$1"); do
    if [ -n "${owners[$p]:-}" ]; then
      echo "${owners[$p]%%:*}"
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
    elif [ -n "$bundle_list" ]; then
      echo "$path $name" >> "$bundle_list"
    elif [ -n "$bundle_into" ]; then
      mkdir -p "$bundle_into"
      cp -L "$path" "$bundle_into/$name"
    else
      echo "runtime-packages: $bin needs $path, which no package holds" >&2
      status=1
    fi
  done < <(ldd "$bin")
done
[ "$status" -eq 0 ] || exit "$status"
linked="$(printf '%s\n' "${packages[@]}" | sort -u)"
if [ -z "$check" ]; then
  echo "$linked"
  exit 0
fi

# The list: a package a line; one the binaries do not link must say why in a comment.
listed="$(sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$check" | sort -u)"
explained="$(sed -n -e 's/^[[:space:]]*\([^#[:space:]]\+\)[[:space:]]*#.*/\1/p' "$check" | sort -u)"
missing="$(comm -23 <(echo "$linked") <(echo "$listed"))"
unexplained="$(comm -23 <(comm -23 <(echo "$listed") <(echo "$linked")) <(echo "$explained"))"
if [ -n "$missing" ]; then
  echo "runtime-packages: $check lacks what the binaries link:" $missing >&2
  status=1
fi
if [ -n "$unexplained" ]; then
  echo "runtime-packages: $check names packages the binaries do not link, without a comment" \
       "saying why:" $unexplained >&2
  status=1
fi
exit "$status"
