"""The channel to the node agent: node-step requests and probes, and the trust boundary on
what the agent writes back (design.md §3 invariant 7)."""
