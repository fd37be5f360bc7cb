"""Policy and safety: the RemediationPolicy, the mandate, the safety invariants of
design.md §3, the planner and the rate limits. Pure."""
