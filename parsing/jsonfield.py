"""Decoding one JSON-valued request field, bounded in size and depth.

Every JSON a client sends (``Tools``, ``LogitBias``, ``Messages[i].tool_calls``,
``Metadata`` values, a JSON-schema ``Grammar``) goes through ``decode``: one place that
turns "bad JSON", "too big", "too deep" and "wrong type" into a ``ValueError`` naming the
field. Depth is checked by a linear scan *before* ``json.loads``, whose recursive parser
would otherwise raise ``RecursionError`` (or exhaust the stack) on ``[[[[...``.
"""

from __future__ import annotations

import json
import re
from typing import Any

MAX_JSON_BYTES = 8 * 1024 * 1024  # one field; the gRPC message itself is capped at 50 MB
MAX_JSON_DEPTH = 64  # nesting of arrays/objects; real tool schemas stay under ~20

_KINDS: dict[type, str] = {list: "array", dict: "object", str: "string"}


# Characters that matter for JSON nesting: brackets, and quotes/backslashes for strings.
_STRUCTURE = re.compile(r'[\[\]{}"\\]')


def json_depth(raw: str, limit: int = MAX_JSON_DEPTH) -> int:
    """Nesting depth of the JSON text ``raw`` (0 for a scalar), stopping once past ``limit``.

    Brackets inside strings (escapes included) do not count. The text need not be valid
    JSON: this only bounds what ``json.loads`` would recurse into. Linear in len(raw), no
    recursion; the regex skips everything but brackets, quotes and backslashes.
    """
    depth = deepest = 0
    in_string = False
    skip = -1  # index of a character escaped by a backslash
    for match in _STRUCTURE.finditer(raw):
        pos = match.start()
        if pos == skip:
            continue
        char = match.group()
        if in_string:
            if char == "\\":
                skip = pos + 1
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    return deepest
        elif char in "]}":
            depth = max(depth - 1, 0)
    return deepest


def check_bounds(
    raw: str, field: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH
) -> None:
    """Raise ValueError naming ``field`` when ``raw`` is more than ``max_bytes`` UTF-8 bytes
    or nests arrays/objects deeper than ``max_depth``. Cheap: no parsing, no recursion."""
    size = len(raw.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise ValueError(f"{field} is {size} bytes; the limit is {max_bytes} bytes: shorten it")
    if json_depth(raw, max_depth) > max_depth:
        raise ValueError(f"{field} nests arrays/objects deeper than {max_depth} levels: flatten it")


def decode(
    raw: str,
    field: str,
    expect: type | tuple[type, ...] | None = None,
    *,
    allow_null: bool = True,
    max_bytes: int = MAX_JSON_BYTES,
    max_depth: int = MAX_JSON_DEPTH,
) -> Any:
    """Decode the JSON text ``raw`` of request field ``field``.

    Empty or whitespace text, and ``null`` when ``allow_null``, give None. ``expect``: the
    Python type(s) the top-level value must have (``list``, ``dict``, ...). Raises
    ValueError naming ``field`` for text over ``max_bytes`` characters, nesting deeper
    than ``max_depth``, invalid JSON, or a value of another type.
    """
    if not raw.strip():
        return None
    check_bounds(raw, field, max_bytes, max_depth)
    want = _describe(expect)
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{field} must be {want}: {err}") from None
    if value is None and allow_null:
        return None
    if expect is not None and not isinstance(value, expect):
        raise ValueError(f"{field} must be {want}, got {_name(value)}")
    return value


def _describe(expect: type | tuple[type, ...] | None) -> str:
    if expect is None:
        return "valid JSON"
    kinds = expect if isinstance(expect, tuple) else (expect,)
    return " or ".join(f"a JSON {_KINDS.get(k, k.__name__)}" for k in kinds)


def _name(value: Any) -> str:
    if value is None:
        return "null"
    return _KINDS.get(type(value), type(value).__name__)
