"""Node incidents: one Remediation for the pods one node-level fact holds, its path through
a pass, and adoption of a dead controller's incidents."""
