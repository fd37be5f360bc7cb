"""Helpers for the chart tests: find the tools, render the chart, walk the objects."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "unstick"
ALL_ON = Path(__file__).resolve().parent / "values-all-on.yaml"
RELEASE = "unstick"
NAMESPACE = "unstick"


def find_tool(name: str) -> str | None:
    """bin/NAME (built by `make tools`), else NAME on $PATH."""
    local = REPO / "bin" / name
    if local.exists() and os.access(local, os.X_OK):
        return str(local)
    return shutil.which(name)


def helm_env(home: Path) -> dict[str, str]:
    """Helm with its cache/config/data under `home`, so tests leave nothing behind."""
    env = dict(os.environ)
    for var, sub in (
        ("HELM_CACHE_HOME", "cache"),
        ("HELM_CONFIG_HOME", "config"),
        ("HELM_DATA_HOME", "data"),
    ):
        env[var] = str(home / sub)
    return env


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def refused(helm: str, *args: str) -> str:
    """`helm template` the chart (release unstick) with these values, refused by the values
    schema or a template's check; helm's message."""
    proc = run_helm(helm, "template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stderr


def template(helm: str, *args: str) -> list[dict[str, Any]]:
    """`helm template` the chart (release unstick, namespace unstick) into objects; without
    the `helm test` hook (tests/chart/test_helm_test.py renders that)."""
    proc = run_helm(
        helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--skip-tests", *args
    )
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def release_objects(
    release: str, namespace: str, kinds: Collection[str], *sets: str
) -> list[dict[str, Any]]:
    """The chart's objects of these kinds, rendered as `release` in `namespace` with these
    `--set`s, to apply to a test API server (skipped where helm is missing)."""
    helm = find_tool("helm")
    if helm is None:
        pytest.skip("helm not found in bin/ or on $PATH: run `make tools`")
    args = [arg for value in sets for arg in ("--set", value)]
    proc = run_helm(helm, "template", release, str(CHART), "--namespace", namespace, *args)
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc and doc["kind"] in kinds]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind}/{name}, found {len(found)}"
    return found[0]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job")]


def containers(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    spec = workload["spec"]["template"]["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]


def rule_allows(rules: list[dict[str, Any]], group: str, resource: str, verb: str) -> bool:
    """Whether a ClusterRole's rules grant `verb` on `group`/`resource` (RBAC semantics,
    wildcards included, so a `*` could not slip past the checks that use this)."""
    for rule in rules:
        groups = rule.get("apiGroups", [])
        resources = rule.get("resources", [])
        verbs = rule.get("verbs", [])
        if (
            (group in groups or "*" in groups)
            and (resource in resources or "*" in resources)
            and (verb in verbs or "*" in verbs)
        ):
            return True
    return False
