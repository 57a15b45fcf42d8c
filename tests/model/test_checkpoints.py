"""Prefix reuse through prefill checkpoints, on every cache family (issue 14).

Tiny random-weight mlx-lm models with SmolLM2's tokenizer (tests/tiny_models.py: llama,
gemma3_text with a 32-token sliding window, gpt_oss, qwen3_5, lfm2, mamba2) are saved once
per session and loaded by the real LoadModel into the real engine and servicer on a gRPC
port (tests/inprocess.py). For each: greedy output equals mlx-lm's own ``generate_step``
cold, on an exact repeat, after a system-message checkpoint hit, and inside a batch of 4;
a second chat request sharing a long system message and a third raw prompt sharing a long
start prefill only their new part. Plus the prompt cache's checkpoint bookkeeping (kept
prefixes, bytes, eviction).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import mlx.core as mx
import pytest
import tiny_models
from helpers import chat_request, cold_greedy, greedy, request_ids, token_kv
from inprocess import InProcessServer
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import KVCache, make_prompt_cache
from mlx_lm.tokenizer_utils import load as load_tokenizer

import backend_pb2
import params
from parsing.tokens import common_prefix
from prompt_cache import PromptCache, kv_nbytes, needs_checkpoints
from prompting import render as prompt_mod

FAMILIES = list(tiny_models.CONFIGS)
MAX_TOKENS = 6
SYSTEM = (
    "You are a careful assistant for a hardware store. Answer questions about tools, "
    "fasteners, paint, lumber and garden supplies. Quote prices in euros, name the aisle, "
    "and suggest one related product. Never invent stock levels; when unsure, say that a "
    "colleague at the service desk can check. Keep answers under three sentences. "
) * 4  # about 220 tokens

RAW_START = (
    "Inventory log, store 17. Each line names an item, its aisle, its shelf and the count "
    "on hand at the start of the week, followed by notes from the morning shift. "
) * 3


def _load(srv: InProcessServer, path: Path, options: tuple[str, ...] = ()) -> None:
    res = srv.stub.LoadModel(backend_pb2.ModelOptions(Model=str(path), Options=list(options)))
    assert res.success, res.message


def _chat(system: str, user: str) -> backend_pb2.PredictOptions:
    return chat_request(user, system, Tokens=MAX_TOKENS, Temperature=0)


def _ids(srv: InProcessServer, req: backend_pb2.PredictOptions) -> list[int]:
    return request_ids(srv.engine.loaded.tokenizer, req)


def _reference(srv: InProcessServer, ids: list[int], max_tokens: int = MAX_TOKENS) -> str:
    """mlx-lm's own greedy generation, cold, on the served model (the engine is idle)."""
    return cold_greedy(srv.engine.loaded, ids, max_tokens)


def _predict(srv: InProcessServer, req) -> tuple[str, int]:
    """(text, prompt tokens prefilled by this request)."""
    reply = srv.stub.Predict(req)
    processed = srv.stub.GetMetrics(backend_pb2.MetricsRequest()).prompt_tokens_processed
    return reply.message.decode("utf-8"), processed


def _cache_info(srv: InProcessServer) -> dict:
    m = srv.stub.GetMetrics(backend_pb2.MetricsRequest())
    return json.loads(m.prompt_json_for_slot)["prompt_cache"]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_reuses_prefixes_with_unchanged_output(srv, model_root, family) -> None:
    _load(srv, tiny_models.build(family, model_root))
    checkpointing = srv.engine.scheduler.checkpointing
    assert checkpointing == (family != "llama")

    a = _chat(SYSTEM, "Where do I find wood glue?")
    b = _chat(SYSTEM, "How much is a box of 4 mm screws and which aisle?")
    ids_a, ids_b = _ids(srv, a), _ids(srv, b)
    ref_a, ref_b = _reference(srv, ids_a), _reference(srv, ids_b)

    # Cold, then an exact repeat (one token prefilled: the len-1 snapshot or a trim).
    assert _predict(srv, a) == (ref_a, len(ids_a))
    assert _predict(srv, a) == (ref_a, 1)
    # Same system message, another question: only the new part is prefilled.
    text, processed = _predict(srv, b)
    assert text == ref_b
    shared = common_prefix(ids_a, ids_b)
    assert shared > 200
    assert processed <= len(ids_b) - shared + 8, (processed, len(ids_b), shared)
    if checkpointing:
        info = _cache_info(srv)
        assert info["hits_checkpoint"] >= 1
        assert info["checkpoints"] >= 2 and info["checkpoint_bytes"] > 0
        status = srv.stub.Status(backend_pb2.HealthMessage())
        assert status.memory.breakdown["prompt_cache_checkpoints"] == info["checkpoint_bytes"]

    # Raw prompts sharing a long start: the second learns where they diverge, the third
    # reuses that snapshot.
    raws = [
        greedy(RAW_START + tail, MAX_TOKENS)
        for tail in ("Hammers: 12.", "Paint: 40 cans.", "Rope: 9.")
    ]
    raw_ids = [_ids(srv, r) for r in raws]
    raw_refs = [_reference(srv, i) for i in raw_ids]
    for req, ref in zip(raws, raw_refs, strict=True):
        assert _predict(srv, req)[0] == ref
    text, processed = _predict(srv, raws[2])  # an exact repeat of the third
    assert (text, processed) == (raw_refs[2], 1)
    c = greedy(RAW_START + "Nails: 3000.", MAX_TOKENS)
    ids_c = _ids(srv, c)
    text, processed = _predict(srv, c)
    assert text == _reference(srv, ids_c)
    shared = max(common_prefix(ids_c, i) for i in raw_ids)
    assert processed <= len(ids_c) - shared + 1, (processed, len(ids_c), shared)

    # A batch of 4 (new questions, so they prefill together and snapshot mid-batch).
    questions = ["Do you sell rakes?", "Is there blue paint?", "Any ladders?", "Where is rope?"]
    reqs = [_chat(SYSTEM, q) for q in questions]
    refs = [_reference(srv, _ids(srv, r)) for r in reqs]
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(lambda r: srv.stub.Predict(r).message.decode("utf-8"), reqs))
    assert texts == refs


