# One image for both halves of alpineagents:
#   runner (default):  python -m alpineagents run        (what AgentRun pods execute)
#   operator:          python -m alpineagents_operator   (the Helm chart's Deployment)
#
# Build:  docker build -t alpineagents:dev .
# (needs BuildKit, the default builder since Docker 23, for the RUN --mount below)
#
# The base is pinned by tag. For byte-for-byte reproducible builds pin its digest as well:
#   docker buildx imagetools inspect python:3.11-slim-bookworm   # prints "Digest: sha256:..."
# then build with
#   --build-arg PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:<that digest>
# (or write the digest into the ARG below; Renovate/Dependabot can keep it current).
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: turn the repository and every dependency into wheels --------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

WORKDIR /src
# Only what the distribution needs: a change to tests or docs keeps this layer cached.
COPY pyproject.toml README.md ./
COPY operator/ operator/
# Every dependency ships manylinux wheels, so no compiler is needed even here; the
# final stage installs from these wheels with the index switched off. The mcp extra lets
# an AgentRun use spec.mcpServers (and an MCP server of the examples run on this image);
# the ui extra serves the chart's run viewer (viewer.enabled); bedrock and vertex let an
# AgentRun's spec.provider reach Claude on AWS Bedrock and Google Vertex AI.
RUN pip wheel --wheel-dir /wheels ".[operator,mcp,ui,bedrock,vertex]"

# ---- final: the runtime, no build tools, no wheels left behind ---------------------------
FROM ${PYTHON_IMAGE}

# The image's version: the runner reports it in its termination message and the operator
# shows it as an AgentRun's status.runnerVersion (which image ended a run, across upgrades).
ARG VERSION=0.1.0

LABEL org.opencontainers.image.title="alpineagents" \
      org.opencontainers.image.description="Durable LLM agent runs on Kubernetes: operator and runner" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/work \
    ALPINEAGENTS_VERSION=${VERSION}

# The wheels come in through a bind mount, so none of them ends up in a layer.
# pip compiles our packages' .pyc files at install time, and compileall the standard
# library's (the official image ships it without them): with readOnlyRootFilesystem and
# PYTHONDONTWRITEBYTECODE nothing could write them later, so every pod start would
# compile each module it imports again, and a resume waits for that start.
# DL3013 (pin versions): with --no-index the only candidates are the wheels built
# above from this very checkout, so the version is fixed by the source tree.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "alpineagents[operator,mcp,ui,bedrock,vertex]" \
    && python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')" \
    && groupadd --gid 65532 nonroot \
    && useradd --uid 65532 --gid 65532 --home-dir /work --no-create-home \
       --shell /usr/sbin/nologin nonroot \
    && mkdir -p /work \
    && chown 65532:65532 /work

WORKDIR /work
# Numeric, so the kubelet can check runAsNonRoot without a passwd lookup.
USER 65532:65532

CMD ["python", "-m", "alpineagents", "run"]
