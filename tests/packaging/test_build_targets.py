"""What a release publishes, built here by the make targets the release workflow runs:
`make chart` (the chart linted and packaged), `make dist` (sdist and wheel, the wheel
rebuilt from the sdist), `make release-notes` (the CHANGELOG.md section). Each into a
temporary DIST: nothing is left in the work tree."""

from __future__ import annotations

import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml

from unstick import __version__

ROOT = Path(__file__).parents[2]


def make(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                         capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert out.returncode == 0, f"make {args}: {out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def test_make_chart_packages_the_linted_chart(tmp_path: Path) -> None:
    if not (ROOT / "bin" / "helm").exists():
        pytest.skip("bin/helm missing: run `make tools`")
    make("chart", f"DIST={tmp_path}")
    (tgz,) = tmp_path.glob("unstick-*.tgz")
    assert tgz.name == f"unstick-{__version__}.tgz"
    with tarfile.open(tgz) as tar:
        chart = yaml.safe_load(tar.extractfile("unstick/Chart.yaml").read())  # type: ignore[union-attr]
        names = set(tar.getnames())
    assert chart == yaml.safe_load((ROOT / "charts/unstick/Chart.yaml").read_text())
    assert {"unstick/README.md", "unstick/values.schema.json", "unstick/crds/remediations.yaml",
            "unstick/templates/tests/check.yaml"} <= names  # fmt: skip
    lint = subprocess.run([str(ROOT / "bin" / "helm"), "lint", "--strict", str(tgz)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert lint.returncode == 0, lint.stdout


def test_make_dist_builds_the_sdist_and_the_wheel(tmp_path: Path) -> None:
    make("dist", f"DIST={tmp_path}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"unstick-{__version__}-py3-none-any.whl",
        f"unstick-{__version__}.tar.gz",
    ]
    with tarfile.open(tmp_path / f"unstick-{__version__}.tar.gz") as tar:
        names = set(tar.getnames())
    top = f"unstick-{__version__}"
    assert {f"{top}/LICENSE", f"{top}/README.md", f"{top}/pyproject.toml", f"{top}/PKG-INFO",
            f"{top}/operator/unstick/crds/remediations.yaml"} <= names  # fmt: skip
    assert not [n for n in names if "/devcluster/" in n or "/tests/" in n]
    with zipfile.ZipFile(tmp_path / f"unstick-{__version__}-py3-none-any.whl") as whl:
        meta = whl.read(f"unstick-{__version__}.dist-info/METADATA").decode()
        assert f"unstick-{__version__}.dist-info/licenses/LICENSE" in whl.namelist()
    assert "License-Expression: Apache-2.0" in meta
    assert "Requires-Dist: python-json-logger" in meta


def test_make_release_notes_is_the_changelog_section() -> None:
    notes = make("-s", "release-notes", f"VERSION=v{__version__}").stdout
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert notes.strip() and notes.strip() in changelog
    assert not notes.startswith("## ")
    missing = subprocess.run(["make", "-s", "-C", str(ROOT), "release-notes", "VERSION=99.0.0"],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode != 0
    assert "CHANGELOG.md has no section '## [99.0.0]'" in missing.stderr