def test_system_checkpoint_is_taken_inside_a_running_batch(srv, model_root) -> None:
    """A newcomer's snapshots are taken while another stream decodes; both outputs hold."""
    _load(srv, tiny_models.build("gemma3_text", model_root), ("max_batch_size:4",))
    long = backend_pb2.PredictOptions(Prompt="Count: one two three", Tokens=40, Temperature=0)
    ref_long = _reference(srv, _ids(srv, long), 40)
    first = _chat(SYSTEM + "Extra rule.", "Hi?")
    second = _chat(SYSTEM + "Extra rule.", "What is in aisle 3?")
    ids_1, ids_2 = _ids(srv, first), _ids(srv, second)
    ref_1, ref_2 = _reference(srv, ids_1), _reference(srv, ids_2)
    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(srv.stub.Predict, long)
        assert _predict(srv, first)[0] == ref_1
        assert running.result().message.decode("utf-8") == ref_long
    text, processed = _predict(srv, second)
    assert text == ref_2
    assert processed <= len(ids_2) - common_prefix(ids_1, ids_2) + 8


def test_prompt_checkpoint_interval(srv, model_root) -> None:
    """With the interval option, a raw prompt sharing only a start with an earlier one
    (and seen once) reuses the last interval snapshot before it diverges."""
    _load(srv, tiny_models.build("mamba2", model_root), ("prompt_checkpoint_interval:16",))
    first = greedy(RAW_START + "Saws: 4.", MAX_TOKENS)
    second = greedy(RAW_START + "Drills: 7.", MAX_TOKENS)
    ids_1, ids_2 = _ids(srv, first), _ids(srv, second)
    _predict(srv, first)
    text, processed = _predict(srv, second)
    assert text == _reference(srv, ids_2)
    shared = common_prefix(ids_1, ids_2)
    assert processed == len(ids_2) - (shared // 16) * 16


def test_chat_boundary_is_a_token_prefix() -> None:
    tok = load_tokenizer(tiny_models.tokenizer_dir())
    spec = params.parse_request(_chat(SYSTEM, "Hello?")).prompt
    prepared = prompt_mod.prepare_prompt(spec, tok, checkpoints=True)
    (pos,) = prepared.checkpoints
    system_only = tok.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=False)
    ids = prompt_mod.encode(tok, system_only)
    assert prepared.token_ids[:pos] == tuple(ids[:pos])
    assert len(ids) - 2 <= pos <= len(ids)
    assert prompt_mod.prepare_prompt(spec, tok).checkpoints == ()
    one_turn = params.parse_request(_chat("", "Hello?")).prompt  # no system: no boundary
    assert prompt_mod.prepare_prompt(one_turn, tok, checkpoints=True).checkpoints == ()


# ---------------------------------------------------------------- prompt cache bookkeeping
def _mamba_kv(model, n: int) -> list:
    kv = make_prompt_cache(model)
    model(mx.array([list(range(100, 100 + n))]), cache=kv)
    mx.eval([c.state for c in kv])
    return kv


