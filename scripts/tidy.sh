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

# Sanitizer variants compile the same sources again; checking each file once is enough, with
# its plain flags where it has them (the file only the ASan tests link has only sanitizer ones).
db="$(mktemp -d)"
trap 'rm -rf "$db"' EXIT
# A unit test compiled as one translation unit (VF_UNITY_TESTS) has one entry, for the file that
# includes its sources: each of them gets that entry's flags back, so its findings name it.
# (cmake/VfTargets.cmake writes that file, NAME_unity.cc, with paths from the repository's root.)
python3 - "$build/compile_commands.json" "$db/compile_commands.json" "$root" "$build" <<'EOF'
import json, os, re, sys
seen, out = set(), []
build = os.path.abspath(sys.argv[4]) + "/"
entries = json.load(open(sys.argv[1]))
for entry in sorted(entries, key=lambda e: "-fsanitize" in e.get("command", "")):
    sources = [entry["file"]]
    if entry["file"].endswith("_unity.cc") and entry["file"].startswith(build):
        included = re.findall(r'^#include "([^"]+)"', open(entry["file"]).read(), re.M)
        sources = [os.path.join(sys.argv[3], s) for s in included]
    for source in sources:
        if source in seen:
            continue
        seen.add(source)
        out.append(dict(entry, file=source,
                        command=entry["command"].replace(entry["file"], source)))
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
# A file found clean before, with the same content, headers, flags, checks and clang-tidy, is
# not parsed again (scripts/tidy_cache.py says what the key holds); VF_TIDY_CACHE=off checks
# every file anew. The cache is outside the checkout (with the project's other caches, under
# VF_CACHE_DIR when that is set), so that a fresh clone finds it warm.
cache="${VF_TIDY_CACHE:-${VF_CACHE_DIR:-$HOME/.cache/virtualflow}/tidy}"
checked=("${files[@]}")
if [ "$cache" != off ]; then
  pending="$(python3 "$root/scripts/tidy_cache.py" pending "$db/compile_commands.json" \
             "$cache" "$root" "$build" "$db/keys.json" "${files[@]}")"
  checked=()
  if [ -n "$pending" ]; then mapfile -t checked <<<"$pending"; fi
fi
echo "clang-tidy: ${#files[@]} files, $((${#files[@]} - ${#checked[@]})) of them unchanged" \
     "since found clean (cache: $cache), $jobs at a time"
# run-clang-tidy fails when any file has a finding (every warning is an error, .clang-tidy);
# only the findings are shown, not its bookkeeping.
status=0
if [ "${#checked[@]}" -gt 0 ]; then
  "$tidy" -quiet -p "$db" -j "$jobs" "${checked[@]}" >"$db/out.txt" 2>&1 || status=$?
else
  : >"$db/out.txt"
fi
# Only a clean run is remembered: a finding's file stays unremembered, and so, for want of a
# per-file verdict from run-clang-tidy, do the others checked with it.
if [ "$status" -eq 0 ] && [ "$cache" != off ] && [ "${#checked[@]}" -gt 0 ]; then
  python3 "$root/scripts/tidy_cache.py" record "$cache" "$db/keys.json" "${checked[@]}"
fi
# (run-clang-tidy 14 always asks for colour; the escapes go too.)
sed 's/\x1b\[[0-9;]*m//g' "$db/out.txt" | grep -vE "^[0-9]+ warnings?( and [0-9]+ errors?)? generated\.$|^Suppressed [0-9]+ warnings|^Use -header-filter|^clang-tidy(-[0-9]+)? |^Running clang-tidy|^$" || true
if [ "$status" -eq 0 ]; then echo "clang-tidy: no findings"; fi
exit "$status"
