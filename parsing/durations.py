"""Durations as LocalAI's settings write them: "500ms", "2s", "1.5m", "1h", or plain seconds
(the parent-watch interval, the shutdown grace, the distributed join timeout)."""

from __future__ import annotations

import math
import re

_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|s|m|h)?\s*$", re.IGNORECASE)
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    """Seconds in ``text``: "500ms", "2s", "1.5m", "1h", or a plain number of seconds.

    Raises ValueError for anything else (negative, empty, unknown unit, inf/nan).
    """
    match = _DURATION_RE.match(text)
    if not match:
        raise ValueError(
            f'invalid duration {text!r}: use e.g. "500ms", "2s", "1m" or plain seconds'
        )
    number, unit = match.groups()
    seconds = float(number) * _UNIT_SECONDS[unit.lower() if unit else None]
    if not math.isfinite(seconds):
        raise ValueError(f"invalid duration {text!r}: not a finite number of seconds")
    return seconds
