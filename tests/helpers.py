"""Helpers shared by every tier of the tests (one copy each).

- Requests: ``greedy`` (a raw prompt, temperature 0), ``chat_request`` (a chat as LocalAI
  sends it), ``load_opts`` / ``gen_params`` (parsed load options, generation parameters).
- Replies: ``stream_text`` (a stream joined), ``joined_from`` (streamed deltas are the
  expected ones, some joined as a lagging reader gets them), ``code_of`` (the status a
  call ends with), ``status`` / ``counts`` / ``wait_idle`` (a server's Status breakdown,
  its request counts, polled until idle).
- Waiting: ``wait_until`` (poll a condition with a deadline; the one place tests sleep
  to wait for something), ``free_ports``.
- KV caches: ``token_kv`` (a real mlx-lm cache holding known values) and ``held``;
  ``greedy_ids`` (a model's own greedy continuation, token by token with a KV cache).
- ``ROOT``, ``LINUX``, ``REFERENCE`` (tests/data/smollm2-reference.json).
- Shared by a fast test module and its counterpart in another tier (a test module never
  imports another): ``AUTH_TOKEN``, ``DISK_FP`` / ``file_names`` (disk tier),
  ``write_hostfile`` (distributed), ``param_bytes`` / ``batch_tokens`` (CPU fusing), and the
  grammar cases ``GRAMMAR_FIELD``, ``PERSON``, ``YES_NO``, ``PICK`` / ``PICK_TOOLS``,
  ``grammar_matcher`` / ``grammar_accepts`` (a Lark grammar over a tokenizer), ``parse_constraint``,
  ``gbnf_alternatives``, ``assert_one_clean_line``.
"""

from __future__ import annotations

import dataclasses
import json
import random
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import grpc
import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.cache import KVCache, make_prompt_cache

import backend_pb2
import params

ROOT = Path(__file__).resolve().parent.parent
LINUX = sys.platform.startswith("linux")
REFERENCE = json.loads(
    (Path(__file__).parent / "data" / "smollm2-reference.json").read_text(encoding="utf-8")
)

T = TypeVar("T")


# --------------------------------------------------------------------------- requests
def greedy(prompt: str, tokens: int, **fields) -> backend_pb2.PredictOptions:
    """A raw-prompt request of ``tokens`` tokens at temperature 0; ``fields`` are added to
    it and may override ``Temperature`` too."""
    return backend_pb2.PredictOptions(
        **{"Prompt": prompt, "Tokens": tokens, "Temperature": 0.0, **fields}
    )


def chat_request(user: str, system: str = "", **fields) -> backend_pb2.PredictOptions:
    """A chat request as LocalAI sends it: template on, messages, explicit sampling fields."""
    req = backend_pb2.PredictOptions(UseTokenizerTemplate=True, **fields)
    if system:
        req.Messages.add(role="system", content=system)
    req.Messages.add(role="user", content=user)
    return req


def load_opts(*options: str, **fields) -> params.LoadParams:
    """``LoadParams`` of a LoadModel for model "m" with ``options`` and other ``fields``."""
    return params.load_params(backend_pb2.ModelOptions(Model="m", Options=list(options), **fields))


def gen_params(**changes) -> params.GenerationParams:
    """The generation parameters of an empty request, with ``changes``."""
    return dataclasses.replace(params.generation_params(backend_pb2.PredictOptions()), **changes)


# --------------------------------------------------------------------------- replies
def stream_text(stub, req, timeout: float | None = None) -> tuple[str, list]:
    """PredictStream ``req`` to the end: (the joined text, the replies)."""
    replies = list(stub.PredictStream(req, timeout=timeout))
    return "".join(r.message.decode("utf-8") for r in replies), replies


