#!/usr/bin/env bash
# Installs what VirtualFlow needs on a fresh Debian machine. Idempotent: packages already
# present are not touched, and the package index is refreshed only when something is missing.
#
# usage: scripts/setup.sh           everything: the whole build and its test suite (scripts/test.sh)
#        scripts/setup.sh example   only what building vf and virtualflow-agent and training the
#                                   built-in example take (scripts/quickstart.sh); with VF_CUDA=on
#                                   also what scripts/setup-cuda.sh needs to fetch a CUDA toolkit
set -euo pipefail

scope="${1:-all}"
case "$scope" in
  all | example) ;;
  *) echo "usage: $0 [example]" >&2; exit 2 ;;
esac

# Everything. A library the build links goes into EXAMPLE_PACKAGES below too.
PACKAGES=(
  build-essential cmake ninja-build pkg-config git python3 procps
  libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev
  prometheus-cpp-dev libgtest-dev libgmock-dev libopenblas-dev
  libcli11-dev   # every binary's command line (header-only)
  dataset-fashion-mnist prometheus
  python3-venv   # scripts/setup-python.sh: the environment with PyTorch
  fortunes       # examples/torch/gpt.py's corpus
  clang-format clang-tidy
  clang-14 libclang-rt-14-dev   # the fuzzers (libFuzzer) in build/fuzz
  ccache   # scripts/build.sh: a rebuild of sources compiled before takes a minute
  openssl util-linux iproute2   # tests/e2e: control-plane certificates, flock, the pods' networks
  mmdebstrap umoci runc skopeo   # scripts/images.sh, tests/images: images without a daemon; pushing
  containerd containernetworking-plugins iptables   # tests/e2e: the real nodes (kubelets)
)
# tests/e2e/build-k8s-tools.sh builds Kubernetes from source with Go. The machine image brings a
# recent Go; without one, Debian's golang-go bootstraps the toolchain that script pins.
command -v go >/dev/null || PACKAGES+=(golang-go)
# scripts/setup-cuda.sh installs the CUDA wheels with pip when the machine has no toolkit.
python3 -m pip --version >/dev/null 2>&1 || PACKAGES+=(python3-pip)

# The built-in example (scripts/quickstart.sh): the compiler and build tools, every library CMake
# looks for when it configures a tree without the tests (vf and virtualflow-agent link most of
# them), and the dataset it trains on. Not the test suite's tools and libraries, the fuzzers'
# clang, the image tools or PyTorch's environment.
EXAMPLE_PACKAGES=(
  build-essential cmake ninja-build
  libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev
  prometheus-cpp-dev libopenblas-dev libcli11-dev
  dataset-fashion-mnist
)
if [ "$scope" = example ]; then
  PACKAGES=("${EXAMPLE_PACKAGES[@]}")
  # The CUDA wheels need python3 and pip, when the example builds the GPU code (VF_CUDA=on, which
  # scripts/quickstart.sh sets on a machine with an NVIDIA GPU) and the machine has no toolkit.
  if [ "${VF_CUDA:-on}" != off ] && ! command -v nvcc >/dev/null; then
    PACKAGES+=(python3)
    python3 -m pip --version >/dev/null 2>&1 || PACKAGES+=(python3-pip)
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present ($scope)"
else
  install_packages=1
fi

if [ -n "${install_packages:-}" ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The CUDA compiler, runtime, cuBLAS and NCCL come with the build (scripts/build.sh runs
# scripts/setup-cuda.sh after scripts/setup-python.sh, so that PyTorch's CUDA wheels serve both).
