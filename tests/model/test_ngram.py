"""N-gram (prompt lookup) speculation inside the batch matches plain decoding exactly.

`batch.speculation.SpeculativeBatch` against plain decoding by mlx-lm's own
`BatchGenerator`. Real models: the embedded SmolLM2-135M (greedy
identity alone and in batches mixed with rows that do not draft, KV bookkeeping, stops
and max_tokens inside accepted drafts, rows joining and leaving, hole compaction, seeded
sampling, processors' histories), tiny random-weight models of other cache families, and
a tiny qwen2 for a frequency test of sampled output over many seeds.

Untimed (``timed=False``: every step with a draft verifies) unless a test says otherwise,
so that the verify path is what is exercised.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm.generate import BatchGenerator
from mlx_lm.models.cache import KVCache

import backend_pb2 as pb
from batch import speculation
from batch.speculation import DraftedModel, SpeculativeBatch
from decoding import sampling
from decoding.ngram_spec import NgramStats
from loading.model_loader import load_model
from params import generation_params
from seam import holes as seam_holes

PLANETS_LINE = "Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n"
PLANETS = PLANETS_LINE * 4 + "Mercury, Venus,"
COLOURS = "red, green, blue, red, green, blue, red, green, blue, red, green,"
NO_REPEAT = "Quick zebras jump; vexed fog whirls over pink cliffs."
N = 14  # tokens per sequence where a test compares with `reference` (shared, computed once)


class Run:
    """Speculative decoding (``width`` > 0: a `SpeculativeBatch` over ``model``) or the
    reference, plain decoding (``width`` 0: mlx-lm's own `BatchGenerator`)."""

    def __init__(self, model, width: int = 8, timed: bool = False, ngram_max: int = 3, eos=()):
        self.width = width
        if width:
            self.gen = SpeculativeBatch(
                model, eos=eos, max_rows=32, ngram_max=ngram_max, timed=timed
            )
        else:
            self.gen = BatchGenerator(
                model,
                completion_batch_size=32,
                prefill_batch_size=32,
                stop_tokens=[[t] for t in eos] or None,
            )
        self.out: dict[int, list[int]] = {}
        self.drafted: dict[int, list[bool]] = {}
        self.stats: dict[int, NgramStats] = {}
        self.finished: dict[int, tuple] = {}
        self.removed: set[int] = set()

    def add(self, ids, n, *, draft=True, sampler=None, processors=None, kv=None, ctx=None):
        if self.width:
            stats = NgramStats() if draft else None
            uid = self.gen.insert(
                [ids],
                max_tokens=n,
                cache=kv,
                tokens=ctx or [],
                sampler=sampler,
                processors=processors,
                draft=(self.width, stats) if draft else None,
            )
            if draft:
                self.stats[uid] = stats
        else:
            (uid,) = self.gen.insert(
                [ids],
                max_tokens=[n],
                caches=[kv] if kv is not None else None,
                all_tokens=[ctx] if ctx is not None else None,
                samplers=[sampler] if sampler is not None else None,
                logits_processors=[processors] if processors else None,
            )
        self.out[uid], self.drafted[uid] = [], []
        return uid

    def remove(self, uid: int) -> tuple:
        """Take ``uid`` out: (its KV, its tokens)."""
        self.removed.add(uid)
        return self.gen.remove([uid], return_prompt_caches=True)[uid]

    def step(self) -> bool:
        """One batch step; False once every row has finished or left."""
        _, responses = self.gen.next()
        for r in responses:
            self.out[r.uid].append(r.token)
            self.drafted[r.uid].append(getattr(r, "drafted", False))
            if r.finish_reason is not None:
                self.finished[r.uid] = (r.finish_reason, r.prompt_cache, r.all_tokens)
        return bool(set(self.out) - set(self.finished) - self.removed)

    def all(self) -> dict[int, list[int]]:
        while self.step():
            pass
        return self.out


def ids_of(tok, text: str) -> list[int]:
    return tok.encode(text)


_REFERENCES: dict = {}


def reference(model, ids, n, **kw) -> list[int]:
    """Plain decoding of ``ids`` alone: mlx-lm's BatchGenerator, no speculation (greedy
    results kept per module run, as they do not change)."""
    eos = kw.pop("eos", ())
    key = (id(model), tuple(ids), n, tuple(eos))
    memo = not kw
    if memo and key in _REFERENCES:
        return _REFERENCES[key]
    run = Run(model, width=0, eos=eos)
    uid = run.add(ids, n, **kw)
    out = run.all()[uid]
    if memo:
        _REFERENCES[key] = out
    return out


def chat(tok) -> list[int]:
    messages = [{"role": "user", "content": "List three colours, one per line."}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True))


# ---- greedy: token for token plain decoding ---------------------------------------


