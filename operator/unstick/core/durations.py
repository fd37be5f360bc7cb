"""Durations for people: evidence and refusal messages."""

from __future__ import annotations


def human(seconds: float) -> str:
    """812.4 → "13m32s"; 7300 → "2h1m40s"; 4.2 → "4s"."""
    s = round(abs(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    return f"{m}m{s}s" if m else f"{s}s"
