"""What a benchmark result records about its run and where earlier results go: the commit
(with `-dirty`), an earlier `<name>.json` kept under a dated name, the node-side hook.
Real git, real files; no cluster needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench
from bench import run


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_commit_is_head_and_dirty_when_the_tree_has_changes(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "code.py")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = _git(tmp_path, "rev-parse", "--short", "HEAD")
    assert run.git_commit(tmp_path) == head
    (tmp_path / "bench" / "results").mkdir(parents=True)
    (tmp_path / "bench" / "results" / "full.json").write_text("{}")
    assert run.git_commit(tmp_path) == head  # results being written are no code change
    (tmp_path / "new.py").write_text("y = 2\n")
    assert run.git_commit(tmp_path) == f"{head}-dirty"  # an untracked file
    (tmp_path / "new.py").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert run.git_commit(tmp_path) == f"{head}-dirty"  # a tracked file changed
    assert run.git_commit(tmp_path / "not-a-repo") == "unknown"


def test_an_earlier_result_is_kept_under_its_date_and_commit(tmp_path: Path) -> None:
    assert run.archive_previous(tmp_path, "full") == []
    (tmp_path / "full.json").write_text(json.dumps({"started": "2026-11-22T01:34:36+00:00"}))
    (tmp_path / "full.png").write_bytes(b"png")
    moved = run.archive_previous(tmp_path, "full")
    assert [p.name for p in moved] == ["2026-11-22-full.json", "2026-11-22-full.png"]
    assert not (tmp_path / "full.json").exists() and not (tmp_path / "full.png").exists()
    earlier = {"started": "2026-11-23T08:00:00+00:00", "commit": "abc1234"}
    for _ in range(2):  # the same date and commit twice: nothing is overwritten
        (tmp_path / "full.json").write_text(json.dumps(earlier))
        run.archive_previous(tmp_path, "full")
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "2026-11-22-full.json",
        "2026-11-22-full.png",
        "2026-11-23-full-abc1234-2.json",
        "2026-11-23-full-abc1234.json",
    ]


def test_the_node_side_hook_reports_a_missing_module_instead_of_failing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    said: list[str] = []
    monkeypatch.setitem(sys.modules, "bench.nodeside", None)  # `import` raises ImportError
    # ... also when an earlier test imported it: `from bench import nodeside` takes the
    # package's attribute first
    monkeypatch.delattr(bench, "nodeside", raising=False)
    result = run._node_side("quick", said.append)  # type: ignore[arg-type]
    assert result["skipped"].startswith("bench.nodeside cannot be imported")
    assert said and said[0].startswith("node side skipped")


def test_quick_and_full_run_the_node_side_and_full_measures_50000_pods() -> None:
    assert run.NODE_SIDE_PRESET == {"full": "full", "quick": "quick"}
    full = run.PRESETS["full"]
    assert full.size.pods == 20_000 and full.rss_stages == (5_000, 10_000, 20_000)
    assert full.rss_stages_after_burst == (50_000,)
    assert run.PRESETS["quick"].rss_stages_after_burst == ()
