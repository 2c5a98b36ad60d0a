# syntax=docker/dockerfile:1
# The agent image, run in every worker pod. Build from the repository root:
#   docker build -f docker/agent.Dockerfile -t virtualflow/agent:0.1.0 .
# scripts/images.sh builds the same image without Docker (tests/images checks that the two agree).
#
# Stage 1 installs the build packages scripts/setup.sh installs and runs scripts/build.sh, the
# README's build, with the CUDA device and the NCCL communicator: scripts/setup-cuda.sh installs
# the CUDA compiler, runtime, cuBLAS and NCCL from the wheels PyTorch uses (no GPU needed).
# Stage 2 is debian:bookworm-slim with the agent, vf (local runs), libvirtualflow-cuda.so, the
# CUDA runtime, cuBLAS and NCCL libraries it links, and the packages of
# docker/packages-agent.txt, which docker/runtime-packages.sh holds to exactly those of the
# shared libraries they load (plus Fashion-MNIST, so that examples/fashion-mnist.yaml runs as it
# is). No compiler, headers or sources in it. The GPU driver's libraries come from the NVIDIA
# container runtime at start.

ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The packages of scripts/setup.sh that the build needs (tests/images/test_dockerfiles.py checks
# that the two lists agree), and python3-pip, with which scripts/setup-cuda.sh installs the CUDA
# wheels. Left out: dataset-fashion-mnist and procps (for running jobs and tests), prometheus
# (promtool, for tests), clang-format and clang-tidy (lint), openssl, util-linux and Go (the
# end-to-end tests' tools).
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config git python3 \
      libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev \
      prometheus-cpp-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcli11-dev python3-pip \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# scripts/build.sh: the same CMake configuration as every developer's and CI's build
# (RelWithDebInfo, warnings are errors), with the CUDA toolkit scripts/setup-cuda.sh provides
# (VF_PYTHON_ENV=off: no PyTorch environment; the toolkit's wheels go into a cache).
RUN VF_PYTHON_ENV=off VF_BUILD_DIR=/build ./scripts/build.sh virtualflow-agent vf virtualflow-cuda \
 && mkdir -p /out \
 && for f in virtualflow-agent vf libvirtualflow-cuda.so; do \
      strip --strip-debug -o "/out/$f" "/build/bin/$f"; done \
 && ./docker/runtime-packages.sh --check docker/packages-agent.txt --bundle-into /out/cuda \
      /out/virtualflow-agent /out/vf /out/libvirtualflow-cuda.so \
 && sed -e 's/#.*//' docker/packages-agent.txt | xargs -n1 > /out/packages

FROM ${RUNTIME_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG VF_REVISION=unknown
ARG VF_SOURCE=unknown
COPY --from=build /out/packages /tmp/packages
# dataset-fashion-mnist (in the list) puts the IDX files under /usr/share/datasets/fashion-mnist,
# the default spec.dataset.path.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive xargs -a /tmp/packages \
      apt-get install -y -q --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log /tmp/packages \
 && groupadd --system --gid 65532 virtualflow \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin virtualflow
COPY --from=build /out/virtualflow-agent /usr/local/bin/virtualflow-agent
COPY --from=build /out/vf /usr/local/bin/vf
# The CUDA device and NCCL communicator, which the agent loads from beside itself on a GPU, and
# the CUDA runtime, cuBLAS and NCCL it links, where ld.so finds them.
COPY --from=build /out/libvirtualflow-cuda.so /usr/local/bin/libvirtualflow-cuda.so
COPY --from=build /out/cuda /usr/local/lib/virtualflow-cuda
RUN echo /usr/local/lib/virtualflow-cuda > /etc/ld.so.conf.d/virtualflow-cuda.conf && ldconfig

LABEL org.opencontainers.image.title="virtualflow-agent" \
      org.opencontainers.image.description="VirtualFlow agent: trains a job's virtual nodes on CPUs or CUDA with NCCL" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${VF_REVISION}" \
      org.opencontainers.image.source="${VF_SOURCE}"
USER 65532:65532
WORKDIR /tmp
# The operator starts it with --job, --coordinator, --worker and the token.
ENTRYPOINT ["/usr/local/bin/virtualflow-agent"]
