"""What the diagnosis is told by the RemediationPolicy in force (built by
`unstick.core.policy.remediation_policy.RemediationPolicy.settings`; the defaults are the
policy's): when a deleted pod counts as stuck, when a not-Ready node counts as lost, how
old a probe may be, who serves which finalizer, and which sources prove a node is off."""

from __future__ import annotations

from dataclasses import dataclass, field

from unstick.core.rules.fencing import FencingSettings
from unstick.core.rules.finalizer_owners import FinalizerOwner


@dataclass(frozen=True, slots=True)
class DiagnosisSettings:
    slack_s: float = 60.0  # spec.slackSeconds
    node_lost_after_s: float = 300.0  # spec.nodeLostAfterSeconds
    probe_max_age_s: float = 120.0  # spec.probeMaxAgeSeconds
    # spec.finalizerOwners: finalizer prefix -> its Lease or Deployment
    finalizer_owners: tuple[FinalizerOwner, ...] = ()
    # spec.fencingEvidence and spec.fenceAgentsRemediationNamespaces (docs/fencing.md)
    fencing: FencingSettings = field(default_factory=FencingSettings)