def joined_from(got: list[tuple], expected: list[tuple]) -> bool:
    """Whether ``got`` is ``expected`` with runs of consecutive items joined (fieldwise
    concatenation of tuples of strings or tuples): a stream whose reader lagged gets
    several steps' deltas in one reply (`engine.jobs.joined`). Expected items are
    non-empty."""
    rest = iter(expected)
    for item in got:
        acc: tuple | None = None
        while acc != item:
            nxt = next(rest, None)
            if nxt is None:
                return False
            acc = nxt if acc is None else tuple(a + b for a, b in zip(acc, nxt, strict=True))
    return next(rest, None) is None


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code ``call()`` ends with (streams: consume them inside ``call``)."""
    try:
        call()
    except grpc.RpcError as err:
        return err.code()
    return grpc.StatusCode.OK


def status(stub, timeout: float | None = None) -> dict[str, int]:
    """Status of a server (the call bounded by ``timeout`` seconds): ``state`` and every
    entry of the memory breakdown."""
    s = stub.Status(backend_pb2.HealthMessage(), timeout=timeout)
    return {"state": s.state, **s.memory.breakdown}


def counts(stub) -> tuple[int, int, int]:
    """(state, requests running, requests waiting) of Status."""
    s = status(stub)
    return s["state"], s["requests_running"], s["requests_waiting"]


def wait_idle(stub, timeout: float = 30.0, call_timeout: float | None = None) -> dict[str, int]:
    """Poll Status (each call bounded by ``call_timeout``) until the server is READY with
    nothing running or waiting and no KV held; return that Status."""

    def idle() -> dict[str, int] | None:
        s = status(stub, call_timeout)
        busy = s["requests_running"] or s["requests_waiting"] or s["kv_active"]
        return s if s["state"] == backend_pb2.StatusResponse.READY and not busy else None

    return wait_until(
        idle, timeout, explain=lambda: f"server never went idle: {status(stub, call_timeout)}"
    )


# --------------------------------------------------------------------------- waiting
def wait_until(
    predicate: Callable[[], T],
    timeout: float,
    interval: float = 0.05,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call ``predicate`` until it returns something truthy; return that value. Raises
    TimeoutError when ``timeout`` seconds pass first, with its last value and what
    ``explain()`` says (logs, a Status: read only then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            detail = f": {explain()}" if explain is not None else ""
            raise TimeoutError(f"not within {timeout:g} s (last value {value!r}){detail}")
        time.sleep(interval)


def never(predicate: Callable[[], object], seconds: float, interval: float = 0.05) -> bool:
    """Whether ``predicate`` stays falsy for ``seconds`` (it is asked until then)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return False
        time.sleep(interval)
    return not predicate()


def free_ports(n: int, consecutive: bool = False) -> list[int]:
    """``n`` ports free on loopback now; ``consecutive``: a range p .. p+n-1 (MLX's ring
    backend with ``mlx.launch -p p`` listens on each)."""
    for _ in range(100):
        if consecutive:
            base = random.randint(20000, 60000)
            ports = list(range(base, base + n))
        else:
            ports = random.sample(range(20000, 60000), n)
        socks = []
        try:
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return ports
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free ports")


# --------------------------------------------------------------------------- KV caches
def token_kv(
    tokens,
    n_layers: int = 2,
    cls=KVCache,
    *,
    heads: int = 1,
    dim: int = 4,
    dtype=mx.float32,
    **kwargs,
) -> list:
    """A real per-layer mlx-lm cache (``cls(**kwargs)``) whose key at position i is
    ``tokens[i] * 10 + layer`` (``heads`` x ``dim`` values of ``dtype`` per token), its
    value the key + 0.5."""
    kv = []
    for layer in range(n_layers):
        c = cls(**kwargs)
        if tokens:
            col = mx.array([t * 10 + layer for t in tokens], dtype=dtype)
            k = mx.broadcast_to(col[None, None, :, None], (1, heads, len(tokens), dim))
            c.update_and_fetch(k, k + 0.5)
        kv.append(c)
    return kv


