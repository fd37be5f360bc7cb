#!/usr/bin/env python3
"""Writes charts/unstick/README.md from charts/unstick/README.md.tmpl, Chart.yaml and the
comments in values.yaml, as helm-docs does: a key's description is the `# -- ...` comment
block right above it (continued by the `#` lines after it), every leaf value gets a row
(key, type, default, description), and a map with a description of its own is one row
(its default as JSON) whose children appear only where they have their own description.

    hack/chart-readme.py          write charts/unstick/README.md
    hack/chart-readme.py --check  write nothing; exit 1 and show the diff when it is stale
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "charts" / "unstick"
KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?P<rest>.*)$")
COMMENT = re.compile(r"^ *#(?P<text>.*)$")


def descriptions(lines: list[str], values: dict[str, Any]) -> dict[str, str]:
    """Dotted key -> its `# --` description, for the keys of maps (not of list items)."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, key) of the maps we are in
    block: list[str] = []
    for line in lines:
        comment = COMMENT.match(line)
        if comment:
            block.append(comment.group("text"))
            continue
        match = KEY.match(line)
        if not match:
            block = []  # a list item, a blank line: the comment block above was not a key's
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        path = [k for _, k in stack] + [match.group("key")]
        parent = lookup(values, path[:-1])
        if isinstance(parent, dict) and path[-1] in parent:
            text = _description(block)
            if text:
                found[".".join(path)] = text
            stack.append((indent, path[-1]))
        block = []
    return found


def _description(block: list[str]) -> str:
    for i, line in enumerate(block):
        if line.strip().startswith("-- "):
            first = line.strip()[3:]
            return " ".join([first, *(rest.strip() for rest in block[i + 1 :])]).strip()
    return ""


def lookup(values: Any, path: list[str]) -> Any:
    for key in path:
        if not isinstance(values, dict) or key not in values:
            return None
        values = values[key]
    return values


def type_of(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if value is None:
        return "string"
    return "object"


def rows(values: dict[str, Any], described: dict[str, str]) -> list[tuple[str, str, str, str]]:
    out: list[tuple[str, str, str, str]] = []

    def walk(node: dict[str, Any], prefix: str, inside_documented: bool) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            text = described.get(path, "")
            leaf = not isinstance(value, dict) or not value
            if (leaf and (text or not inside_documented)) or (not leaf and text):
                out.append((path, type_of(value), json.dumps(value), text))
            if not leaf:
                walk(value, f"{path}.", inside_documented or bool(text))

    walk(values, "", False)
    return out


def table(values: dict[str, Any], described: dict[str, str]) -> str:
    lines = ["| Key | Type | Default | Description |", "|-----|------|---------|-------------|"]
    for key, kind, default, text in rows(values, described):
        cell, default_cell = text.replace("|", "\\|"), default.replace("|", "\\|")
        lines.append(f"| {key} | {kind} | `{default_cell}` | {cell} |")
    return "\n".join(lines)


def render() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    fields = {
        "name": chart["name"],
        "version": chart["version"],
        "appVersion": chart["appVersion"],
        "kubeVersion": chart.get("kubeVersion", ""),
        "description": " ".join(chart["description"].split()),
        "home": chart.get("home", ""),
        "values": table(values, descriptions(text.splitlines(), values)),
    }
    out = (CHART / "README.md.tmpl").read_text()
    for name, value in fields.items():
        out = out.replace("{{ " + name + " }}", str(value))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only check that it is in sync")
    args = parser.parse_args()
    want, target = render(), CHART / "README.md"
    have = target.read_text() if target.exists() else ""
    if args.check:
        if have == want:
            return 0
        sys.stdout.writelines(
            difflib.unified_diff(
                have.splitlines(True), want.splitlines(True), str(target), "generated"
            )
        )
        print(
            f"{target} is out of date: run hack/chart-readme.py (make chart-readme)",
            file=sys.stderr,
        )
        return 1
    target.write_text(want)
    print(f"wrote {target}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
