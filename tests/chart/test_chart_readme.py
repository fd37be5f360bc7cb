"""charts/unstick/README.md is generated from values.yaml (hack/chart-readme.py, helm-docs
style) and kept in sync: the committed file is what the script writes, every value is in
its table, and a changed comment in values.yaml makes the check fail."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from .render import CHART, REPO

SCRIPT = REPO / "hack" / "chart-readme.py"


def run(script: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          timeout=60)  # fmt: skip


def test_the_readme_is_in_sync() -> None:
    out = run(SCRIPT, "--check")
    assert out.returncode == 0, out.stdout + out.stderr


def leaves(values: Any, prefix: str = "") -> list[str]:
    if isinstance(values, dict) and values:
        return [k for key, v in values.items() for k in leaves(v, f"{prefix}{key}.")]
    return [prefix.rstrip(".")]


def test_every_value_is_in_the_table() -> None:
    readme = (CHART / "README.md").read_text()
    keys = {line.split("|")[1].strip() for line in readme.splitlines() if line.startswith("| ")}
    for leaf in leaves(yaml.safe_load((CHART / "values.yaml").read_text())):
        parts = leaf.split(".")
        documented = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        assert keys & documented, leaf  # the value itself or a documented map holding it
    assert "| policy.dryRun | bool | `true` | Dry-run logs and counts" in readme
    assert '| controller.logFormat | string | `"text"` |' in readme


def test_a_changed_comment_makes_the_check_fail(tmp_path: Path) -> None:
    (tmp_path / "hack").mkdir()
    shutil.copy2(SCRIPT, tmp_path / "hack" / SCRIPT.name)
    shutil.copytree(CHART, tmp_path / "charts" / "unstick")
    copy = tmp_path / "hack" / SCRIPT.name
    assert run(copy, "--check").returncode == 0
    values = tmp_path / "charts" / "unstick" / "values.yaml"
    values.write_text(values.read_text().replace("# -- Dry-run logs", "# -- Dry-run only logs"))
    stale = run(copy, "--check")
    assert stale.returncode == 1
    assert "+| policy.dryRun | bool | `true` | Dry-run only logs" in stale.stdout
    assert "make chart-readme" in stale.stderr
    assert run(copy).returncode == 0 and run(copy, "--check").returncode == 0
