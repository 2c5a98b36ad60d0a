#!/usr/bin/env bash
# Runs every CPU benchmark of the runtime and prints the tables recorded in docs/benchmarks.md.
# Builds first. Run it on an otherwise idle machine.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
"$root/scripts/build.sh" vf-bench vf virtualflow-agent >/dev/null
bin="${VF_BUILD_DIR:-$root/build}/bin/vf-bench"
"$bin" vnode-overhead --repeats 15
echo
"$bin" products --repeats 15
echo
"$bin" reduction
echo
"$bin" memory
echo
python3 "$root/bench/exact_vs_fast.py" --vf "${VF_BUILD_DIR:-$root/build}/bin/vf"