def test_greedy_identical_alone_and_in_a_mixed_batch(smol):
    model, tok = smol
    prompts = {"planets": ids_of(tok, PLANETS), "no_repeat": ids_of(tok, NO_REPEAT)}
    prompts["chat"] = chat(tok)
    n = N
    expected = {name: reference(model, ids, n) for name, ids in prompts.items()}
    run = Run(model)  # alone
    uid = run.add(prompts["planets"], n)
    assert run.all()[uid] == expected["planets"]
    assert sum(run.drafted[uid]) == run.stats[uid].accepted
    # The continuation repeats the lines: most tokens come from accepted drafts.
    assert run.stats[uid].accepted > n // 2
    assert run.stats[uid].verify_steps < n // 2
    # Together, with a row that never drafts (a plain request in the same batch).
    run = Run(model)
    uids = {name: run.add(ids, n) for name, ids in prompts.items()}
    plain_uid = run.add(ids_of(tok, COLOURS), n, draft=False)
    out = run.all()
    for name, uid in uids.items():
        assert out[uid] == expected[name], name
    assert out[plain_uid] == reference(model, ids_of(tok, COLOURS), n)
    assert not any(run.drafted[plain_uid])
    assert run.stats[uids["planets"]].accepted > n // 2


def test_timed_choice_keeps_the_output(smol):
    """With the cost model deciding (as in a single-process server), output is the same;
    also for a row whose processors ignore the history (IgnoreEOS and a LogitBias, which
    the verify pass applies to all positions at once)."""
    model, tok = smol
    n = N
    params = dataclasses.replace(
        generation_params(pb.PredictOptions()), ignore_eos=True, logit_bias={11: -1.5}
    )
    biased = sampling.make_logits_processors(params, tok)
    assert all(speculation.position_free(p) for p in biased)
    run = Run(model, timed=True)
    a, b = run.add(ids_of(tok, PLANETS), n), run.add(ids_of(tok, NO_REPEAT), n)
    c = run.add(ids_of(tok, PLANETS), n, processors=biased)
    out = run.all()
    assert out[a] == reference(model, ids_of(tok, PLANETS), n)
    assert out[b] == reference(model, ids_of(tok, NO_REPEAT), n)
    assert out[c] == reference(model, ids_of(tok, PLANETS), n, processors=biased)
    assert run.stats[c].accepted > 0


def test_max_tokens_and_stops_inside_accepted_drafts(smol):
    model, tok = smol
    ids = ids_of(tok, PLANETS)
    full = reference(model, ids, 12)
    newline = tok.encode("\n")[-1]
    for n in (1, 2, 3, 6, 11):
        run = Run(model, width=5)
        uid = run.add(ids, n)
        assert run.all()[uid] == full[:n]
        reason, kv, tokens = run.finished[uid]
        assert reason == "length"
        assert tokens == ids + full[:n]  # prompt + every emitted token, all fed
        assert all(c.offset == len(tokens) for c in kv)  # the KV holds exactly ``tokens``
    # The last of 6 tokens came from a draft: max_tokens cut a verify step short.
    run = Run(model, width=5)
    uid = run.add(ids, 6)
    run.all()
    assert run.drafted[uid][-1] is True
    # A stop token inside an accepted draft ends the row there, KV trimmed to it.
    run = Run(model, width=8, eos=[newline])
    uid = run.add(ids + full[:3], 40)
    out = run.all()[uid]
    assert out[-1] == newline and newline not in out[:-1]
    expected = reference(model, ids + full[:3], 40, eos=[newline])
    assert out == expected
    reason, kv, tokens = run.finished[uid]
    assert reason == "stop" and all(c.offset == len(tokens) for c in kv)
    assert tokens == ids + full[:3] + out
    assert run.drafted[uid][-1] is True  # the stop came out of an accepted draft


def test_a_row_leaving_mid_verify_hands_over_exactly_its_tokens(smol):
    model, tok = smol
    ids = ids_of(tok, PLANETS)
    run = Run(model, width=6)
    uid = run.add(ids, 50)
    other = run.add(ids_of(tok, NO_REPEAT), 50)
    while not (any(run.drafted[uid]) and len(run.out[uid]) >= 5):
        run.step()
    seen = list(run.out[uid])
    kv, tokens = run.remove(uid)
    assert all(c.offset == len(tokens) for c in kv)
    assert tokens[: len(ids)] == ids
    full = reference(model, ids, len(seen) + 4)
    assert seen == full[: len(seen)]
    # The handed-over KV continues correctly (as the prompt cache would use it).
    cont = Run(model, width=0)
    last = tokens[-1]
    for c in kv:
        c.trim(1)
    c_uid = cont.add([last], len(full) - len(tokens) + len(ids), kv=kv, ctx=tokens[:-1])
    assert (seen + cont.all()[c_uid])[: len(full)] == full
    # The row that stayed is unaffected.
    assert run.all()[other] == reference(model, ids_of(tok, NO_REPEAT), 50)


