"""The conventions of the charts users already run (Artifact Hub, kured, descheduler):
Chart.yaml metadata and annotations that match the chart's real image and CRDs,
`kubeVersion` enforced, `helm lint --strict` with nothing left to recommend, the
securityContexts and log settings as values (today's as defaults), NOTES.txt naming the
image and the dry-run state, and the `helm test` hook."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path
from typing import Any

import yaml

from .render import CHART, REPO, one, run_helm, template, workloads

CHART_YAML = yaml.safe_load((CHART / "Chart.yaml").read_text())
VALUES = yaml.safe_load((CHART / "values.yaml").read_text())


def test_chart_metadata() -> None:
    assert CHART_YAML["kubeVersion"] == ">=1.30.0-0"
    assert CHART_YAML["home"] == "https://github.com/unstick-dev/unstick"
    assert CHART_YAML["sources"] == [CHART_YAML["home"]]
    assert CHART_YAML["icon"].startswith("https://")
    assert CHART_YAML["icon"].endswith("/docs/images/icon.svg")
    assert (REPO / "docs" / "images" / "icon.svg").exists()
    assert all({"name", "email"} <= set(m) for m in CHART_YAML["maintainers"])


def test_artifacthub_annotations_match_the_chart() -> None:
    notes = CHART_YAML["annotations"]
    assert notes["artifacthub.io/license"] == "Apache-2.0"
    assert (REPO / "LICENSE").read_text().lstrip().startswith("Apache License")
    (image,) = yaml.safe_load(notes["artifacthub.io/images"])
    assert image["image"] == f"{VALUES['image']['repository']}:{CHART_YAML['appVersion']}"
    assert image["platforms"] == ["linux/amd64", "linux/arm64"]
    crds = {
        (doc["spec"]["names"]["kind"], doc["metadata"]["name"])
        for path in (CHART / "crds").glob("*.yaml")
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    }
    listed = {(c["kind"], c["name"]) for c in yaml.safe_load(notes["artifacthub.io/crds"])}
    assert listed == crds
    for example in yaml.safe_load(notes["artifacthub.io/crdsExamples"]):
        assert example["kind"] in {kind for kind, _ in crds}
    links = yaml.safe_load(notes["artifacthub.io/links"])
    for link in links:
        local = link["url"].split("/blob/main/", 1)[1]
        assert (REPO / local).exists(), link


def test_lint_strict_recommends_nothing(helm: str) -> None:
    out = run_helm(helm, "lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in out.stdout
    flagged = [line for line in out.stdout.splitlines() if line.lstrip().startswith("[")]
    assert flagged == []  # no [INFO] (e.g. "icon is recommended"), [WARNING] or [ERROR]


def test_kube_version_is_enforced(helm: str) -> None:
    old = run_helm(helm, "template", "x", str(CHART), "--kube-version", "1.29.9", check=False)
    assert old.returncode != 0
    assert "requires kubeVersion: >=1.30.0-0" in old.stderr
    for ok in ("1.30.0", "v1.31.2-eks-7f9249a"):
        run_helm(helm, "template", "x", str(CHART), "--kube-version", ok)


def test_security_contexts_default_to_todays_and_are_values(helm: str) -> None:
    objects = template(helm)
    ctl = one(objects, "Deployment", "unstick-controller")["spec"]["template"]["spec"]
    assert ctl["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    assert ctl["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }  # fmt: skip
    agent = one(objects, "DaemonSet", "unstick-agent")["spec"]["template"]["spec"]
    assert "securityContext" not in agent
    assert agent["containers"][0]["securityContext"] == {
        "privileged": True, "runAsUser": 0, "runAsNonRoot": False, "readOnlyRootFilesystem": True,
    }  # fmt: skip
    # OpenShift's restricted SCC assigns the uid: the fixed ids can be removed
    openshift = template(
        helm, "--set", "controller.podSecurityContext.runAsUser=null",
        "--set", "controller.podSecurityContext.runAsGroup=null",
        "--set", "controller.podSecurityContext.fsGroup=null",
        "--set", "agent.podSecurityContext.seLinuxOptions.type=spc_t",
    )  # fmt: skip
    ctl = one(openshift, "Deployment", "unstick-controller")["spec"]["template"]["spec"]
    assert ctl["securityContext"] == {
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    agent = one(openshift, "DaemonSet", "unstick-agent")["spec"]["template"]["spec"]
    assert agent["securityContext"] == {"seLinuxOptions": {"type": "spc_t"}}


def _args(objects: list[dict[str, Any]], kind: str, name: str) -> list[str]:
    args: list[str] = one(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_log_format_and_level_are_values(helm: str) -> None:
    defaults = template(helm)
    assert not [a for a in _args(defaults, "Deployment", "unstick-controller") if "--log" in a]
    assert [a for a in _args(defaults, "DaemonSet", "unstick-agent") if "--log" in a] == [
        "--log-level=INFO"
    ]
    json_logs = template(
        helm, "--set", "controller.logFormat=json,controller.logLevel=WARNING",
        "--set", "agent.logFormat=json,agent.logLevel=DEBUG",
    )  # fmt: skip
    assert {"--log-format=json", "--log-level=WARNING"} <= set(
        _args(json_logs, "Deployment", "unstick-controller")
    )
    assert {"--log-format=json", "--log-level=DEBUG"} <= set(
        _args(json_logs, "DaemonSet", "unstick-agent")
    )
    bad = run_helm(helm, "template", "x", str(CHART), "--set", "agent.logFormat=xml", check=False)
    assert bad.returncode != 0 and "logFormat" in bad.stderr


def _with_tests(helm: str, *args: str) -> list[dict[str, Any]]:
    out = run_helm(helm, "template", "unstick", str(CHART), "-n", "unstick", *args)
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def test_the_helm_test_hook(helm: str) -> None:
    hooks = [
        d for d in _with_tests(helm)
        if (d["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test"
    ]  # fmt: skip
    assert {(d["kind"], d["metadata"]["name"]) for d in hooks} == {
        (kind, "unstick-test") for kind in ("ServiceAccount", "Role", "RoleBinding", "Pod")
    }
    role = next(d for d in hooks if d["kind"] == "Role")
    assert role["rules"] == [
        {"apiGroups": ["apps"], "resources": ["deployments"],
         "resourceNames": ["unstick-controller"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"],
         "resourceNames": ["unstick-agent"], "verbs": ["get"]},
    ]  # fmt: skip
    pod = next(d for d in hooks if d["kind"] == "Pod")["spec"]
    (c,) = pod["containers"]
    assert c["image"] == f"ghcr.io/unstick-dev/unstick:{CHART_YAML['appVersion']}"
    assert c["command"] == ["python3", "-c"]
    assert c["args"][0] == (CHART / "files" / "helm-test.py").read_text()
    assert c["args"][1:] == [
        "unstick", "unstick-controller", "unstick-agent",
        "http://unstick-controller-metrics.unstick.svc:9100/metrics",
    ]  # fmt: skip
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert pod["restartPolicy"] == "Never"
    assert not [d for d in _with_tests(helm, "--set", "helmTest.enabled=false")
                if d["kind"] == "Pod"]  # fmt: skip
    # not in what workloads() sees (template() skips tests): the two components only
    assert len(workloads(template(helm))) == 2


def test_the_helm_test_script_compiles() -> None:
    source = (CHART / "files" / "helm-test.py").read_text()
    compile(source, "helm-test.py", "exec")
    out = subprocess.run(["python3", "-c", "import ast,sys; ast.parse(sys.stdin.read())"],
                         input=source, text=True, capture_output=True)  # fmt: skip
    assert out.returncode == 0, out.stderr


def test_packaged_chart_leaves_out_the_readme_template(helm: str, tmp_path: Path) -> None:
    run_helm(helm, "package", str(CHART), "-d", str(tmp_path))
    (tgz,) = tmp_path.glob("unstick-*.tgz")
    with tarfile.open(tgz) as tar:
        names = tar.getnames()
    assert "unstick/README.md" in names and "unstick/files/helm-test.py" in names
    assert "unstick/README.md.tmpl" not in names