def held(kv, layer: int = 0) -> list[int]:
    """Token ids recovered from the keys a ``token_kv`` layer currently exposes."""
    cache = kv[layer]  # (keys_and_values() is not in every mlx-lm: not on its main branch)
    keys = cache.keys[..., : min(cache.offset, cache.keys.shape[2]), :]
    return [(int(x) - layer) // 10 for x in keys[0, 0, :, 0].tolist()]


def greedy_ids(model, prompt_ids: list[int], n: int) -> tuple[list[int], list[int]]:
    """(the top 5 token ids after the prompt, ``n`` greedy tokens) of ``model`` alone,
    one forward pass per token with a KV cache."""
    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt_ids]), cache=cache)[0, -1]
    top5 = mx.argsort(-logits)[:5].tolist()
    out: list[int] = []
    for _ in range(n):
        token = int(mx.argmax(logits).item())
        out.append(token)
        if len(out) < n:
            logits = model(mx.array([[token]]), cache=cache)[0, -1]
    return top5, out


# --------------------------------------------------------------------------- shared by tiers
AUTH_TOKEN = "s3cret-token-0123456789"  # the bearer token the operations tests set
DISK_FP = "0123456789abcdef:" + "a" * 32  # a model fingerprint for the prompt disk tier


def file_names(directory: Path) -> list[str]:
    """The names in ``directory``, sorted."""
    return sorted(p.name for p in directory.iterdir())


def write_hostfile(directory: Path, ranks: int, name: str = "hosts.json") -> Path:
    """A LocalAI ring hostfile: a JSON array, entry i = rank i's "ip:port"."""
    path = directory / name
    path.write_text(json.dumps([f"127.0.0.1:{p}" for p in free_ports(ranks)]))
    return path


def param_bytes(model) -> tuple[int, int]:
    """(bytes, count) of a model's parameters."""
    flat = tree_flatten(model.parameters())
    return sum(v.nbytes for _, v in flat), len(flat)


def batch_tokens(model, prompts: list[list[int]], n: int = 24) -> dict[int, list[int]]:
    """Greedy tokens of ``prompts`` decoded together by mlx-lm's BatchGenerator
    (different prompt lengths: left padding, per-sequence rotary offsets)."""
    from mlx_lm.generate import BatchGenerator

    k = len(prompts)
    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=k, prefill_batch_size=k)
    uids = gen.insert(prompts, max_tokens=[n] * k)
    out: dict[int, list[int]] = {u: [] for u in uids}
    for _ in range(200):
        _, responses = gen.next()
        for r in responses:
            out[r.uid].append(r.token)
        if all(len(v) == n for v in out.values()):
            break
    gen.close()
    return {i: out[u] for i, u in enumerate(uids)}


GRAMMAR_FIELD = "PredictOptions.Grammar"  # how grammar errors name the request field
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},  # bounded so sampled runs finish
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name", "age"],
    "additionalProperties": False,
}
YES_NO = 'root ::= "yes" | "no"'
# A tool whose one argument is an enum: where a tool grammar masks a scripted token, the
# lowest allowed id wins (all other logits equal), and a raw text value would run to
# max_tokens (the scripted tool-call tests: tests/fast/test_call_formats.py and
# test_tool_calls_harmony.py).
PICK = {
    "type": "object",
    "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
    "required": ["unit"],
    "additionalProperties": False,
}
PICK_TOOLS = json.dumps([{"type": "function", "function": {"name": "pick", "parameters": PICK}}])


def grammar_matcher(tok, source: str):
    """llguidance's matcher of the Lark grammar ``source`` over ``tok``'s vocabulary (a
    TokenizerWrapper), as the engine builds it (``decoding.grammar.llg_tokenizer``)."""
    import llguidance

    from decoding import grammar

    m = llguidance.LLMatcher(
        grammar.llg_tokenizer(tok), llguidance.grammar_from("lark", source), log_level=0
    )
    assert not m.is_error(), m.get_error()
    return m


def grammar_accepts(tok, source: str, text: str, *, ends: bool = True) -> bool:
    """Whether the grammar takes `text` token by token (and, with `ends`, EOS after it)."""
    m = grammar_matcher(tok, source)
    ids = tok.encode(text, add_special_tokens=False)
    if m.validate_tokens(ids) != len(ids):
        return False
    m.consume_tokens(ids)
    return not ends or m.is_accepting()


