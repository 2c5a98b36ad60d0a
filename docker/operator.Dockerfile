# syntax=docker/dockerfile:1
# The operator image. Build from the repository root:
#   docker build -f docker/operator.Dockerfile -t virtualflow/operator:0.1.0 .
# scripts/images.sh builds the same image without Docker (tests/images checks that the two agree).
#
# Stage 1 installs the build packages scripts/setup.sh installs and runs scripts/build.sh, the
# README's build, for the one target. Stage 2 is debian:bookworm-slim with the binary and the
# packages of docker/packages-operator.txt, which docker/runtime-packages.sh holds to exactly
# those of the shared libraries it loads: no compiler, no headers, no sources, no package lists.

ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The packages of scripts/setup.sh that the build needs (tests/images/test_dockerfiles.py checks
# that the two lists agree). Left out: dataset-fashion-mnist and procps (for running jobs and
# tests), prometheus (promtool checks the metrics format in tests), clang-format and clang-tidy
# (lint), openssl, util-linux and Go (the end-to-end tests' tools).
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config git python3 \
      libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev \
      prometheus-cpp-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcli11-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# scripts/build.sh: the same CMake configuration as every developer's and CI's build
# (RelWithDebInfo, warnings are errors), built for the operator only, which uses no GPU
# (VF_CUDA=off: no CUDA toolkit in this image; VF_PYTHON_ENV=off: no PyTorch either).
RUN VF_CUDA=off VF_PYTHON_ENV=off VF_BUILD_DIR=/build ./scripts/build.sh virtualflow-operator \
 && mkdir -p /out \
 && strip --strip-debug -o /out/virtualflow-operator /build/bin/virtualflow-operator \
 && ./docker/runtime-packages.sh --check docker/packages-operator.txt /out/virtualflow-operator \
 && sed -e 's/#.*//' docker/packages-operator.txt | xargs -n1 > /out/packages

FROM ${RUNTIME_IMAGE}
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ARG VF_REVISION=unknown
ARG VF_SOURCE=unknown
COPY --from=build /out/packages /tmp/packages
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive xargs -a /tmp/packages \
      apt-get install -y -q --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/apt /var/log/dpkg.log /tmp/packages \
 && groupadd --system --gid 65532 virtualflow \
 && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin virtualflow
COPY --from=build /out/virtualflow-operator /usr/local/bin/virtualflow-operator

LABEL org.opencontainers.image.title="virtualflow-operator" \
      org.opencontainers.image.description="VirtualFlow Kubernetes operator: VirtualFlowJob controller and coordinator" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${VF_REVISION}" \
      org.opencontainers.image.source="${VF_SOURCE}"
# The chart's security context runs it as this user with a read-only root file system.
USER 65532:65532
WORKDIR /
# 7070: the coordinator agents talk to; 8080: /metrics, /healthz, /readyz.
EXPOSE 7070 8080
ENTRYPOINT ["/usr/local/bin/virtualflow-operator"]
