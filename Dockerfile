# syntax=docker/dockerfile:1
# unstick: one image for `unstick controller` and `unstick agent`.
# Built and pushed by the release pipeline; `docker build -t unstick:dev .` works
# locally. The real-node tests build it with buildah on a Python base made from Debian's
# packages (hack/build-images.sh: --build-arg BASE=...), with no public registry.

# The Python 3.11 image both stages start from (python, pip on PATH).
ARG BASE=python:3.11-slim

# --- build: wheels for unstick and every dependency -------------------------------
FROM ${BASE} AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY operator ./operator
# A build that must trust another CA for the package index (a proxy) passes its bundle
# as the optional secret `pip-ca`; without it pip uses its own.
RUN --mount=type=secret,id=pip-ca,required=false \
    if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi; \
    pip wheel --wheel-dir /wheels ".[server]"

# --- runtime: wheels only, no compilers, no pip cache -----------------------------
FROM ${BASE}
# nsenter (restart-kubelet enters PID 1's namespaces) comes with util-linux, which
# Debian images always include.
# The wheels are bind-mounted from the build stage, so they are in no layer.
# The `server` extra: Kopf, gRPC, the metrics and JSON-log libraries the controller and the
# agent need (`pip install unstick` alone is the CLI). Unpinned on purpose (DL3013): with
# --no-index the only candidates are the wheels the build stage made from this source.
# hadolint ignore=DL3013
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels "unstick[server]"
# Non-root by default (the controller); the agent's DaemonSet runs it as root,
# privileged, explicitly.
USER 65532:65532
EXPOSE 9100 9101 8080
ENTRYPOINT ["unstick"]
CMD ["--help"]
