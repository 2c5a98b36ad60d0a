#!/usr/bin/env bash
# Fails if the Python tracked in the repository is not ruff-formatted or has ruff findings
# (ruff.toml), or if the typed part of it (the virtualflow package with its extension's stub, the
# examples, bench/torch) does not pass mypy --strict (mypy.ini). Uses the ruff and mypy of the
# Python environment $VF_PYTHON (scripts/setup-python.sh pins them); exits 77, which ctest
# counts as skipped, without one.
#
# usage: VF_PYTHON=... check_python.sh SOURCE_DIR CACHE_DIR    (CACHE_DIR: ruff's and mypy's)
set -euo pipefail
root="$1" cache="$2"
python="${VF_PYTHON:-}"
if [ -z "$python" ] || ! "$python" -c 'import mypy, ruff' 2>/dev/null; then
  echo "skipped: no Python environment with ruff and mypy (VF_PYTHON='$python'; scripts/setup-python.sh makes one)"
  exit 77
fi
cd "$root"
mapfile -t files < <(git ls-files '*.py' '*.pyi' 2>/dev/null || find . -name '*.py' -o -name '*.pyi')
[ "${#files[@]}" -gt 0 ] || { echo "no Python files found"; exit 1; }
export RUFF_CACHE_DIR="$cache/ruff"
bad=0
# --force-exclude: the files named are still subject to ruff.toml's exclusions.
"$python" -m ruff format --check --force-exclude "${files[@]}" || {
  echo "not formatted (run: $python -m ruff format)"; bad=1; }
"$python" -m ruff check --force-exclude "${files[@]}" || bad=1
"$python" -m mypy --cache-dir "$cache/mypy" --strict python/virtualflow examples/torch bench/torch \
  scripts/suite_failures.py scripts/suite_failures_test.py tests/run_unittest.py \
  tests/run_unittest_test.py ||
  bad=1
echo "checked ${#files[@]} files"
exit $bad
