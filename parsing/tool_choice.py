"""Reading `PredictOptions.ToolChoice`: OpenAI's tool_choice as LocalAI sends it.

LocalAI writes the request's `tool_choice` with Go's `json.Marshal`
(core/http/endpoints/openai/inference.go), so the field holds JSON: `"auto"`, `"none"`,
`"required"` (quoted), or an object naming a function, `{"type": "function", "function":
{"name": "f"}}`. core/http/middleware/request.go also takes the legacy `{"type":
"function", "name": "f"}` and an object encoded twice (a JSON string holding it); bare
words (`required`, as older clients and this project's tests send) are read too.

Lenient as LocalAI is: text that is none of these counts as "auto" (no constraint, all
tools offered), never an error. Imports neither MLX nor llguidance.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["ToolChoice", "read_tool_choice"]

ToolChoiceMode = Literal["auto", "none", "required", "function"]
_MODES = ("auto", "none", "required")
MAX_DEPTH = 2  # a JSON string holding the object (LocalAI's shape 4) is unwrapped once


@dataclass(frozen=True)
class ToolChoice:
    """`mode`: "auto" (the model decides), "none" (no tools), "required" (at least one
    call) or "function" (a call of `name`, the only case where `name` is set)."""

    mode: ToolChoiceMode = "auto"
    name: str = ""

    @property
    def forces_call(self) -> bool:
        """Whether the request requires a call ("required" or a named function)."""
        return self.mode in ("required", "function")


def _function_name(value: dict[str, Any]) -> str:
    function = value.get("function")
    named = function.get("name") if isinstance(function, dict) else None
    if isinstance(named, str):
        return named
    name = value.get("name")  # the legacy / Anthropic-compatible flat shape
    return name if isinstance(name, str) else ""


def _read(value: Any, depth: int) -> ToolChoice:
    if isinstance(value, dict):
        name = _function_name(value).strip()
        if name:
            return ToolChoice("function", name)
        kind = value.get("type")
        if isinstance(kind, str) and kind.strip().lower() in _MODES:
            return _read(kind, depth)
        return ToolChoice()
    if not isinstance(value, str):
        return ToolChoice()
    text = value.strip()
    if text[:1] in ('"', "{") and depth < MAX_DEPTH:
        try:
            return _read(json.loads(text), depth + 1)
        except (json.JSONDecodeError, RecursionError):
            return ToolChoice()
    word = text.lower()
    if word == "none":
        return ToolChoice("none")
    if word == "required":
        return ToolChoice("required")
    return ToolChoice()


def read_tool_choice(raw: str) -> ToolChoice:
    """The `ToolChoice` of `PredictOptions.ToolChoice` (module doc for the shapes read);
    "" and anything unreadable give mode "auto". Never raises."""
    return _read(raw, 0)