def test_rows_joining_a_batch_with_holes_and_compaction(smol, monkeypatch):
    model, tok = smol
    n = N
    texts = [ids_of(tok, t) for t in (PLANETS, NO_REPEAT, COLOURS)] + [chat(tok)]
    expected = [reference(model, t, n) for t in texts]
    for compact in (False, True):
        if compact:  # compact after every verify step that left a hole
            monkeypatch.setattr(seam_holes, "MIN_HOLES", 0)
            monkeypatch.setattr(seam_holes, "HOLE_FRACTION", 10**9)
        run = Run(model)
        uids = [run.add(t, n) for t in texts[:2]]
        holes = None
        for _ in range(12):
            run.step()
            for layer in run.gen._cache[:1]:  # the decoding rows' batch layers
                holes = holes or (layer.holes if any(layer.holes or ()) else None)
        uids.append(run.add(texts[2], n))  # joins a batch with holes
        for _ in range(5):
            run.step()
        uids.append(run.add(texts[3], n))
        out = run.all()
        assert [out[u] for u in uids] == expected, compact
        # Rows kept different numbers of draft tokens: holes, unless compacted at once.
        assert (holes is None) == compact, holes


def test_cached_prefix_is_searched(smol):
    model, tok = smol
    ids = ids_of(tok, PLANETS)
    cut = len(ids) - 3
    kv = [KVCache() for _ in model.layers]
    model(mx.array(ids[:cut])[None], cache=kv)
    run = Run(model)
    uid = run.add(ids[cut:], N, kv=kv, ctx=ids[:cut])
    assert run.all()[uid] == reference(model, ids, N)
    assert run.stats[uid].accepted > 0


def _recurrent_mask_honours_lengths() -> bool:
    """Whether this mlx-lm's batched recurrent cache masks a right-padded row's padding
    (0.32.2 does; the older `ArraysCache.make_mask` on mlx-lm's main branch ignores
    ``lengths`` once ``left_padding`` is set, and its own `BatchGenerator` then decodes
    a shorter row of a ragged prefill wrongly, as ours does)."""
    from mlx_lm.models.cache import ArraysCache

    cache = ArraysCache(1)
    cache.left_padding, cache.lengths = mx.array([0]), mx.array([1])
    mask = cache.make_mask(2)
    return mask is not None and not bool(mask[0, 1].item())


def test_other_cache_families_identical(model_root):
    """Families whose caches cannot drop entries per row (rotating, recurrent) stay in
    the batch without drafting; plain attention families verify drafts."""
    families = ["llama", "gemma3_text"]
    if _recurrent_mask_honours_lengths():
        families.append("mamba2")
    for family in families:
        model, tok = load_model(str(tiny_models.build(family, model_root)))
        prompts = [ids_of(tok, PLANETS), ids_of(tok, COLOURS)]
        run = Run(model)
        uids = [run.add(p, 24) for p in prompts]
        out = run.all()
        assert [out[u] for u in uids] == [reference(model, p, 24) for p in prompts], family
        verified = sum(run.stats[u].verify_steps for u in uids)
        if family == "llama":
            assert verified > 0
        else:
            assert verified == 0, family


def test_draft_model_drafts_in_the_batch(smol, model_root):
    """A draft model's greedy drafts, verified per row: the model as its own draft (almost
    every draft kept) and a random tiny llama with the same vocabulary (almost none)."""
    model, tok = smol
    n = N
    prompts = [chat(tok)]
    expected = [reference(model, p, n) for p in prompts]
    tiny_llama, _ = load_model(str(tiny_models.build("llama", model_root)))
    for draft, good in ((model, True), (tiny_llama, False)):
        run = Run(DraftedModel(model, draft), width=3)
        uids = [run.add(p, n) for p in prompts]
        plain_uid = run.add(ids_of(tok, COLOURS), n, draft=False)
        out = run.all()
        assert [out[u] for u in uids] == expected
        assert out[plain_uid] == reference(model, ids_of(tok, COLOURS), n)
        accepted = sum(run.stats[u].accepted for u in uids)
        drafted = sum(run.stats[u].drafted for u in uids)
        assert drafted > 0
        assert accepted > drafted * 0.8 if good else accepted < drafted * 0.5


# ---- sampling and processors --------------------------------------------------------


