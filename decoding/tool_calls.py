"""Tool calls: the `ToolCall` value, parsing one tool-call block, and streaming its arguments.

Owns the text found *between* a model's tool-call markers (the markers themselves are found by
`output.py`). Whole-block parsing is done by the tokenizer's tool parser (a format's of
decoding/tool_formats/ where LocalAI's `tool_parser` names one, else mlx-lm's
`mlx_lm/tool_parsers/*.py`, chosen by `mlx_lm.tokenizer_utils.load` from the chat template);
this module checks its result and normalises it to OpenAI's shape, like mlx-lm's server
`ToolCallFormatter`, except that a malformed call raises instead of being dropped.

Streaming (`BlockStreamer`): while a block is generated, calls are announced as soon as their
name is known and their arguments have started (JSON: the object's first key or its end
follows its "{"; XML: the first parameter opens or the call ends), then argument text follows
in fragments (vLLM's and llama.cpp's shape: the first `ToolCallDelta` of a call has index, id
and name with arguments "", later ones the same index and a fragment; LocalAI's Go side joins
them by index). The announcement waits that long (a token or two) because LocalAI's proto
cannot withdraw a streamed call: a block cut off right after a call's head, or whose call
names a tool the request does not declare where the format says that is no call
(`JsonStream.declared_only`), is never announced, so PredictStream shows what Predict shows.

How a format's arguments stream is its own: `ToolFormat.stream` (decoding/tool_formats/, a
`JsonStream` or an `XmlStream` declared in the format's module; for a parser mlx-lm inferred
from the chat template, decoding/tool_formats/mlx_modules.py). The output pipeline hands it
to the streamer (`tool_formats.stream_of`). The shapes:

| `ToolFormat.stream`                     | formats (vLLM names)          | arguments stream   |
|-----------------------------------------|-------------------------------|--------------------|
| `JSON_OBJECT` (`{"name", "arguments"}`) | hermes, granite4, ernie45,    | raw JSON text as   |
|                                         | internlm, gigachat3           | generated          |
| `JSON_LIST` (a list of those)           | jamba, granite, hunyuan_a13b  | raw JSON, by call  |
| `JSON_LINES` (one of those a line)      | minimax                       | raw JSON, by call  |
| `JsonStream` of its own                 | mistral `NAME[ARGS]{...}`,    | raw JSON, by call  |
|                                         | kimi_k2                       |                    |
| `XmlStream`                             | qwen3_coder, qwen3_xml,       | string values char |
|                                         | seed_oss, minimax_m2, glm45,  | by char, others    |
|                                         | glm47, step3p5, mimo,         | per parameter      |
|                                         | poolside_v1, hy_v3            |                    |
| None (`ToolFormat.whole` says why)      | pythonic, gemma4, openai, ... | whole, at the end  |

Rules (what the final reply holds):
- JSON formats stream the raw argument text; the final `arguments` is that raw text (valid JSON
  object text, checked at the end), not a re-serialisation, so it equals the concatenation.
  Streaming stops at a character JSON cannot hold outside a string (a call's end marker
  inside arguments never closed): none of it is sent.
- XML-parameter formats stream JSON built the way `json.dumps(arguments, ensure_ascii=False)`
  writes it, each value converted by the format's parser when its parameter closes.
- At the block's end the whole block is parsed by the format's parser. A call whose streaming
  stopped inside its arguments (text the streaming parse cannot read, e.g. a GLM `<arg_key>`
  never closed, which the whole parse skips) keeps its index when what was streamed is the
  start of the parsed arguments: the rest follows as one fragment. A streamed call whose name or
  arguments disagree with that parse is *dropped* (a `ToolCallDelta(dropped=True)` for its
  index) and the parsed calls are emitted whole under new indices. If the block does not parse
  at all, every call streamed from it is dropped and the raw block (markers included) comes
  back as content. Dropped indices are never reused, so a client merging by index never mixes
  two calls; `merge_tool_call_deltas` leaves dropped calls out.
- Formats without a stream spec (and any block whose start does not match the streamable
  shape, e.g. keys in another order, or mistral's `[{...}]` list form) emit each call as one
  delta with all four fields at the block's end.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import regex  # mlx-lm's dependency; its partial matching tells "not yet" from "never"

ToolParser = Callable[[str, Any], Any]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ToolCall:
    """One complete function call, as OpenAI's `tool_calls[i]` (and LocalAI's ToolCallDelta).

    index: position among this request's calls (0, 1, ...); id: unique ("call_<24 hex>"
    unless the parser supplied one); name: the function name; arguments: a JSON object
    serialised as a string (never a dict).
    """

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ToolCallDelta:
    """One streamed piece of a call (LocalAI's `ToolCallDelta`; OpenAI's streamed tool_calls).

    The first piece of a call has index, id and name (arguments "", or the whole arguments for
    a call emitted whole); later pieces have the same index and an arguments fragment only.
    dropped=True (no other fields): the call at `index` was streamed but turned out malformed;
    it is no call of the final reply (see the module docstring) and is not sent to clients.
    """

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""
    dropped: bool = False


def merge_tool_call_deltas(deltas: Iterable[ToolCallDelta | ToolCall]) -> list[ToolCall]:
    """Join streamed pieces into whole calls by index (what LocalAI's Go side does).

    Accepts `ToolCallDelta`s and `ToolCall`s mixed; ids and names are taken from the first
    piece that has them, arguments are concatenated in order. Calls with a dropped piece are
    left out. Returns calls sorted by index.
    """
    ids: dict[int, str] = {}
    names: dict[int, str] = {}
    args: dict[int, list[str]] = {}
    dropped: set[int] = set()
    for d in deltas:
        if getattr(d, "dropped", False):
            dropped.add(d.index)
            continue
        args.setdefault(d.index, []).append(d.arguments)
        if d.id and d.index not in ids:
            ids[d.index] = d.id
        if d.name and d.index not in names:
            names[d.index] = d.name
    return [
        ToolCall(i, ids.get(i, ""), names.get(i, ""), "".join(args[i]))
        for i in sorted(args)
        if i not in dropped
    ]


def new_call_id() -> str:
    """A fresh OpenAI-style call id: "call_" and 24 random hex digits (96 bits)."""
    return "call_" + secrets.token_hex(12)


def parse_tool_block(
    parser: ToolParser | None,
    text: str,
    tools: Sequence[dict] | None = None,
    first_index: int = 0,
) -> list[ToolCall]:
    """Parse the text between one pair of tool-call markers into calls.

    `parser` is `TokenizerWrapper.tool_parser` (called as `parser(text, tools)`; it returns a
    dict or a list of dicts with "name" and "arguments"). Indices start at `first_index`.
    Raises ValueError when the text is not a well-formed call: the parser failed, a name is
    missing, or the arguments are not a JSON object. Nothing is returned partially.
    """
    if parser is None:
        raise ValueError("the model has no tool parser")
    try:
        parsed = parser(text, list(tools) if tools is not None else None)
    except Exception as exc:  # third-party parsers raise many kinds on malformed model text
        raise ValueError(f"tool parser failed: {type(exc).__name__}: {exc}") from exc
    items = parsed if isinstance(parsed, list) else [parsed]
    if not items:
        raise ValueError("tool parser found no call")
    calls = []
    for offset, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"tool call is a {type(item).__name__}, not an object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError("tool call has no name")
        # Some models write "parameters" (Llama style); a call without arguments has none.
        args = item.get("arguments", item.get("parameters", {}))
        call_id = item.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = new_call_id()
        calls.append(ToolCall(first_index + offset, call_id, name, _arguments_json(args)))
    return calls


def _arguments_json(args: Any) -> str:
    """Arguments as a JSON object string; accepts a dict or a string holding a JSON object."""
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as exc:
            raise ValueError(f"tool call arguments are not JSON: {exc}") from exc
    if args is None:
        args = {}
    if not isinstance(args, dict):
        raise ValueError(f"tool call arguments are a {type(args).__name__}, not an object")
    try:  # parsers of Python-like calls can return bytes, sets, inf: no JSON
        return json.dumps(args, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"tool call arguments are not JSON: {exc}") from exc


# --- streaming -------------------------------------------------------------------------------

_QUOTED = r'"(?:[^"\\]|\\.)*"'
_OBJ_HEAD = (
    r'\s*\{\s*"name"\s*:\s*(?P<name>' + _QUOTED + r")\s*,"
    r'\s*"(?:arguments|parameters)"\s*:\s*\{'
)


@dataclass(frozen=True)
class JsonStream:
    """How a format's calls stream when their arguments are one raw JSON object after a
    head giving the name (a format's `ToolFormat.stream`, decoding/tool_formats/).

    first / following: the head of the first / each later call, ending at the object's "{"
    (None: one call per block). quoted: the name group is a JSON string. declared_only:
    where the request declares tools, a call naming another tool is no call (the format's
    whole parse rejects it): the stream does not announce it.
    """

    first: str
    following: str | None = None
    quoted: bool = True
    declared_only: bool = False


@dataclass(frozen=True)
class XmlStream:
    """How a format's calls stream when they have one element per parameter; each value is
    converted by the format's whole-block parser (a format's `ToolFormat.stream`).

    call_open (group name) / call_close: around one call (call_close None: the call runs to
    the block's end). param_first / param_next (group key): a parameter's opening, ending
    where its value starts; value_close: the literal ending a value. synth_close: appended
    to a call's text so far to make it parseable. trim: how the parser trims string values
    ("nl": one leading and one trailing newline; "strip": all surrounding whitespace;
    "none": as written). value_stop: literals that end a value left unclosed (not consumed);
    close_follow: what must follow value_close for it to end the value; known_key(tools,
    name, key): whether ``key`` is a declared parameter of tool ``name`` (with
    close_follow / value_stop).
    """

    call_open: str
    param_first: str
    param_next: str
    value_close: str
    call_close: str | None
    synth_close: str
    trim: str
    value_stop: tuple[str, ...] = ()
    close_follow: str | None = None
    known_key: Callable[[Any, str, str], bool] | None = None


StreamSpec = JsonStream | XmlStream

# The two JSON shapes several formats share: one `{"name", "arguments"}` object per block
# (mlx-lm's json_tools: hermes, granite4, ernie45, internlm) and a JSON list of them
# (jamba, granite, hunyuan_a13b).
JSON_OBJECT = JsonStream(_OBJ_HEAD)
JSON_LIST = JsonStream(r"\s*\[" + _OBJ_HEAD, r"\s*\}\s*," + _OBJ_HEAD)
# one object a line, no list (minimax)
JSON_LINES = JsonStream(_OBJ_HEAD, r"\s*\}" + _OBJ_HEAD)


# What JSON text holds outside its strings (structure, numbers, true / false / null): any
# other character ends a call's streamed arguments.
_JSON_OUTSIDE_STRINGS = frozenset(' \t\r\n{}[]:,"-+.0123456789eEtrufalsn')


@dataclass
class _Streamed:
    """A call as streamed so far: its global index, id, name and the arguments text sent."""

    index: int
    id: str
    name: str
    arguments: str = ""
    closed: bool = False


def declared_names(tools: Sequence[dict] | None) -> set[str]:
    """The function names the request's tool definitions declare (OpenAI's shape, or a bare
    function object)."""
    names = set()
    for tool in tools or ():
        function = tool.get("function", tool) if isinstance(tool, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    return names


def _partial_suffix(text: str, literal: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of `literal`."""
    for k in range(min(len(literal) - 1, len(text)), 0, -1):
        if text.endswith(literal[:k]):
            return k
    return 0


class BlockStreamer:
    """Streams the calls of one tool-call block as `ToolCallDelta`s while it is generated.

    parser: `TokenizerWrapper.tool_parser`; tools: the request's tool definitions (some
    parsers type values from them); first_index: the index of the block's first call;
    stream: how the format's arguments stream (its `ToolFormat.stream`,
    `tool_formats.stream_of`; None: its calls are emitted whole at the block's end).
    `push(text)` takes the block's next text (markers excluded) and returns the deltas it
    completes; `close(complete)` ends the block and returns (deltas, whole calls, ok): ok is
    False when the block is malformed (then its text belongs in content, as the module
    docstring says). `next_index` is the index after the last one this block used.
    """

    def __init__(
        self,
        parser: ToolParser | None,
        tools: Sequence[dict] | None = None,
        first_index: int = 0,
        stream: StreamSpec | None = None,
    ) -> None:
        self._parser = parser
        self._tools = list(tools) if tools is not None else None
        self._spec = stream if parser is not None else None
        self._buf = ""
        self._pos = 0
        self._state = "head" if self._spec is not None else "off"
        self.calls: list[_Streamed] = []
        self.next_index = first_index
        self.error = ""  # why close() found the block malformed
        # JSON object scanning (depth, inside a string, after a backslash)
        self._depth, self._in_str, self._esc = 0, False, False
        # XML parameter state
        self._call_start = 0
        self._value_start = 0
        self._key = ""
        self._params = 0
        self._sent_value: str | None = None  # None: the value is not streamed char by char
        self._value_started = False
        self._call_keys: set[str] = set()  # the parameters the current call has opened
        self._pending = ""  # an XML call's name, announced once its first parameter opens

    @property
    def text(self) -> str:
        """The block's text so far."""
        return self._buf

    def push(self, text: str) -> list[ToolCallDelta]:
        """Add the block's next text; returns the deltas now safe to send."""
        self._buf += text
        out: list[ToolCallDelta] = []
        if self._state == "off" or not text:
            return out
        try:
            if isinstance(self._spec, JsonStream):
                self._step_json(out, self._spec)
            elif isinstance(self._spec, XmlStream):
                self._step_xml(out, self._spec)
        except Exception as exc:  # a parser raising on a probe: stop streaming, parse at the end
            logger.debug("tool call streaming stopped: %s: %s", type(exc).__name__, exc)
            self._state = "off"
        return _coalesce(out)

    def close(self, complete: bool) -> tuple[list[ToolCallDelta], list[ToolCall], bool]:
        """End the block. complete=False: it was cut off (no end marker where one is needed).

        Returns (deltas to send, the block's whole calls, ok). Streamed calls that the whole
        parse confirms keep their index, id and streamed arguments; the others are dropped
        and the parsed calls from the first mismatch on are emitted whole under new indices.
        """
        out: list[ToolCallDelta] = []
        xml = self._spec if isinstance(self._spec, XmlStream) else None
        if complete and xml is not None and self._state == "between" and xml.call_close is None:
            self._end_xml_call(out)  # the call ends with the block
        parsed: list[ToolCall] = []
        ok = complete
        if complete:
            try:
                parsed = parse_tool_block(self._parser, self._buf, self._tools, 0)
            except ValueError as exc:
                self.error = str(exc)
                ok = False
        if not ok:
            out += [ToolCallDelta(c.index, dropped=True) for c in self.calls]
            return out, [], False
        calls: list[ToolCall] = []
        kept = 0
        for s, p in zip(self.calls, parsed, strict=False):
            if s.closed and s.name == p.name and _same_json(s.arguments, p.arguments):
                calls.append(ToolCall(s.index, s.id, s.name, s.arguments))
                kept += 1
                continue
            # streaming stopped inside this call's arguments (text the streaming parse cannot
            # read, which the whole parse skips): where what was sent is the start of the
            # parsed arguments, the rest completes them and the call stands
            unfinished = s is self.calls[-1] and not s.closed and s.name == p.name
            if unfinished and p.arguments.startswith(s.arguments):
                self._args(out, p.arguments[len(s.arguments) :])
                calls.append(ToolCall(s.index, s.id, s.name, p.arguments))
                kept += 1
            break
        if kept < len(self.calls):
            logger.warning("streamed tool call disagrees with the whole parse; re-sent whole")
        out += [ToolCallDelta(s.index, dropped=True) for s in self.calls[kept:]]
        for p in parsed[kept:]:
            call = ToolCall(self.next_index, p.id, p.name, p.arguments)
            self.next_index += 1
            calls.append(call)
            out.append(ToolCallDelta(call.index, call.id, call.name, call.arguments))
        return out, calls, True

    # -- internals --

    def _open(self, out: list[ToolCallDelta], name: str, call_id: str | None) -> None:
        call = _Streamed(self.next_index, call_id or new_call_id(), name)
        self.next_index += 1
        self.calls.append(call)
        out.append(ToolCallDelta(call.index, call.id, call.name, ""))

    def _args(self, out: list[ToolCallDelta], fragment: str) -> None:
        if fragment:
            call = self.calls[-1]
            call.arguments += fragment
            out.append(ToolCallDelta(call.index, arguments=fragment))

    def _match(self, pattern: str) -> Any:
        """Full match at the position, "partial" (could still match), or None (never)."""
        m = regex.match(pattern, self._buf, pos=self._pos, partial=True, flags=regex.DOTALL)
        if m is None:
            return None
        return "partial" if m.partial else m

    def _step_json(self, out: list[ToolCallDelta], spec: JsonStream) -> None:
        while True:
            if self._state == "head":
                pattern = spec.first if not self.calls else spec.following
                m = self._match(pattern) if pattern else None
                if m is None:
                    self._state = "off"
                    return
                if m == "partial":
                    return
                name = json.loads(m.group("name")) if spec.quoted else m.group("name")
                if not isinstance(name, str) or not name:
                    self._state = "off"
                    return
                declared = declared_names(self._tools) if spec.declared_only else set()
                if declared and name not in declared:
                    self._state = "off"  # no call: the whole parse puts the block in content
                    return
                start = self._buf[m.end() :].lstrip()
                if not start:
                    return  # announced once the arguments' first key (or their end) shows
                if start[0] not in '"}':
                    self._state = "off"  # no JSON object: the whole parse decides
                    return
                self._open(out, name, m.groupdict().get("id"))
                self._pos = m.end() - 1  # at the arguments' "{"
                self._depth, self._in_str, self._esc = 0, False, False
                self._state = "args"
            if self._state != "args":
                return
            i, end, done, bad = self._pos, len(self._buf), False, False
            while i < end:  # track strings and nesting only: the whole parse validates
                c = self._buf[i]
                if not self._in_str and c not in _JSON_OUTSIDE_STRINGS:
                    bad = True  # no JSON (a call's end marker inside unclosed arguments)
                    break
                i += 1
                if self._in_str:
                    if self._esc:
                        self._esc = False
                    elif c == "\\":
                        self._esc = True
                    elif c == '"':
                        self._in_str = False
                elif c == '"':
                    self._in_str = True
                elif c in "{[":
                    self._depth += 1
                elif c in "}]":
                    self._depth -= 1
                    if self._depth == 0:
                        done = True
                        break
            self._args(out, self._buf[self._pos : i])
            self._pos = i
            if bad:
                self._state = "off"  # none of it is sent: the whole parse decides
            if not done:
                return
            self.calls[-1].closed = True
            self._state = "head"

    def _step_xml(self, out: list[ToolCallDelta], spec: XmlStream) -> None:
        while True:
            if self._state == "head":
                m = self._match(spec.call_open)
                if m is None:
                    self._state = "off"
                if m is None or m == "partial":
                    return
                self._call_start = self._pos
                self._params = 0
                self._call_keys = set()
                self._pending = _unquote(m.group("name").strip())  # announced below
                self._pos = m.end()
                self._state = "between"
            elif self._state == "between":
                pattern = spec.param_first if self._params == 0 else spec.param_next
                m = self._match(pattern)
                c = self._match(spec.call_close) if spec.call_close else None
                if m not in (None, "partial"):
                    self._announce(out)
                    self._pos = self._value_start = m.end()
                    self._begin_value(m.group("key"))
                    self._state = "value"
                elif c not in (None, "partial"):
                    self._pos = c.end()
                    self._end_xml_call(out)
                    self._state = "head"
                elif m is None and c is None:
                    self._state = "off"
                    return
                else:
                    return
            elif self._state == "value":
                region = self._buf[self._value_start :]
                end, close_len, hold = self._value_end(region, spec)
                if end is None:
                    if self._sent_value is not None:
                        held = max(
                            _partial_suffix(region, t) for t in (spec.value_close, *spec.value_stop)
                        )
                        cut = len(region) - held if hold is None else min(hold, len(region) - held)
                        self._stream_value(out, region[:cut])
                    return
                self._pos = self._value_start + end + close_len
                self._end_value(out)
                self._params += 1
                self._state = "between"
            else:
                return

    def _value_end(self, region: str, spec: XmlStream) -> tuple[int | None, int, int | None]:
        """Where the current value ends in ``region``: (end, length of the close to skip,
        None) once known; (None, 0, position text is held from) while undecided. With
        `close_follow`, a close counts only where a declared parameter or the function's
        end follows it (vLLM's rule; else it is the value's text), and an unclosed value
        ends at the next declared `<parameter=...>` (`value_stop`)."""
        if spec.close_follow is None or spec.known_key is None:
            j = region.find(spec.value_close)
            return (None, 0, None) if j < 0 else (j, len(spec.value_close), None)
        name = self.calls[-1].name

        def known_key(key: str) -> bool:
            return spec.known_key is not None and spec.known_key(self._tools, name, key)

        close, stop = None, None
        j = region.find(spec.value_close)
        while j >= 0:
            m = regex.match(spec.close_follow, region, pos=j + len(spec.value_close), partial=True)
            if m is not None and m.partial:
                return None, 0, j
            if m is not None and (m.group("key") is None or known_key(m.group("key"))):
                close = j
                break
            j = region.find(spec.value_close, j + 1)
        for literal in spec.value_stop:
            k = region.find(literal)
            while k >= 0 and (close is None or k < close):
                m = regex.match(r"<parameter=(?P<key>[^>]*)>", region, pos=k, partial=True)
                if m is not None and m.partial:
                    return None, 0, k
                key = m.group("key").strip() if m is not None else ""
                if m is not None and known_key(key) and key not in self._call_keys:
                    stop = k if stop is None else min(stop, k)
                    break
                k = region.find(literal, k + 1)
        if stop is not None and (close is None or stop < close):
            return stop, 0, None
        if close is not None:
            return close, len(spec.value_close), None
        return None, 0, None

    @property
    def _xml(self) -> XmlStream:
        """The format of an XML-style block (only its paths ask)."""
        if not isinstance(self._spec, XmlStream):
            raise TypeError(f"not an XML-style tool-call format: {self._spec!r}")
        return self._spec

    def _parse_call(self, text: str) -> dict:
        """Arguments of the current call's text with `text` standing for what comes next."""
        synth = self._buf[self._call_start : self._value_start] + text + self._xml.synth_close
        if self._parser is None:  # never: the XML formats are read from the parser
            raise ValueError("the model has no tool parser")
        parsed = self._parser(synth, self._tools)
        if isinstance(parsed, list):
            parsed = parsed[-1]
        args = parsed.get("arguments")
        if not isinstance(args, dict) or len(args) != self._params + 1:
            raise ValueError("parameter not found by the parser")
        return args

    def _begin_value(self, key: str) -> None:
        self._call_keys.add(key.strip())
        self._begin_value_stream(key)

    def _begin_value_stream(self, key: str) -> None:
        """Decide whether this parameter's value streams char by char: only when the parser
        returns it as text unchanged (probed with two values that other types would convert)."""
        self._sent_value, self._value_started, self._key = None, False, ""
        close = self._xml.value_close
        try:
            probes = [list(self._parse_call(v + close).items())[-1] for v in ("1", "ab")]
        except Exception:
            return
        if probes[0] == (probes[0][0], "1") and probes[1] == (probes[0][0], "ab"):
            self._key, self._sent_value = probes[0][0], ""

    def _stream_value(self, out: list[ToolCallDelta], visible: str) -> None:
        if self._xml.trim == "nl":
            visible = visible[1:] if visible.startswith("\n") else visible
            visible = visible[:-1] if visible.endswith("\n") else visible
        elif self._xml.trim == "strip":
            visible = visible.strip()
        if not self._value_started:
            # the parsers may turn "null" (and Python's "None") into None
            if "null".startswith(visible.lower()) or "None".startswith(visible):
                return
            self._args(out, ("{" if self._params == 0 else ", ") + _dumps(self._key) + ': "')
            self._value_started = True
        new = visible[len(self._sent_value or "") :]
        if new:
            self._args(out, _dumps(new)[1:-1])  # JSON escapes are per character
            self._sent_value = visible

    def _end_value(self, out: list[ToolCallDelta]) -> None:
        raw = self._buf[self._value_start : self._pos]
        key, value = list(self._parse_call(raw).items())[-1]
        if self._value_started:
            sent = self._sent_value or ""
            if not (isinstance(value, str) and value.startswith(sent)):
                raise ValueError("streamed value differs from the parsed one")
            self._args(out, _dumps(value[len(sent) :])[1:-1] + '"')
        else:
            sep = "{" if self._params == 0 else ", "
            self._args(out, sep + _dumps(key) + ": " + _dumps(value))
        self._sent_value, self._value_started = None, False

    def _announce(self, out: list[ToolCallDelta]) -> None:
        """Announce the XML call whose head was read (once its first parameter opens or it
        ends: a block cut off after the head is no call, and is never shown)."""
        if self._pending:
            self._open(out, self._pending, None)
            self._pending = ""

    def _end_xml_call(self, out: list[ToolCallDelta]) -> None:
        self._announce(out)
        self._args(out, "}" if self._params else "{}")
        self.calls[-1].closed = True


def _coalesce(pieces: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Join adjacent argument fragments of one call (one piece per call per step)."""
    out: list[ToolCallDelta] = []
    for p in pieces:
        last = out[-1] if out else None
        fragment = not (p.name or p.id or p.dropped)
        # A call's first piece stays arguments-free, as clients expect.
        if fragment and last and last.index == p.index and not (last.name or last.dropped):
            out[-1] = ToolCallDelta(last.index, arguments=last.arguments + p.arguments)
            continue
        out.append(p)
    return out


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _unquote(name: str) -> str:
    if len(name) >= 2 and name[0] == name[-1] and name[0] in "\"'":
        return name[1:-1]
    return name


def _same_json(a: str, b: str) -> bool:
    try:
        return bool(json.loads(a) == json.loads(b))
    except ValueError:
        return False
