"""Remediation records: the writes (spec, status, Events), the pod's own record, the newest
copy of each, and records no stuck pod backs."""
