#!/usr/bin/env bash
# Runs clang-tidy (the checks in .clang-tidy) over the repository's C++ files and fails on any
# finding. Arguments are path prefixes to check (default: every tracked .cc file), e.g.
#   scripts/tidy.sh runtime/ cli/
# --no-tests leaves out the unit tests (*_test.cc), whose GoogleTest headers are slow to parse.
# Uses build/ (or $VF_BUILD_DIR) for the compile commands, configuring it if needed. The whole
# tree takes ~30 CPU-minutes of parsing (runtime/ and cli/ with their tests ~10), which is why
# the test suite runs it on the runtime's and the CLI's own code only (lint.clang_tidy).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
if [ ! -f "$build/compile_commands.json" ]; then
  "$root/scripts/setup.sh" >/dev/null
  "$root/scripts/build.sh" --version >/dev/null  # configures only
fi
tidy="$(command -v run-clang-tidy || command -v run-clang-tidy-14 || true)"
if [ -z "$tidy" ]; then
  echo "tidy.sh: run-clang-tidy not found (scripts/setup.sh installs clang-tidy)" >&2
  exit 1
fi

# Sanitizer variants compile the same sources again; checking each file once is enough.
db="$(mktemp -d)"
trap 'rm -rf "$db"' EXIT
python3 - "$build/compile_commands.json" "$db/compile_commands.json" <<'EOF'
import json, sys
seen, out = set(), []
for entry in json.load(open(sys.argv[1])):
    if "-fsanitize" in entry.get("command", "") or entry["file"] in seen:
        continue
    seen.add(entry["file"])
    out.append(entry)
json.dump(out, open(sys.argv[2], "w"))
open(sys.argv[2] + ".files", "w").write("".join(f + "\n" for f in sorted(seen)))
EOF

tests=1
if [ "${1:-}" = "--no-tests" ]; then
  tests=0
  shift
fi
cd "$root"
if [ "$#" -eq 0 ]; then set -- ""; fi
files=()
for prefix in "$@"; do
  # A pathspec's * matches across directories too.
  while IFS= read -r f; do
    if [ "$tests" -eq 0 ] && [[ "$f" == *_test.cc ]]; then continue; fi
    # Only what this build compiles: without CUDA, say, the CUDA sources have no flags.
    if grep -qxF "$root/$f" "$db/compile_commands.json.files"; then files+=("$root/$f"); fi
  done < <(git ls-files "${prefix}*.cc")
done
if [ "${#files[@]}" -eq 0 ]; then
  echo "tidy.sh: no .cc files under: $*" >&2
  exit 1
fi
jobs="${VF_BUILD_JOBS:-$(nproc)}"
echo "clang-tidy: ${#files[@]} files, $jobs at a time"
# run-clang-tidy fails when any file has a finding (every warning is an error, .clang-tidy);
# only the findings are shown, not its bookkeeping.
status=0
"$tidy" -quiet -p "$db" -j "$jobs" "${files[@]}" >"$db/out.txt" 2>&1 || status=$?
# (run-clang-tidy 14 always asks for colour; the escapes go too.)
sed 's/\x1b\[[0-9;]*m//g' "$db/out.txt" | grep -vE "^[0-9]+ warnings?( and [0-9]+ errors?)? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^clang-tidy(-[0-9]+)? |^Running clang-tidy|^$" || true
if [ "$status" -eq 0 ]; then echo "clang-tidy: no findings"; fi
exit "$status"
