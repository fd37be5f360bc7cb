"""`unstick diagnose`: diagnose one pod offline from a snapshot bundle."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from unstick.commands import options

EXIT_UNREADABLE = 2

DESCRIPTION = """\
Diagnose one pod stuck in Terminating from a snapshot bundle (see `unstick snapshot`),
offline: prints the cause, the evidence, the plan and what is refused and why.

The policy: --policy FILE if given; otherwise the RemediationPolicy recorded in the
bundle by `unstick snapshot` (the one in force for the pod when it was captured), if any.
Under a policy, its permitted actions, thresholds (slack, nodeLostAfter, probeMaxAge) and
finalizer allowlist apply, and a pod without the annotation unstick.dev/remediate ("true"
or the policy's name) is treated as not opted in (namespace labels are not in a bundle,
so they count as absent). With no policy (or --no-policy) the plan is computed with the
built-in thresholds (60 s slack) as if every action were permitted (the safety refusals
still apply) and opt-in is not considered: it shows what could safely be done.

--policy and --no-policy exclude each other.

Exit status: 0 with a diagnosis, 2 when the bundle or the policy cannot be read."""


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "diagnose",
        help="diagnose one pod offline from a snapshot bundle",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--snapshot",
        required=True,
        metavar="FILE",
        help="snapshot bundle (JSON) from `unstick snapshot`; '-' reads standard input",
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument(
        "--policy",
        metavar="FILE",
        help="a RemediationPolicy (YAML or JSON), the whole object or just its spec",
    )
    which.add_argument(
        "--no-policy",
        action="store_true",
        help="ignore the policy recorded in the snapshot: built-in thresholds, every action",
    )
    options.add_output_flag(
        p,
        text="json or yaml: the docs/design.md §6 report; text: for people (default); "
        "wide: the same as text (a diagnosis has no columns to widen)",
    )
    p.set_defaults(command="diagnose")


class _Unreadable(Exception):
    pass


def _read(path: str, what: str) -> str:
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as err:
        raise _Unreadable(f"cannot read {what} {path}: {err.strerror or err}") from None
    except UnicodeDecodeError:
        raise _Unreadable(f"cannot read {what} {path}: not UTF-8 text") from None


def _load_bundle(path: str) -> object:
    text = _read(path, "snapshot")
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise _Unreadable(
            f"snapshot {path} is not valid JSON: line {err.lineno} column {err.colno}: {err.msg}"
        ) from None


def _load_policy(path: str) -> object:
    import yaml

    text = _read(path, "policy")
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1} column {mark.column + 1}: " if mark else ""
        problem = getattr(err, "problem", None) or "cannot parse"
        raise _Unreadable(f"policy {path} is not valid YAML/JSON: {where}{problem}") from None


def run(args: argparse.Namespace) -> int:
    from unstick.core.fields import FieldError
    from unstick.core.model.snapshot import BundleError, parse_bundle
    from unstick.core.policy.remediation_policy import PolicyError, RemediationPolicy, parse_policy
    from unstick.core.rules.aftermath import bundle_aftermath

    source = args.policy
    policy: RemediationPolicy | None
    try:
        raw = _load_bundle(args.snapshot)
        facts = parse_bundle(raw)
        try:
            aftermath = bundle_aftermath(raw)
        except FieldError as err:  # the bundle's aftermath keys (docs/aftermath.md)
            raise BundleError(err.field, err.message) from None
        if args.policy:
            policy = parse_policy(_load_policy(args.policy))
        else:
            recorded = None if args.no_policy else recorded_policy(raw)
            source = f"recorded in snapshot {args.snapshot} (field policy)"
            policy = parse_policy(recorded) if recorded is not None else None
    except BundleError as err:
        print(f"unstick diagnose: bad snapshot {args.snapshot}: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    except PolicyError as err:
        print(f"unstick diagnose: bad policy {source}: {err}", file=sys.stderr)
        return EXIT_UNREADABLE
    except _Unreadable as err:
        print(f"unstick diagnose: {err}", file=sys.stderr)
        return EXIT_UNREADABLE

    print(render(facts, policy, args.output, aftermath))
    return 0


def render(facts: Any, policy: Any, output: str, aftermath: Any = None) -> str:
    """The diagnosis of parsed bundle `facts` under `policy` (a parsed RemediationPolicy,
    or None: built-in thresholds, every action), as `output` (json|text)."""
    from unstick.core.policy.mandate import opted_in
    from unstick.core.policy.planner import plan
    from unstick.core.report import to_report, to_text
    from unstick.core.rules.diagnosis import diagnose

    if policy is None:
        diagnosis = diagnose(facts)
        result = plan(diagnosis, None)
    else:
        diagnosis = diagnose(facts, policy.settings)
        consent = opted_in(facts.pod.annotations, None, policy.name)
        result = plan(diagnosis, policy, opted_in=bool(consent))
    from unstick.core.rules.aftermath import aftermath_lines

    if output in ("json", "yaml"):
        report = to_report(diagnosis, result)
        if aftermath and any(aftermath.values()):
            report["aftermath"] = aftermath  # docs/aftermath.md: only when there is one
        return options.dump(report, output)
    under = f"policy {policy.name}" if policy else "no policy (built-in thresholds)"
    extra = "".join(f"\naftermath: {line}" for line in aftermath_lines(aftermath or {}))
    return f"{to_text(diagnosis, result)}{extra}\n(diagnosed under {under})"


def recorded_policy(bundle: object) -> object | None:
    """The bundle's optional top-level `policy` (absent or null in older bundles)."""
    return bundle.get("policy") if isinstance(bundle, dict) else None
