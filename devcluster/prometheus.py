"""A real Prometheus server on loopback for tests: it scrapes the controller and the agent
(static targets) and evaluates the chart's own alerting rules, taken from the rendered
PrometheusRule (`helm template`), not copied.

Development only: needs `prometheus` and `helm` from `make tools` (bin/)."""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devcluster.process import Process, free_port, wait_until

CHART = Path(__file__).resolve().parents[1] / "charts" / "unstick"
RELEASE = "unstick"


@dataclass(frozen=True)
class ScrapeTarget:
    """One static target: `job` as the chart's ServiceMonitor would name it (the metrics
    Service's name), the loopback address the process listens on, extra target labels."""

    job: str
    address: str
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedChart:
    """What the tests take from `helm template`: the PrometheusRule's groups, and the
    metrics Services (name → port) by component (controller, agent)."""

    rule_groups: list[dict[str, Any]]
    metrics_services: dict[str, tuple[str, int]]
    dashboard: dict[str, Any] | None


def render_chart(helm: Path, values: dict[str, Any], namespace: str = "unstick") -> RenderedChart:
    """`helm template` the chart with `values` (plus prometheusRule.enabled)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as fh:
        yaml.safe_dump(values, fh)
        fh.flush()
        argv = [str(helm), "template", RELEASE, str(CHART), "--namespace", namespace]
        argv += ["--values", fh.name, "--set", "prometheusRule.enabled=true"]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed: {out.stderr.strip()}")
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    rules = [d for d in docs if d.get("kind") == "PrometheusRule"]
    if len(rules) != 1:
        raise RuntimeError(f"expected one PrometheusRule in the chart, found {len(rules)}")
    return RenderedChart(
        rule_groups=list(rules[0]["spec"]["groups"]),
        metrics_services=_metrics_services(docs),
        dashboard=_dashboard(docs),
    )


def _metrics_services(docs: list[dict[str, Any]]) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for doc in docs:
        if doc.get("kind") != "Service":
            continue
        component = doc["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        for port in doc["spec"].get("ports") or []:
            if port.get("name") == "metrics":
                out[component] = (doc["metadata"]["name"], int(port["port"]))
    return out


def _dashboard(docs: list[dict[str, Any]]) -> dict[str, Any] | None:
    for doc in docs:
        if doc.get("kind") == "ConfigMap" and "unstick.json" in (doc.get("data") or {}):
            return dict(json.loads(doc["data"]["unstick.json"]))
    return None


def find_prometheus(bin_dir: Path) -> Path:
    for candidate in (bin_dir / "prometheus", Path(shutil.which("prometheus") or "")):
        if candidate.name == "prometheus" and candidate.exists():
            return candidate
    raise FileNotFoundError(f"prometheus not found in {bin_dir} or $PATH: run `make tools`")


class Prometheus:
    """`prometheus` on 127.0.0.1:<free port>, scraping and evaluating every `interval_s`;
    its TSDB in a temporary directory, removed on stop."""

    def __init__(
        self,
        bin_dir: Path,
        targets: list[ScrapeTarget],
        rule_groups: list[dict[str, Any]],
        interval_s: float = 1.0,
    ) -> None:
        self.binary = find_prometheus(bin_dir)
        self.targets = targets
        self.rule_groups = rule_groups
        self.interval = f"{int(interval_s * 1000)}ms"
        self.workdir = Path(tempfile.mkdtemp(prefix="unstick-prometheus-"))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: Process | None = None

    def _config(self) -> dict[str, Any]:
        jobs: dict[str, list[dict[str, Any]]] = {}
        for t in self.targets:
            jobs.setdefault(t.job, []).append({"targets": [t.address], "labels": t.labels})
        return {
            "global": {
                "scrape_interval": self.interval,
                "scrape_timeout": self.interval,
                "evaluation_interval": self.interval,
            },
            "rule_files": [str(self.workdir / "rules.yaml")],
            "scrape_configs": [
                # honor_labels as the chart's agent ServiceMonitor (node from the agent)
                {"job_name": job, "honor_labels": True, "static_configs": static}
                for job, static in jobs.items()
            ],
        }

    def start(self) -> Prometheus:
        (self.workdir / "rules.yaml").write_text(yaml.safe_dump({"groups": self.rule_groups}))
        (self.workdir / "prometheus.yml").write_text(yaml.safe_dump(self._config()))
        argv = [
            str(self.binary),
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        self.process = Process("prometheus", argv, self.workdir / "prometheus.log").start()
        try:
            wait_until(self._ready, timeout=60, what="prometheus /-/ready", process=self.process)
        except BaseException:
            self.stop()
            raise
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    def log_tail(self) -> str:
        return self.process.log_tail() if self.process else ""

    # --- the HTTP API ---------------------------------------------------------------------

    def api(self, path: str, **params: str) -> Any:
        """GET /api/v1/<path>; returns `data`; raises PrometheusError on an error answer."""
        query = urllib.parse.urlencode(params)
        url = f"{self.url}/api/v1/{path}" + (f"?{query}" if query else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise PrometheusError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """Instant query; the result's series (vector) or [] (scalar/empty)."""
        data = self.api("query", query=expr)
        result = data.get("result")
        return list(result) if data.get("resultType") == "vector" else []

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (state pending or firing) with their labels."""
        return list(self.api("alerts")["alerts"])

    def rules(self) -> list[dict[str, Any]]:
        return [r for g in self.api("rules")["groups"] for r in g["rules"]]

    def targets_up(self) -> dict[str, str]:
        """job → health of its targets ('up' only when every target of the job is up)."""
        health: dict[str, str] = {}
        for t in self.api("targets")["activeTargets"]:
            job = t["labels"]["job"]
            health[job] = t["health"] if health.get(job, "up") == "up" else health[job]
        return health


class PrometheusError(Exception):
    """Prometheus answered a query with an error (bad PromQL, unknown function...)."""
