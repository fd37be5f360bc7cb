"""Policy: the RemediationPolicy and its fields, the mandate (the one opt-in rule), the
planner and the rate limits. Pure; the safety predicates they apply are
`unstick.core.safety`'s."""