def test_snapshots_are_kept_as_prefixes_counted_and_evicted(model_root) -> None:
    from loading.model_loader import load_model

    model, _ = load_model(str(tiny_models.build("mamba2", model_root)))
    assert needs_checkpoints(make_prompt_cache(model))
    assert not needs_checkpoints([KVCache(), KVCache()])
    toks = list(range(100, 140))
    snap, full = _mamba_kv(model, 20), _mamba_kv(model, 40)
    size = kv_nbytes(snap)
    cache = PromptCache(max_entries=10, max_bytes=3 * size)
    cache.insert("m", toks[:20], snap, checkpoint=True)
    cache.insert("m", toks, full)  # not trimmable: the snapshot prefix stays
    s = cache.stats()
    assert (s.entries, s.checkpoints, s.checkpoint_bytes) == (2, 1, size)
    assert cache.checkpoint_nbytes == size and cache.nbytes == size + kv_nbytes(full)

    hit = cache.fetch("m", [*toks[:20], 7, 8])
    assert (hit.kind, hit.cached_tokens, hit.rest) == ("checkpoint", 20, [7, 8])
    exact = cache.fetch("m", toks)  # an SSM state cannot be trimmed by one: snapshot hit
    assert (exact.kind, exact.cached_tokens) == ("checkpoint", 20)
    assert cache.longest_common_prefix("m", [*toks[:33], 1]) == 33
    assert cache.longest_common_prefix("other", toks) == 0

    # Bytes: two more snapshots push out the least recently used (the full entry).
    cache.insert("m", [5, *toks[:19]], _mamba_kv(model, 20), checkpoint=True)
    cache.insert("m", [6, *toks[:19]], _mamba_kv(model, 20), checkpoint=True)
    s = cache.stats()
    assert s.evictions == 1 and s.entries == 3 and s.checkpoints == 3
    assert s.nbytes == s.checkpoint_bytes == 3 * size <= cache.stats().max_bytes
    assert s.hits_checkpoint == 2 and s.hits == 2

    # A snapshot whose state does not hold its tokens is refused, never stored.
    with pytest.raises(ValueError):
        cache.insert("m", [1, 2], token_kv([1, 2, 3], n_layers=1), checkpoint=True)


def test_rotating_rows_with_nkeep_take_checkpoints_too(srv, model_root) -> None:
    """A rotating cache with NKeep (batch rows of `caches.batch_kv`, solo before): its
    system-boundary snapshot serves the next prompt with the same system message."""
    from mlx_lm.models.cache import RotatingKVCache

    _load(srv, tiny_models.build("llama", model_root), ("max_kv_size:128",))
    assert srv.engine.scheduler.wants_boundaries  # solo rotating caches past their window
    a, b = _chat(SYSTEM, "Hi?"), _chat(SYSTEM, "Where are the ladders?")
    for req in (a, b):
        req.NKeep = 4
    ids_a, ids_b = _ids(srv, a), _ids(srv, b)
    model = srv.engine.loaded.model

    def reference(ids):
        kv = [RotatingKVCache(max_size=128, keep=4) for _ in model.layers]
        out = []
        for token, _ in generate_step(
            mx.array(ids, dtype=mx.uint32),
            model,
            max_tokens=MAX_TOKENS,
            sampler=lambda x: mx.argmax(x, axis=-1),
            prompt_cache=kv,
        ):
            if int(token) in srv.engine.loaded.tokenizer.eos_token_ids:
                break
            out.append(int(token))
        return srv.engine.loaded.tokenizer.decode(out)

    ref_a, ref_b = reference(ids_a), reference(ids_b)
    assert _predict(srv, a) == (ref_a, len(ids_a))
    text, processed = _predict(srv, b)
    assert text == ref_b
    assert processed <= len(ids_b) - common_prefix(ids_a, ids_b) + 8
    assert _predict(srv, b) == (ref_b, 1)


def test_score_honours_stable_prefix_len(model_root) -> None:
    """Score's stable_prefix_len: a snapshot where the stable characters end serves the
    next prompt sharing only them; the log-probs equal those computed without a cache."""
    from loading.model_loader import load_model
    from tasks import scoring

    model, tok = load_model(str(tiny_models.build("mamba2", model_root)))
    cache = PromptCache(max_entries=10)
    stable = RAW_START
    prompts = [stable + "Today: hammers.", stable + "Tomorrow: paint and rope."]
    cands = [" Aisle 4.", " Sold out."]
    for i, p in enumerate(prompts):
        got = scoring.score(
            model, tok, p, cands, cache=cache, model_key="m", stable_prefix_len=len(stable)
        )
        want = scoring.score(model, tok, p, cands)
        assert [r.log_prob for r in got] == pytest.approx([r.log_prob for r in want], abs=1e-4)
        s = cache.stats()
        assert s.hits_checkpoint == i and s.checkpoints == 1
    stable_ids = prompt_mod.encode(tok, stable)
    (snap,) = [t for _, t, _ in cache._snapshot() if len(t) < len(stable_ids) + 2]
    assert len(stable_ids) - 2 <= len(snap) <= len(stable_ids)
