# The image deploy/kubernetes.py's manifests run (every role, CPU hosts): this repository at /opt/empo2,
# set up by scripts/setup.sh (Java for ScienceWorld, the venv, the embedded model converted once).
#   docker build -f deploy/kubernetes.Dockerfile -t empo2:latest .
# For GPU nodes build with --build-arg EMPO2_TARGET=gpu (vLLM's CUDA build). Not built in this
# project's CI (no Docker daemon there); the manifests are validated offline (tests/unit/deploy/test_kubernetes.py).
FROM python:3.11-slim-bookworm
ARG EMPO2_TARGET=cpu
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        default-jre-headless make git gcc g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/empo2
COPY . .
# no Prometheus in the image: the cluster's Prometheus scrapes the pods (their prometheus.io annotations)
RUN EMPO2_TARGET=$EMPO2_TARGET EMPO2_PROMETHEUS=0 bash scripts/setup.sh
