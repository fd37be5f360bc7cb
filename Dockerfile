# syntax=docker/dockerfile:1
# unstick: one image for `unstick controller` and `unstick agent`.
# Built and pushed by the release pipeline (not in this repo's tests: there is no
# container engine there); `docker build -t unstick:dev .` works locally.

# --- build: wheels for unstick and every dependency -------------------------------
FROM python:3.11-slim AS build
WORKDIR /src
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml README.md ./
COPY operator ./operator
RUN pip wheel --wheel-dir /wheels .

# --- runtime: wheels only, no compilers, no pip cache -----------------------------
FROM python:3.11-slim
# nsenter (restart-kubelet enters PID 1's namespaces) comes with util-linux, which
# Debian images always include.
# The wheels are bind-mounted from the build stage, so they are in no layer.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links=/wheels /wheels/unstick-*.whl
# Non-root by default (the controller); the agent's DaemonSet runs it as root,
# privileged, explicitly.
USER 65532:65532
EXPOSE 9100 9101 8080
ENTRYPOINT ["unstick"]
CMD ["--help"]
