# syntax=docker/dockerfile:1
# The agent image, run in every worker pod. Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t virtualflow/agent:0.1.0 .
#
# Stage 1 is NVIDIA's CUDA development image (CUDA toolkit and NCCL headers); it installs the
# build packages scripts/setup.sh installs and runs scripts/build.sh, the README's build, with
# the CUDA device and the NCCL communicator switched on. Stage 2 is the CUDA runtime image of the
# same version (CUDA libraries and NCCL) with the agent, the Debian/Ubuntu packages of the shared
# libraries it loads (docker/runtime-packages.sh), and Fashion-MNIST, so that
# examples/fashion-mnist.yaml runs as it is. No compiler, headers or sources in it.

ARG CUDA_VERSION=13.0.0
ARG CUDA_DISTRO=ubuntu24.04
# GPU architectures to compile kernels for (CMAKE_CUDA_ARCHITECTURES): Ampere (A100, A10),
# Ada (L4, L40) and Hopper (H100, H200).
ARG CUDA_ARCHITECTURES="80;86;89;90"

FROM nvidia/cuda:${CUDA_VERSION}-devel-${CUDA_DISTRO} AS build
ARG CUDA_ARCHITECTURES
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The packages of scripts/setup.sh that the build needs (tests/e2e/test_chart.py checks that
# the two lists agree); Ubuntu names them as Debian does. Left out: dataset-fashion-mnist and
# procps (installed in the final stage / for tests), prometheus (promtool, for tests),
# clang-format and clang-tidy (lint), openssl, util-linux and Go (the end-to-end tests' tools).
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config git python3 \
      libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev \
      prometheus-cpp-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcli11-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The CUDA and NCCL options go into the build directory's cache first; scripts/build.sh then
# configures it as every developer's and CI's build (RelWithDebInfo, warnings are errors),
# keeping them, and builds the agent only.
RUN cmake -S . -B /build -G Ninja -DVF_WITH_CUDA=ON -DVF_WITH_NCCL=ON \
      -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" >/dev/null \
 && VF_PYTHON_ENV=off VF_BUILD_DIR=/build ./scripts/build.sh virtualflow-agent \
 && mkdir -p /out \
 && strip --strip-debug -o /out/virtualflow-agent /build/bin/virtualflow-agent \
 && strip --strip-debug -o /out/libvirtualflow-cuda.so /build/bin/libvirtualflow-cuda.so \
 && ./docker/runtime-packages.sh /out/virtualflow-agent /out/libvirtualflow-cuda.so \
      > /out/runtime-packages \
 && cat /out/runtime-packages

FROM nvidia/cuda:${CUDA_VERSION}-runtime-${CUDA_DISTRO}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY --from=build /out/runtime-packages /tmp/runtime-packages
# The runtime image already holds the CUDA libraries and NCCL (libnccl2), so for those the list
# installs nothing new. dataset-fashion-mnist puts the IDX files under
# /usr/share/datasets/fashion-mnist, the default spec.dataset.path.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive xargs -a /tmp/runtime-packages \
      apt-get install -y -q --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log \
      /tmp/runtime-packages \
 && groupadd --system --gid 65532 virtualflow \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin virtualflow
COPY --from=build /out/virtualflow-agent /usr/local/bin/virtualflow-agent
# The CUDA device and NCCL communicator, which the agent loads from beside itself on a GPU.
COPY --from=build /out/libvirtualflow-cuda.so /usr/local/bin/libvirtualflow-cuda.so

LABEL org.opencontainers.image.title="virtualflow-agent" \
      org.opencontainers.image.description="VirtualFlow agent: trains a job's virtual nodes on CUDA with NCCL" \
      org.opencontainers.image.version="0.1.0"
USER 65532:65532
WORKDIR /tmp
# The operator starts it with --job, --coordinator, --worker and the token.
ENTRYPOINT ["/usr/local/bin/virtualflow-agent"]