def parse_constraint(text: str, metadata: dict[str, str]):
    """Read a request's constraint and validate it fully (bytes), as the prepare step does
    before queueing: ``read_constraint`` then ``compile_constraint``."""
    from decoding import grammar
    from parsing import constraint as reading

    c = reading.read_constraint(text, metadata)
    grammar.compile_constraint(c)
    return c


def gbnf_alternatives(n: int) -> str:
    """A GBNF grammar of ``n`` alternatives "w0" | "w1" | ..."""
    return "root ::= " + " | ".join(f'"w{i}"' for i in range(n))


def assert_one_clean_line(message: str) -> None:
    """``message`` is one line without a panic, backtrace or grammar dump."""
    assert "\n" not in message and "\r" not in message
    for junk in ("panicked", "backtrace", "stack backtrace", "<state>", "<grammar>", " | "):
        assert junk not in message.lower(), message


def request_ids(tokenizer, req: backend_pb2.PredictOptions) -> list[int]:
    """The prompt token ids the server computes for ``req`` (raw Prompt, or Messages
    through the chat template with the generation prompt)."""
    from prompting import render as prompt_mod

    if req.Prompt:
        return prompt_mod.encode(tokenizer, req.Prompt)
    messages = [{"role": m.role, "content": m.content} for m in req.Messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt_mod.encode(tokenizer, text)


def cold_greedy(loaded, ids: list[int], max_tokens: int) -> str:
    """mlx-lm's own greedy generation of ``ids``, cold, on a loaded model (``model``,
    ``tokenizer``); the text before EOS."""
    from mlx_lm.generate import generate_step

    tok, out = loaded.tokenizer, []
    steps = generate_step(
        mx.array(ids, dtype=mx.uint32),
        loaded.model,
        max_tokens=max_tokens,
        sampler=lambda x: mx.argmax(x, axis=-1),
        prompt_cache=make_prompt_cache(loaded.model),
    )
    for token, _ in steps:
        if int(token) in tok.eos_token_ids:
            break
        out.append(int(token))
    return tok.decode(out)


def served(tok, context: int | None = 64, options: tuple[str, ...] = (), **model):
    """A `LoadedModel` of ``tok`` around a stand-in model (attributes ``model``), loaded
    with ``options``, for the prepare step's tests (no MLX model is run)."""
    from types import SimpleNamespace

    from loading.loaded_model import LoadedModel, max_token_chars

    load = params.load_params(backend_pb2.ModelOptions(Model="toy", Options=list(options)))
    return LoadedModel(
        model=SimpleNamespace(**model),
        tokenizer=tok,
        params=load,
        draft=None,
        context_len=context,
        weights_bytes=1000,
        max_token_chars=max_token_chars(tok),
        cpu_mode="",
        blas=None,
        serial=7,
    )


def ids(tok, text: str) -> tuple[int, ...]:
    """``text``'s token ids (the tokenizer's own encode)."""
    return tuple(tok.encode(text))


# --------------------------------------------------------------------------- innocents
# Requests that run beside a hostile one and must keep their solo text (issues 12, 41):
# tests/process/test_isolation.py, tests/process/test_hostile_surfaces.py.
PROMPTS = ("The capital of France is", "Once upon a time, in a small village,", "def add(a, b):")
INNOCENT_TOKENS = 20
INNOCENT_TIMEOUT = 60.0  # seconds; a hang fails the test with DEADLINE_EXCEEDED


def references(stub, prompts: Iterable[str] = PROMPTS) -> dict[str, str]:
    """What each innocent request gives alone, one at a time."""
    refs = {
        p: stream_text(stub, greedy(p, INNOCENT_TOKENS, IgnoreEOS=True), INNOCENT_TIMEOUT)[0]
        for p in prompts
    }
    assert all(refs.values()), refs
    return refs


class Innocents:
    """Greedy streams in threads, each repeated until the block ends; all must match `refs`.

    Entering waits until every stream has produced its first reply, so the hostile
    request really overlaps with running generations.
    """

    def __init__(self, stub, refs: dict[str, str]) -> None:
        self.stub = stub
        self.refs = refs
        self.stop = threading.Event()
        self.started = [threading.Event() for _ in refs]
        self.outputs: dict[str, list[str]] = {p: [] for p in refs}
        self.errors: list[str] = []
        # Longest wait for the next reply of any stream, in seconds (first replies
        # included: a request queued behind a frozen engine waits there too).
        self.longest_gap = 0.0
        self.threads = [
            threading.Thread(target=self._run, args=(p, ev), daemon=True)
            for p, ev in zip(refs, self.started, strict=True)
        ]

    def _run(self, prompt: str, started: threading.Event) -> None:
        try:
            while True:
                text = ""
                last = time.monotonic()
                for reply in self.stub.PredictStream(
                    greedy(prompt, INNOCENT_TOKENS, IgnoreEOS=True), timeout=INNOCENT_TIMEOUT
                ):
                    now = time.monotonic()
                    if started.is_set():
                        self.longest_gap = max(self.longest_gap, now - last)
                    last = now
                    started.set()
                    text += reply.message.decode("utf-8")
                self.outputs[prompt].append(text)
                if self.stop.is_set():
                    return
        except grpc.RpcError as err:
            self.errors.append(f"{prompt!r}: {err.code().name} {err.details()}")
        finally:
            started.set()

    def __enter__(self) -> Innocents:
        for t in self.threads:
            t.start()
        for ev in self.started:
            assert ev.wait(INNOCENT_TIMEOUT), "an innocent stream never started"
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(INNOCENT_TIMEOUT * 2)
        if exc_type is None:
            self.check()

    def check(self) -> None:
        assert not self.errors, self.errors
        for prompt, outs in self.outputs.items():
            assert outs, f"innocent {prompt!r} never finished"
            for out in outs:
                assert out == self.refs[prompt], (prompt, out, self.refs[prompt])


def assert_refused(call, code, *needles: str, case: str = "") -> str:
    """Run `call()`, expect an RpcError with `code` whose details are one line, carry no
    traceback or panic text and contain each of `needles`; return the details."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    err = info.value
    details = err.details() or ""
    assert err.code() == code, (case, err.code(), details[:500])
    assert details and "\n" not in details.strip(), (case, details[:500])
    for bad in ("Traceback", "panicked", "backtrace", "RecursionError"):
        assert bad not in details, (case, details[:500])
    for needle in needles:
        assert needle.lower() in details.lower(), (case, details[:500])
    return details


def feed_output(hf, pipe, output: str, whole: bool) -> list:
    """Feed a model's ``output`` to the output pipeline ``pipe`` over the toy byte-level
    tokenizer ``hf`` (toy_tokenizer.build_hf): as one token (the whole text, a vocabulary
    entry) or byte by byte; finish it with "stop" and check that the streamed deltas add up
    to the pipeline's totals. Returns the streamed tool-call pieces."""
    from toy_tokenizer import byte_level

    from decoding.tool_calls import merge_tool_call_deltas

    if whole and output:
        tokens = [hf.get_vocab()[byte_level(output)]]
    else:
        tokens = list(output.encode("utf-8"))
    deltas = [pipe.feed(t) for t in tokens]
    deltas.append(pipe.finish("stop"))
    pieces = [p for d in deltas for p in d.tool_calls]
    assert merge_tool_call_deltas(pieces) == pipe.tool_calls
    assert "".join(d.content for d in deltas) == pipe.content
    assert "".join(d.reasoning for d in deltas) == pipe.reasoning
    return pieces


def joined_stream(replies) -> dict:
    """A PredictStream's chat deltas joined as LocalAI joins them (calls by index):
    {"calls": [(name, arguments decoded where they are JSON, else the text)], "content",
    "reasoning"}."""
    content, reasoning, args, names = "", "", {}, {}
    for r in replies:
        for d in r.chat_deltas:
            content += d.content
            reasoning += d.reasoning_content
            for c in d.tool_calls:
                names.setdefault(c.index, c.name)
                args[c.index] = args.get(c.index, "") + c.arguments
    calls = [(names[i], _json_or_text(args[i])) for i in sorted(names)]
    return {"calls": calls, "content": content, "reasoning": reasoning}


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text
