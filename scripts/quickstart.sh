#!/usr/bin/env bash
# One command on a fresh machine: install what is needed, build, and train the example job
# locally with elastic-ready workers. Extra arguments go to `vf run` (e.g. --workers 4).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
"$root/scripts/setup.sh"
# The built-in model needs no PyTorch: skip the Python environment unless asked for.
VF_PYTHON_ENV="${VF_PYTHON_ENV:-off}" "$root/scripts/build.sh" vf virtualflow-agent
exec "${VF_BUILD_DIR:-$root/build}/bin/vf" run "$root/examples/fashion-mnist.yaml" "$@"
