"""`Refused`: a node step's precondition does not hold, so nothing is changed.

Its own module so that the executor and the action modules it calls (replay, kubelet
restart) import it without importing each other.
"""

from __future__ import annotations


class Refused(Exception):
    """A precondition does not hold: the step is refused and nothing is changed."""
