#!/usr/bin/env python3
"""`make release-notes VERSION=X.Y.Z`: the section of CHANGELOG.md for one version (a tag's
leading "v" is dropped; no VERSION: pyproject.toml's), without its heading, as the GitHub
release's notes. Exit status 1 when CHANGELOG.md has no such section: a release is not
tagged before its changes are written down."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def section(changelog: str, version: str) -> str | None:
    heading = re.compile(r"^## \[(?P<version>[^\]]+)\]", re.MULTILINE)
    found = [m for m in heading.finditer(changelog)]
    for i, match in enumerate(found):
        if match.group("version") == version:
            start = changelog.index("\n", match.end()) + 1
            end = found[i + 1].start() if i + 1 < len(found) else len(changelog)
            return changelog[start:end].strip() + "\n"
    return None


def main() -> int:
    version = (sys.argv[1] if len(sys.argv) > 1 else "").strip().removeprefix("v")
    if not version:
        pyproject = (ROOT / "pyproject.toml").read_text()
        match = re.search(r'^version = "([^"]+)"$', pyproject, re.MULTILINE)
        version = match.group(1) if match else ""
    notes = section((ROOT / "CHANGELOG.md").read_text(), version)
    if notes is None:
        print(f"release-notes: CHANGELOG.md has no section '## [{version}]'", file=sys.stderr)
        return 1
    sys.stdout.write(notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