def test_seeded_sampling_same_tokens_alone_batched_and_plain(smol):
    model, tok = smol
    ids = ids_of(tok, PLANETS)

    def sampler():
        return sampling.SeededSampler(temperature=0.7, seed=1234, top_p=0.95, top_k=40)

    n = N
    expected = reference(model, ids, n, sampler=sampler())
    run = Run(model)
    uid = run.add(ids, n, sampler=sampler())
    assert run.all()[uid] == expected
    assert run.stats[uid].accepted > 0
    # Batched beside a greedy and another sampled row, the cost model choosing the steps.
    run = Run(model, timed=True)
    uid = run.add(ids, n, sampler=sampler())
    run.add(ids_of(tok, COLOURS), n)
    run.add(ids_of(tok, NO_REPEAT), n, sampler=sampling.SeededSampler(temperature=1.0, seed=7))
    assert run.all()[uid] == expected


class Recorder:
    """A logits processor that records every token history it is shown."""

    def __init__(self) -> None:
        self.calls: list[list[int]] = []

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        self.calls.append(tokens.reshape(-1).tolist())
        return logits


def test_processors_see_the_plain_decoding_histories(smol):
    model, tok = smol
    ids = ids_of(tok, PLANETS)
    n = N

    def processors(recorder):
        params = dataclasses.replace(
            generation_params(pb.PredictOptions()), repetition_penalty=1.05
        )
        return [recorder, *sampling.make_logits_processors(params, tok)]

    seen_plain, seen_spec = Recorder(), Recorder()
    expected = reference(model, ids, n, processors=processors(seen_plain))
    run = Run(model)
    uid = run.add(ids, n, processors=processors(seen_spec))
    run.add(ids_of(tok, NO_REPEAT), n)
    assert run.all()[uid] == expected
    assert run.stats[uid].accepted > 0
    # Same calls in the same order: each history is the previous one plus one token.
    assert seen_spec.calls == seen_plain.calls[: len(seen_spec.calls)]
    assert len(seen_spec.calls) in (n, n + 1)  # + the step that sampled the unused next


# ---- the sampled distribution -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny():
    """A random-weight qwen2 with a 16-token vocabulary (fast enough for many samples)."""
    from mlx.utils import tree_map
    from mlx_lm.models import qwen2

    config = dict(
        model_type="qwen2",
        hidden_size=32,
        num_hidden_layers=2,
        intermediate_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=16,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    mx.random.seed(3)
    model = qwen2.Model(qwen2.ModelArgs(**config))
    model.set_dtype(mx.float32)
    model.update(tree_map(lambda a: a * 3.0 if a.ndim == 2 else a, model.parameters()))
    mx.eval(model.parameters())
    return model


def _boost(ids):
    # Makes the drafted tokens likely (acceptance both frequent and far from certain).
    bias = mx.zeros((16,)).at[mx.array(ids)].add(2.5)

    def processor(_tokens, logits):
        return logits + bias

    return processor


def test_sampled_distribution_matches_plain_decoding(tiny):
    """Frequencies of 3-token continuations, plain vs speculative, over different seeds.

    Seeds differ between the two (so the runs are not trivially identical); the
    statistic is deterministic (fixed seeds). A chi-square two-sample test over the
    joint outcome of the second and third token. Each side runs its 300 sequences as
    rows of a few batches.
    """
    prompt = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2]
    runs, n, rows = 300, 3, 30
    joint_plain, joint_spec = Counter(), Counter()
    drafted = accepted = 0
    for start in range(0, runs, rows):
        for width, joint, offset in ((0, joint_plain, 0), (3, joint_spec, 10_000)):
            run = Run(tiny, width=width)
            uids = [
                run.add(
                    prompt,
                    n,
                    sampler=sampling.SeededSampler(1.0, seed=offset + i),
                    processors=[_boost([3, 4, 1])],
                )
                for i in range(start, start + rows)
            ]
            out = run.all()
            for u in uids:
                joint[tuple(out[u][1:])] += 1
            drafted += sum(s.drafted for s in run.stats.values())
            accepted += sum(s.accepted for s in run.stats.values())
    assert 0 < accepted < drafted  # drafts both kept and rejected
    outcomes = set(joint_plain) | set(joint_spec)
    # Pool rare outcomes so every cell has a reasonable expected count.
    common = [k for k in outcomes if joint_plain[k] + joint_spec[k] >= 10]
    cells = [(joint_plain[k], joint_spec[k]) for k in common]
    rare = (
        sum(joint_plain[k] for k in outcomes if k not in common),
        sum(joint_spec[k] for k in outcomes if k not in common),
    )
    if sum(rare):
        cells.append(rare)
    chi2 = sum((x - y) ** 2 / (x + y) for x, y in cells)  # equal sample sizes
    df = len(cells) - 1
    # Wilson-Hilferty approximation of the chi-square 0.999 quantile.
    z = 3.09
    critical = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    assert len(cells) >= 4  # enough distinct outcomes for the test to mean something
    assert chi2 < critical, (chi2, critical, cells)
