"""controller.remediationRetention: the controller's --remediation-retention, passed only
when it is not the default (168h); the controller may delete Remediations (its RBAC);
a value that is not a duration is refused by the values schema."""

from __future__ import annotations

from typing import Any

from .render import CHART, one, run_helm, template


def _args(objects: list[dict[str, Any]]) -> list[str]:
    deployment = one(objects, "Deployment", "unstick-controller")
    args: list[str] = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_the_retention_is_a_value(helm: str) -> None:
    defaults = template(helm)
    assert not [a for a in _args(defaults) if "retention" in a]
    role = one(defaults, "ClusterRole", "unstick-controller")
    (rule,) = [r for r in role["rules"] if r["resources"] == ["remediations"]]
    assert "delete" in rule["verbs"]
    month = template(helm, "--set", "controller.remediationRetention=720h")
    assert "--remediation-retention=720h" in _args(month)
    forever = template(helm, "--set-string", "controller.remediationRetention=0")
    assert "--remediation-retention=0" in _args(forever)
    bad = run_helm(
        helm, "template", "x", str(CHART), "--set", "controller.remediationRetention=7d",
        check=False,
    )  # fmt: skip
    assert bad.returncode != 0 and "remediationRetention" in bad.stderr
