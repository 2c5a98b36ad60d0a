#!/usr/bin/env bash
# One command on a fresh machine: install what is needed, build everything (with warnings as
# errors and the sanitizer variants of the unit tests), and run the whole suite under ctest.
# Extra arguments go to ctest (e.g. -L unit, -R integration).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${VF_BUILD_DIR:-$root/build}"
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
cd "$build"
exec ctest --output-on-failure -j "${VF_TEST_JOBS:-2}" "$@"
