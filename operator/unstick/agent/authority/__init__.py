"""What the agent re-derives and checks before it probes or acts: the API's word on the pod
and the policy (invariant 7), the admission policy in force, a request's own checks, the
controller's namespace scope."""
