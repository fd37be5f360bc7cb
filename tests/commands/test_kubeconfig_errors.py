"""Every kind of broken kubeconfig, through the real installed entry points (`unstick`,
`kubectl-unstick`) as a user runs them: one line on stderr naming the file and what to do,
exit status 2, nothing on stdout, never a traceback. No cluster is needed: nothing is asked
of one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

VENV_BIN = Path(sys.executable).parent
READ_COMMANDS = (("status",), ("why", "shop/web-0"), ("snapshot", "shop/web-0"))


def _config(exec_command: str = "") -> dict[str, object]:
    user: dict[str, object] = {"token": "t"}
    if exec_command:
        user = {
            "exec": {
                "apiVersion": "client.authentication.k8s.io/v1beta1",
                "command": exec_command,
                "installHint": "see https://example.com/install-the-plugin",
            }
        }
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }


def run(
    tmp_path: Path, *args: str, kubeconfig_env: str | None = None, program: str = "unstick"
) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBE", "KUBERNETES_"))}
    env["HOME"] = str(tmp_path / "home")  # no ~/.kube/config unless a test writes one
    env["PATH"] = f"{VENV_BIN}{os.pathsep}/usr/bin:/bin"
    if kubeconfig_env is not None:
        env["KUBECONFIG"] = kubeconfig_env
    return subprocess.run(
        [str(VENV_BIN / program), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )


def assert_one_line(out: subprocess.CompletedProcess[str], *words: str) -> str:
    assert out.returncode == 2, (out.returncode, out.stderr)
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1, out.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    made = {
        "malformed": "apiVersion: v1\nclusters: [\n  - name: : c\n",
        "not-a-mapping": "- just\n- a list\n",
        "empty": "",
        "unknown-current": yaml.safe_dump({**_config(), "current-context": "gone"}),
        "no-current": yaml.safe_dump({**_config(), "current-context": ""}),
        "exec-missing": yaml.safe_dump(_config("unstick-test-no-such-auth-plugin")),
        "good": yaml.safe_dump(_config()),
    }
    out = {}
    for name, text in made.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        out[name] = path
    (tmp_path / "home").mkdir()
    return out


@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_missing_kubeconfig_file(tmp_path: Path, command: tuple[str, ...]) -> None:
    missing = tmp_path / "nope.yaml"
    line = assert_one_line(run(tmp_path, *command, "--kubeconfig", str(missing)), str(missing))
    assert "no such file" in line and "--kubeconfig" in line


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("malformed", "not valid YAML at line 3"),
        ("not-a-mapping", "not a kubeconfig"),
        ("empty", "empty"),
        ("unknown-current", "no context 'gone'"),
        ("no-current", "no current context"),
        ("exec-missing", "unstick-test-no-such-auth-plugin"),
    ],
)
@pytest.mark.parametrize("command", READ_COMMANDS, ids=lambda c: c[0])
def test_a_broken_kubeconfig(
    tmp_path: Path, files: dict[str, Path], command: tuple[str, ...], case: str, says: str
) -> None:
    out = run(tmp_path, *command, "--kubeconfig", str(files[case]))
    line = assert_one_line(out, str(files[case]), says)
    assert line.startswith(f"unstick {command[0]}: kubeconfig ")


def test_an_exec_plugin_that_is_missing_says_how_to_install_it(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    out = run(tmp_path, "status", "--kubeconfig", str(files["exec-missing"]))
    line = assert_one_line(out, "not found on PATH", "https://example.com/install-the-plugin")
    assert "--context" in line


def test_a_context_that_does_not_exist(tmp_path: Path, files: dict[str, Path]) -> None:
    out = run(tmp_path, "why", "-n", "shop", "web-0", "--kubeconfig", str(files["good"]),
              "--context", "other")  # fmt: skip
    assert_one_line(out, str(files["good"]), "no context 'other'", "the file has: ctx")


def test_kubeconfig_from_the_environment_and_the_default(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    listed = f"{tmp_path / 'a.yaml'}{os.pathsep}{tmp_path / 'b.yaml'}"
    assert_one_line(run(tmp_path, "status", kubeconfig_env=listed), "$KUBECONFIG", "a.yaml")
    # a list is merged as kubectl merges it: a missing entry is skipped, the broken one named
    listed = f"{tmp_path / 'a.yaml'}{os.pathsep}{files['malformed']}"
    assert_one_line(run(tmp_path, "status", kubeconfig_env=listed), str(files["malformed"]))
    # neither --kubeconfig nor $KUBECONFIG, not in a pod: ~/.kube/config is the one named
    default = tmp_path / "home" / ".kube" / "config"
    line = assert_one_line(run(tmp_path, "status"), str(default))
    assert "not running in a pod" in line
    default.parent.mkdir()
    default.write_text("clusters: {\n")
    assert_one_line(run(tmp_path, "status"), str(default), "not valid YAML")


def test_a_bare_pod_name_takes_the_namespace_from_a_working_kubeconfig_only(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    """`why POD` without -n needs the context's namespace: a broken kubeconfig is named then
    too (before any request)."""
    out = run(tmp_path, "why", "web-0", "--kubeconfig", str(files["unknown-current"]))
    assert_one_line(out, "no context 'gone'")


def test_the_kubectl_plugin_says_the_same(tmp_path: Path, files: dict[str, Path]) -> None:
    out = run(
        tmp_path, "status", "--kubeconfig", str(files["malformed"]), program="kubectl-unstick"
    )
    assert_one_line(out, str(files["malformed"]), "not valid YAML")


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("why", "shop/web-0", "-n", "other"), "-n says 'other'"),
        (("snapshot", "a/b/c"), "not NAMESPACE/POD"),
        (("why", "shop/"), "not NAMESPACE/POD"),
        (("status", "-o", "table"), "invalid choice: 'table'"),
        (
            ("diagnose", "--snapshot", "x.json", "--policy", "p.yaml", "--no-policy"),
            "not allowed with argument --policy",
        ),
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(
    tmp_path: Path, files: dict[str, Path], args: tuple[str, ...], says: str
) -> None:
    out = run(tmp_path, *args, "--kubeconfig", str(files["good"]))
    assert_one_line(out, says)


def test_kubectl_unstick_lists_only_the_users_commands(tmp_path: Path) -> None:
    helped = run(tmp_path, "--help", program="kubectl-unstick")
    assert helped.returncode == 0, helped.stderr
    listed = {
        line.split()[0]
        for line in helped.stdout.split("positional arguments:")[1].split("options:")[0]
        .splitlines()[2:]
        if line.startswith("    ") and not line.startswith("      ")
    }  # fmt: skip
    assert listed == {"status", "why", "diagnose", "snapshot"}
    for server in ("controller", "agent", "demo"):
        assert_one_line(run(tmp_path, server, program="kubectl-unstick"), "invalid choice")
        assert run(tmp_path, server, "--help").returncode == 0  # `unstick` keeps them
