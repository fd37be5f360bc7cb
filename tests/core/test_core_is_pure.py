"""The core has no I/O: no imports of OS, network, process or Kubernetes modules.

(The import-linter contract in pyproject enforces the same in `make lint`; this scan
also catches imports inside functions.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import unstick.core

FORBIDDEN = {
    "os", "pathlib", "shutil", "subprocess", "socket", "io", "tempfile", "glob", "time",
    "urllib", "urllib3", "http", "requests", "aiohttp", "asyncio", "select", "signal",
    "kopf", "kubernetes", "grpc", "yaml", "unstick.kube", "unstick.controller",
    "unstick.agent", "unstick.cli", "devcluster.demo", "unstick.commands",
}  # fmt: skip
CORE = Path(unstick.core.__file__).parent


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_core_modules_import_nothing_forbidden() -> None:
    files = sorted(CORE.glob("*.py"))
    assert len(files) > 5
    for path in files:
        for name in imported_modules(path):
            top = {name, name.split(".")[0], ".".join(name.split(".")[:2])}
            assert not top & FORBIDDEN, f"{path.name} imports {name}"


def test_the_scan_would_notice_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    import os.path\n    from kubernetes import client\n")
    assert imported_modules(bad) == {"os.path", "kubernetes"}


def test_core_reads_no_clock() -> None:
    for path in sorted(CORE.glob("*.py")):
        text = path.read_text()
        for call in ("datetime.now(", "datetime.utcnow(", "time.time(", "date.today("):
            assert call not in text, f"{path.name} reads the clock: {call}"
