#!/usr/bin/env bash
# Fails if any C++ file tracked in the repository is not clang-formatted.
set -euo pipefail
cd "$1"
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh' 2>/dev/null || find . -name '*.cc' -o -name '*.h')
[ "${#files[@]}" -gt 0 ] || { echo "no C++ files found"; exit 1; }
bad=0
for f in "${files[@]}"; do
  if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then
    echo "not formatted: $f (run: clang-format -i $f)"
    bad=1
  fi
done
echo "checked ${#files[@]} files"
exit $bad
