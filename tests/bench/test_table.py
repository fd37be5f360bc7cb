"""`python -m bench.table`: the README's results table from one result file (a small
hand-made fixture, tests/bench/data/full_small.json; no cluster needed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bench import table

FIXTURE = Path(__file__).with_name("data") / "full_small.json"
README = """# project

intro

<!-- bench:full -->
an old table from another run
<!-- /bench:full -->

## Development
"""


def _verdicts(result: dict[str, Any]) -> dict[str, str]:
    return {t.what: t.verdict for t in table.targets(result)}


def test_table_shows_the_one_run_its_contenders_and_each_target() -> None:
    result = json.loads(FIXTURE.read_text())
    block = table.render(result, "bench/results/full.json")
    assert "commit `abc1234-dirty`" in block
    assert "2026-11-23 08:15 UTC" in block
    assert "0.42 at the start, mean 1.75 / max 3.2 during the run" in block
    rows = [line for line in block.splitlines() if line.startswith("| ")]
    assert any(
        r.startswith("| **unstick** | 0.310 s | 5.1 s / 11.2 s | 12.4 s | 1.4 |") for r in rows
    )
    assert any(r.startswith("| PodGC") and "| 400 left |" in r for r in rows)
    verdicts = list(_verdicts(result).values())
    # gone ≤ 15 s, ≤ naive, ≤ 1.5 req/pod, 0 healthy, detection 0.31 s > 0.2 s, RSS 101,
    # flat 84 → 95 MiB (> 10 %), 0 LIST; node side: 6.5 s > 5 s, 7.9 s ≤ 8 s with the
    # mounts, 6.5 s > 1.5 x naive's 4.0 s, 7.9 s ≤ 1.5 x 6.0 s, RSS 61, every act after
    # its checks, CPU per pod reported
    assert verdicts == [
        "met", "met", "met", "met", "**missed**", "met", "**missed**", "met",
        "**missed**", "met", "**missed**", "met", "met", "met", "reported",
    ]  # fmt: skip
    # the node side's rows: unstick and its peers per point, the floor before eligibility
    assert any(
        r.startswith("| 100 pods, 221 host mounts (stuck pods only) | **unstick**")
        and "| 6.5 s | 11.5 s | 3.2 s / 6.4 s |" in r
        and "| 700 of 700 |" in r
        for r in rows
    )
    assert any(r.startswith("| 100 pods, 5,123 host mounts (+ host mounts) | naive") for r in rows)
    assert any("kubelet's own teardown" in r and "| -2.5 s | 2.5 s |" in r for r in rows)


def test_targets_without_their_figures_are_not_measured() -> None:
    result = json.loads(FIXTURE.read_text())
    del result["node_side"]
    del result["unstick_rss_by_pods"]["50000"]
    result["contenders"]["unstick"]["all_gone_s"] = 14.0
    result["contenders"]["naive"]["all_gone_s"] = 13.3
    verdicts = _verdicts(result)
    flat = next(v for k, v in verdicts.items() if k.startswith("unstick's RSS flat"))
    assert flat == "not measured"  # 5k-20k only: the 50,000 point is missing
    assert {v for k, v in verdicts.items() if k.startswith("node side")} == {"not measured"}
    assert "| node side: 1 node" not in table.render(result, "x.json")
    assert verdicts["… and no later than the naive reaper in the same run"] == "**missed**"
    assert "no 50,000 point" in table.targets_table(result)


def test_pods_left_at_the_timeout_are_a_miss_not_a_gap() -> None:
    result = json.loads(FIXTURE.read_text())
    result["contenders"]["unstick"].update(all_gone_s=None, nodegone_left=12)
    result["node_side"]["stuck_pods"].update(all_resolved_s=None, pods_left=3)
    targets = table.targets(result)
    gone, vs_naive = targets[0], targets[1]
    assert (gone.measured, gone.verdict) == ("12 left at the timeout", "**missed**")
    assert vs_naive.verdict == "**missed**"
    node = next(t for t in targets if t.what.startswith("node side: 100 stuck pods"))
    assert (node.measured, node.verdict) == ("3 left at the timeout", "**missed**")
    vs = next(t for t in targets if t.what.startswith("node side (stuck pods only): within"))
    assert (vs.measured, vs.verdict) == ("3 left at the timeout", "**missed**")


def test_main_writes_between_the_markers_only(tmp_path: Path, capsys: Any) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README)
    result = tmp_path / "full.json"
    shutil.copy(FIXTURE, result)
    assert table.main([str(result), "--readme", str(readme)]) == 0
    once = readme.read_text()
    assert "an old table" not in once
    assert once.startswith("# project\n\nintro\n\n<!-- bench:full -->\nOne run: commit")
    assert once.endswith("| reported |\n<!-- /bench:full -->\n\n## Development\n")
    assert table.main([str(result), "--readme", str(readme)]) == 0
    assert readme.read_text() == once  # idempotent: still exactly one table
    assert "One run: commit `abc1234-dirty`" in capsys.readouterr().out


def test_check_prints_and_writes_nothing(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(README)
    assert table.main([str(FIXTURE), "--readme", str(readme), "--check"]) == 0
    assert readme.read_text() == README


@pytest.mark.parametrize(
    ("readme_text", "result_text", "message"),
    [
        ("# no markers\n", None, "README.md: expected one `<!-- bench:full -->`"),
        (README, "{not json", "is not JSON"),
        (README, '{"workload": {}}', "no `contenders` in the result"),
        (README, "[1, 2]", "expected a JSON object"),
    ],
)
def test_bad_input_gets_a_clear_message_and_changes_nothing(
    tmp_path: Path, capsys: Any, readme_text: str, result_text: str | None, message: str
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(readme_text)
    result = tmp_path / "full.json"
    if result_text is None:
        shutil.copy(FIXTURE, result)
    else:
        result.write_text(result_text)
    assert table.main([str(result), "--readme", str(readme)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench.table: ") and message in err, err
    assert "Traceback" not in err
    assert readme.read_text() == readme_text


def test_a_missing_result_file_is_named(tmp_path: Path, capsys: Any) -> None:
    missing = tmp_path / "nope.json"
    assert table.main([str(missing), "--readme", str(tmp_path / "README.md")]) == 2
    assert f"cannot read {missing}" in capsys.readouterr().err
