"""Bad values fail `helm template` (and so `helm install`) with the schema's message,
naming the field; nothing is rendered."""

from __future__ import annotations

import json

import pytest

from .render import CHART, RELEASE, run_helm

SCHEMA_ERROR = "values don't meet the specifications of the schema"


@pytest.mark.parametrize(
    ("args", "field", "message"),
    [
        (("--set", "controller.replicas=two"), "/controller/replicas", "want integer"),
        (("--set", "controller.replicas=-1"), "/controller/replicas", "minimum"),
        (
            ("--set-string", "controller.leaderElection.leaseDuration=15"),
            "/controller/leaderElection/leaseDuration",
            "pattern",
        ),
        (
            ("--set", "controller.podAntiAffinity=always"),
            "/controller/podAntiAffinity",
            "must be one of",
        ),
        (("--set-string", "policy.dryRun=false"), "/policy/dryRun", "want boolean"),
        (("--set", "controller.replica=1"), "/controller", "additional properties 'replica'"),
        (("--set", "imagee.tag=1"), "at ''", "additional properties 'imagee'"),
        (("--set", "policy.actions={nuke}"), "/policy/actions/0", "must be one of"),
        (("--set", "agent.kubeletRoot=var/lib/kubelet"), "/agent/kubeletRoot", "pattern"),
        (("--set", "agent.metricsPort=70000"), "/agent/metricsPort", "maximum"),
        (("--set", "policy.slackSeconds=-1"), "/policy/slackSeconds", "minimum"),
        (
            ("--set", "policy.finalizerAllowlist={cleanup}"),
            "/policy/finalizerAllowlist/0",
            "pattern",
        ),
        (("--set", "serviceMonitor.interval=soon"), "/serviceMonitor/interval", "pattern"),
        (
            ("--set", "prometheusRule.notRemediableCauses={Stuck}"),
            "/prometheusRule/notRemediableCauses/0",
            "must be one of",
        ),
        (("--set", "image.pullPolicy=Sometimes"), "/image/pullPolicy", "must be one of"),
        (("--set", "agent.logLevel=chatty"), "/agent/logLevel", "must be one of"),
        (("--set", "controller.verbose=yes"), "/controller/verbose", "want boolean"),
        (("--set", "agent.metrics.bindAddress=any"), "/agent/metrics/bindAddress", "pattern"),
        (("--set", "agent.metrics.port=1"), "/agent/metrics", "additional properties 'port'"),
        (("--set-string", "admission.enabled=yes"), "/admission/enabled", "want boolean"),
        # Group names end up in the policy's CEL: no quotes.
        (("--set", "admission.exemptGroups={it's}"), "/admission/exemptGroups/0", "pattern"),
    ],
)
def test_bad_values_fail_with_the_schema_message(
    helm: str, args: tuple[str, ...], field: str, message: str
) -> None:
    proc = run_helm(helm, "template", RELEASE, str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert proc.stdout == ""
    assert SCHEMA_ERROR in proc.stderr
    assert field in proc.stderr and message in proc.stderr, proc.stderr


def test_defaults_satisfy_the_schema(helm: str) -> None:
    assert run_helm(helm, "template", RELEASE, str(CHART)).returncode == 0


def _closed_objects(schema: dict, path: str = "") -> list[str]:
    """Object schemas with fixed properties that do not say additionalProperties: false."""
    found = []
    if schema.get("type") == "object" and "properties" in schema:
        if schema.get("additionalProperties") is not False:
            found.append(path or "/")
        for name, sub in schema["properties"].items():
            found += _closed_objects(sub, f"{path}/{name}")
    return found


def test_schema_is_closed_wherever_it_lists_properties() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _closed_objects(schema) == []
