"""Every path a doc names exists: the README, CONTRIBUTING.md, docs/*.md and the charts'
READMEs name files and folders of this repository (`operator/unstick/...`, `docs/x.md`,
`tests/...`, `hack/...`) and, in backticks, the package's own short forms
(`agent/steps/executor.py` for operator/unstick/agent/steps/executor.py). A move that
leaves one behind fails here with the doc, the line and the path.

Not checked: globs and elided paths (`*`, `{a,b}`, `...`, `<name>`), URLs, and what a
make target writes (MADE)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "operator" / "unstick"

# Folders at the top of the repository: named anywhere in a doc's text.
TOP = ("operator", "docs", "tests", "hack", "charts", "bench", "devcluster", "manifests", "tools")
# The package's rooms: a short form, named in backticks only (in prose "agent/controller"
# is no path).
ROOMS = ("agent", "controller", "core", "kube", "commands", "crds")

_PATH = r"[A-Za-z0-9_.~-]+(?:/[A-Za-z0-9_.~-]+)*/?"
ANYWHERE = re.compile(rf"(?<![\w/.~-])(?:{'|'.join(TOP)})/(?:{_PATH})?")
IN_BACKTICKS = re.compile(r"`([^`\s]+)`")
ELIDED = ("*", "{", "...", "<", "$", "://")
MADE = {"bench/results/quick.json"}  # `make bench-quick`


def docs() -> list[Path]:
    found = [REPO / "README.md", REPO / "CONTRIBUTING.md"]
    found += sorted((REPO / "docs").glob("*.md"))
    found += sorted((REPO / "charts").glob("*/README.md"))
    return [p for p in found if p.exists()]


def _clean(token: str) -> str | None:
    """The path in a token, or None where it is no checkable path."""
    if any(mark in token for mark in ELIDED):
        return None
    token = re.sub(r"(#.*|:\d+(-\d+)?)$", "", token)  # an anchor, a line number
    return token.rstrip(".,;:)")


def _where(path: str) -> Path:
    head = path.split("/", 1)[0]
    if head in TOP:
        return REPO / path
    if head == "unstick":
        return REPO / "operator" / path
    return PACKAGE / path


def _exists(path: str) -> bool:
    """The path exists; `core/rules/x.some_function` names core/rules/x.py, and
    `tests/scenarios/hung-` the files whose names begin so."""
    where = _where(path)
    if where.exists():
        return True
    if path.endswith("-"):
        return any(where.parent.glob(where.name + "*"))
    module, dot, _ = where.name.partition(".")
    return bool(dot) and where.with_name(module + ".py").exists()


def named_paths(text: str) -> Iterator[tuple[int, str]]:
    """(line number, path) for every repository path the text names."""
    for number, line in enumerate(text.splitlines(), start=1):
        seen: set[str] = set()
        tokens = [
            m.group(0)
            for m in ANYWHERE.finditer(line)
            if not line[m.end() :].startswith(ELIDED)  # the head of a glob: not a path
        ]
        for quoted in IN_BACKTICKS.findall(line):
            head = quoted.split("/", 1)[0]
            if "/" in quoted and head in (*ROOMS, "unstick"):
                tokens.append(quoted)
        for token in tokens:
            path = _clean(token)
            if path and "/" in path.rstrip("/") and path not in seen | MADE:
                seen.add(path)
                yield number, path


def missing(doc: Path) -> list[str]:
    rel = doc.relative_to(REPO)
    return [
        f"{rel}:{number}: {path}"
        for number, path in named_paths(doc.read_text(encoding="utf-8"))
        if not _exists(path)
    ]


def test_the_checker_finds_paths_in_prose_and_short_forms_in_backticks() -> None:
    text = (
        "See docs/design.md, `agent/steps/executor.py` and tests/core/.\n"
        "The agent/controller split; `tests/*/conftest.py`; https://x.io/docs/a.md\n"
        "`core/nowhere.py:12`\n"
    )
    assert list(named_paths(text)) == [
        (1, "docs/design.md"),
        (1, "tests/core/"),
        (1, "agent/steps/executor.py"),
        (3, "core/nowhere.py"),
    ]
    assert _exists("docs/design.md") and _exists("agent/steps/executor.py")
    assert not _exists("core/nowhere.py")


def test_every_path_a_doc_names_exists() -> None:
    stale = [line for doc in docs() for line in missing(doc)]
    assert not stale, "paths named in docs that do not exist:\n" + "\n".join(stale)
