"""core/model/kubelet_pods.py: the kubelet's pod-worker families read out of its /metrics
text — a real kubelet's (v1.36.3, captured on the real node suite's node), an older
kubelet's (none of them), and malformed text, named by its line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from unstick.core.model.kubelet_pods import (
    FAMILIES,
    ByLifecycle,
    KubeletMetricsError,
    KubeletPods,
    parse_kubelet_pods,
)

#: `GET /metrics` of the real node suite's kubelet v1.36.3 (tests/machines/node,
#: test_probe_real_pod.py): a pod deleted with its volumes held busy, a bystander, unstick.
REAL = (Path(__file__).parent / "data" / "kubelet-metrics-v1.36.3.txt").read_text()

WORKING = """\
# HELP kubelet_working_pods [ALPHA] Number of pods the kubelet is actually running.
# TYPE kubelet_working_pods gauge
kubelet_working_pods{config="desired",lifecycle="sync",static=""} 3
kubelet_working_pods{config="desired",lifecycle="sync",static="true"} 1
kubelet_working_pods{config="desired",lifecycle="terminating",static=""} 2
kubelet_working_pods{config="orphan",lifecycle="terminating",static=""} 1
kubelet_working_pods{config="runtime_only",lifecycle="terminated",static="unknown"} 1
kubelet_desired_pods{static=""} 5
kubelet_desired_pods{static="true"} 1
kubelet_active_pods{static=""} 4
kubelet_orphaned_runtime_pods_total 1
kubelet_restarted_pods_total{static="true"} 2
"""


def _without(text: str, *families: str) -> str:
    return "".join(
        line
        for line in text.splitlines(keepends=True)
        if not any(line.startswith(f) or f" {f} " in line for f in families)
    )


def test_a_real_kubelets_metrics() -> None:
    """2434 lines, 231 KB; the held pod's worker is terminated (its containers dead) but
    not finished (its volumes busy); the bystander, the controller and the agent sync."""
    assert parse_kubelet_pods(REAL) == KubeletPods(
        working=ByLifecycle(sync=3, terminating=0, terminated=1),
        orphaned=ByLifecycle(0, 0, 0),
        desired=4,
        active=3,
        orphaned_runtime_total=0,
        restarted_total=0,
    )


def test_the_lifecycles_summed_over_config_and_static() -> None:
    pods = parse_kubelet_pods(WORKING)
    assert pods == KubeletPods(
        working=ByLifecycle(sync=4, terminating=3, terminated=1),
        orphaned=ByLifecycle(sync=0, terminating=1, terminated=1),
        desired=6,
        active=4,
        orphaned_runtime_total=1,
        restarted_total=2,
    )
    words = pods.words()
    assert words.startswith(
        "the kubelet itself reports 4 pod(s) syncing, 3 terminating, 1 terminated (of them "
        "orphaned — force-deleted or gone from its config: 0 syncing, 1 terminating, "
        "1 terminated); 6 desired, 4 active"
    ), words


def test_a_kubelet_before_1_27_publishes_none_of_them() -> None:
    pods = parse_kubelet_pods(_without(REAL, *FAMILIES))
    assert pods.working is None and pods.desired is None and pods.restarted_total is None
    assert "none of its pod-worker metrics (a kubelet before 1.27?)" in pods.unread
    assert pods.words().startswith("the kubelet's own pod-worker counts are unknown: ")


def test_a_family_missing_is_null_and_named() -> None:
    pods = parse_kubelet_pods(_without(WORKING, "kubelet_restarted_pods_total"))
    assert pods.restarted_total is None and pods.desired == 6
    assert pods.unread == "the kubelet's /metrics lacks kubelet_restarted_pods_total"


def test_other_families_and_a_later_lifecycle_are_left_alone() -> None:
    text = (
        'kubelet_working_pods_other{x="1"} nonsense\n'
        "kubelet_running_pods 7\n"
        'kubelet_working_pods{config="desired",lifecycle="hibernating",static=""} 9\n'
        'kubelet_working_pods{ config = "desired" , lifecycle="sync", static="",} 2 1700000000\n'
        'kubelet_desired_pods{static="a \\"quoted\\" \\\\ value\\n"} 2\n'
    )
    pods = parse_kubelet_pods(text)
    assert pods.working == ByLifecycle(sync=2) and pods.desired == 2


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ('kubelet_desired_pods{static=""} x', "line 2 .*value 'x' is not a number"),
        ('kubelet_desired_pods{static=""} -1', "line 2 .*not a count of pods"),
        ('kubelet_desired_pods{static=""} NaN', "line 2 .*not a count of pods"),
        ('kubelet_desired_pods{static=""} 1.5', "line 2 .*not a count of pods"),
        ('kubelet_desired_pods{static=""} 1e12', "line 2 .*not a count of pods"),
        ('kubelet_desired_pods{static="} 1', "line 2 .*label static: unterminated value"),
        ("kubelet_desired_pods{static=1} 1", "line 2 .*label static: value not quoted"),
        ('kubelet_desired_pods{static=""}', "line 2 .*expected a value"),
        ('kubelet_desired_pods{static="",static=""} 1', "line 2 .*label static given twice"),
        ('kubelet_desired_pods{static="true"} 1', "line 2: a second sample"),
        ('kubelet_working_pods{static=""} 1', "line 2: kubelet_working_pods without its"),
    ],
)
def test_a_malformed_sample_is_named_by_its_line(line: str, says: str) -> None:
    with pytest.raises(KubeletMetricsError, match=says):
        parse_kubelet_pods('kubelet_desired_pods{static="true"} 1\n' + line + "\n")


def test_an_unread_reason_is_cut_to_its_bound() -> None:
    assert len(KubeletPods.not_read("x" * 1000).unread) == 300
