# syntax=docker/dockerfile:1
# The agent image for PyTorch jobs (examples/torch-cnn.yaml): a worker is the job's own Python
# program, which joins through the virtualflow package. Build from the repository root:
#   docker build -f docker/torch-agent.Dockerfile -t virtualflow/torch-agent:0.1.0 .
# scripts/images.sh builds the same image without Docker (tests/images checks that the two agree).
#
# Stage 1 installs the build packages scripts/setup.sh installs, makes the PyTorch environment
# (scripts/setup-python.sh) and runs scripts/build.sh for vf and the virtualflow package.
# Stage 2 is debian:bookworm-slim with Debian's Python 3.11, the packages of
# docker/packages-torch-agent.txt (held by docker/runtime-packages.sh to exactly those of the
# libraries vf and the package's extension load, plus python3 and Fashion-MNIST), PyTorch and
# what it requires (docker/python-files.py; without triton, torch.compile's kernel compiler),
# the virtualflow package, vf, libvirtualflow-cuda.so (on PyTorch's CUDA and NCCL libraries)
# and examples/torch. A job's command (python3 examples/torch/cnn.py) runs from /opt/virtualflow.

ARG BUILD_IMAGE=debian:bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

FROM ${BUILD_IMAGE} AS build
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
# The packages of scripts/setup.sh that the build needs (tests/images/test_dockerfiles.py checks
# that the two lists agree), and python3-venv for the PyTorch environment.
RUN apt-get update -q \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
      build-essential cmake ninja-build pkg-config git python3 \
      libgloo-dev libcpprest-dev nlohmann-json3-dev libyaml-cpp-dev zlib1g-dev libssl-dev \
      prometheus-cpp-dev libgtest-dev libgmock-dev libopenblas-dev \
      libcli11-dev python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# scripts/build.sh makes the environment (scripts/setup-python.sh) and builds as every
# developer's and CI's build does, for vf and the package only.
RUN VF_BUILD_DIR=/build ./scripts/build.sh vf virtualflow_python virtualflow-cuda \
 && mkdir -p /out/site \
 && strip --strip-debug -o /out/vf /build/bin/vf \
 && strip --strip-debug -o /out/libvirtualflow-cuda.so /build/bin/libvirtualflow-cuda.so \
 && cp -r /build/python/virtualflow /out/site/virtualflow \
 && ./docker/runtime-packages.sh --check docker/packages-torch-agent.txt \
      /out/vf /out/site/virtualflow/_core.*.so \
 && sed -e 's/#.*//' docker/packages-torch-agent.txt | xargs -n1 > /out/packages \
 && site="$(~/.cache/virtualflow/py/bin/python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
 && cd "$site" \
 && ~/.cache/virtualflow/py/bin/python3 /src/docker/python-files.py --exclude triton torch numpy \
    | tr '\n' '\0' | xargs -0 cp --parents -t /out/site

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
COPY --from=build /out/site /usr/local/lib/python3.11/dist-packages
COPY --from=build /out/vf /usr/local/bin/vf
# NCCL collectives (VF_TORCH_COLLECTIVES=nccl): the CUDA plugin, on the CUDA runtime, cuBLAS and
# NCCL of PyTorch's wheels, which `import torch` loads. A worker's executable is the
# interpreter, so the plugin is named.
COPY --from=build /out/libvirtualflow-cuda.so /usr/local/bin/libvirtualflow-cuda.so
ENV VF_CUDA_PLUGIN=/usr/local/bin/libvirtualflow-cuda.so
COPY --from=build /src/examples/torch /opt/virtualflow/examples/torch

LABEL org.opencontainers.image.title="virtualflow-torch-agent" \
      org.opencontainers.image.description="VirtualFlow for PyTorch: the virtualflow package, PyTorch and vf" \
      org.opencontainers.image.version="0.1.0" \
      org.opencontainers.image.revision="${VF_REVISION}" \
      org.opencontainers.image.source="${VF_SOURCE}"
USER 65532:65532
WORKDIR /opt/virtualflow
CMD ["python3"]
