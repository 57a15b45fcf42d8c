"""Batch-wide logits processors (`batch.logits`) against the same processors called
one row at a time (the per-row step `batch.decode.DecodeBatch._forward` took before issue
30, kept here as `PerRow`); the penalties against mlx-lm's own `make_*_penalty`, which
need no model: tests/fast/test_batch_logits.py.

Levels: the processed logits of one step for many kinds of rows (exactly equal, in
float32, bfloat16 and float16); whole runs on the embedded SmolLM2 and a tiny llama
(greedy plain, biased, penalized, grammar, seeded rows joining and leaving at different
steps: the same tokens); and speculation (`SpeculativeBatch`, whose plain steps are
`_forward`'s) against plain per-row decoding.
"""

from __future__ import annotations

import json
import random
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
import tiny_models
from mlx_lm.models.cache import TokenBuffer

from batch.decode import DecodeBatch, Row, lean
from batch.logits import BatchLogits, split
from batch.speculation import SpeculativeBatch
from decoding import grammar, sampling
from decoding.grammar import make_constraint_processor
from decoding.ngram_spec import NgramStats
from decoding.sampling import GREEDY, LogitBias, Penalty, SeededSampler
from loading import model_loader
from parsing.constraint import Constraint

SCHEMA = Constraint(
    "json_schema",
    json.dumps(
        {
            "type": "object",
            "properties": {"name": {"type": "string"}, "n": {"type": "integer"}},
            "required": ["name", "n"],
        }
    ),
    "PredictOptions.JSONSchema",
)
EOS = [2]


class PerRow(DecodeBatch):
    """The step before issue 30: every row's processors one by one on its own slice, a
    log-softmax over the batch, then the samplers."""

    def _forward(self, rows, cache, inputs):
        logits = self.model(inputs[:, None], cache=cache)[:, -1, :]
        if lean(rows):
            sampled = mx.argmax(logits, axis=-1)
            mx.async_eval(sampled)
            return sampled, [None] * len(rows)
        contexts = []
        if any(r.processors for r in rows):
            processed = []
            for e, r in enumerate(rows):
                row = logits[e : e + 1]
                if r.processors:
                    context = r.history(inputs[e : e + 1])
                    contexts.append(context)
                    for processor in r.processors:
                        row = processor(context, row)
                processed.append(row)
            logits = mx.concatenate(processed, axis=0)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        samplers = [r.sampler for r in rows]
        if all(s is samplers[0] for s in samplers):
            sampled = samplers[0](logprobs)
        else:
            sampled = mx.concatenate(
                [s(logprobs[e : e + 1]) for e, s in enumerate(samplers)], axis=0
            )
        per_row = [logprobs[e] if r.logprobs else None for e, r in enumerate(rows)]
        mx.async_eval(sampled, [x for x in per_row if x is not None], contexts)
        return sampled, per_row


def _ids(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 40000) for _ in range(n)]


def _unknown(tokens: mx.array, logits: mx.array) -> mx.array:
    """A plain callable: the per-row path (it reads the history)."""
    return logits - 0.01 * (tokens.reshape(-1)[-1:] % 7).astype(logits.dtype)


# -- one step, many kinds of rows ---------------------------------------------------------


def _kinds(tok) -> list[list]:
    """Fresh processors for a row of each kind (index = kind)."""
    eos_ban = LogitBias(dict.fromkeys(EOS, -mx.inf))
    return [
        [],
        [LogitBias({5: 2.5, 77: -1.0, 300: 0.75})],
        [LogitBias({5: 1.0, 2: 3.0}), eos_ban],
        [Penalty("repetition", 1.3, 5)],  # window longer than a short history
        [Penalty("repetition", 1.1, 20), Penalty("presence", 0.5, 20)],
        [Penalty("presence", 0.7, 8), Penalty("frequency", 0.4, 8)],
        [LogitBias({9: 1.0}), Penalty("frequency", 0.3, 3)],
        [make_constraint_processor(SCHEMA, tok)],
        [
            LogitBias({11: 0.5}),
            Penalty("repetition", 1.2, 6),
            make_constraint_processor(SCHEMA, tok),
        ],
        [_unknown],
        [LogitBias({13: 1.0}), _unknown],  # batched bias, then a per-row suffix
        [_unknown, LogitBias({13: 1.0})],  # out of order: all per row
        [Penalty("presence", 0.2, 0)],  # window 0: the whole history, per row
        [Penalty("frequency", 0.5, 4), LogitBias({3: 1.0})],  # out of order: bias per row
    ]


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_one_step_equals_the_processors_row_by_row(smol, dtype):
    """Rows of every kind, with histories shorter and longer than their windows and
    repeated tokens, over several steps: batch-wide logits == each row's processors
    called one by one (mlx-lm's penalties included) on the same context."""
    tok = smol[1]
    vocab = 49152
    rnd = np.random.default_rng(0)
    batched, alone = _kinds(tok), _kinds(tok)
    rows = []
    for k, procs in enumerate(batched):
        n = 2 if k == 3 else 30 + k
        history = [int(t) for t in rnd.integers(0, 60, size=n)]  # many repeats
        rows.append(Row(k, [], [], history, 100, GREEDY, tuple(procs), True, False, 0))
    contexts = [TokenBuffer(r.tokens) for r in rows]
    state = BatchLogits(rows)
    inputs = [int(t) for t in rnd.integers(0, 60, size=len(rows))]
    for step in range(8):
        logits = mx.array(rnd.normal(size=(len(rows), vocab)) * 4).astype(dtype)
        if step > 0:
            assert state.matches(rows)
        got, _ = state.apply(logits, mx.array(inputs))
        for e, procs in enumerate(alone):
            want = logits[e : e + 1]
            context = contexts[e].update_and_fetch(mx.array(inputs[e : e + 1]))
            for p in procs:
                want = p(context, want)
            assert got.dtype == want.dtype
            assert np.array_equal(
                np.array(got[e].astype(mx.float32)), np.array(want[0].astype(mx.float32))
            ), (step, e)
        for r, t in zip(rows, inputs, strict=True):
            r.tokens.append(t)
        # The grammar rows go on with an allowed token (their most likely one).
        nxt = [int(t) for t in rnd.integers(0, 60, size=len(rows))]
        nxt[7] = int(mx.argmax(got[7]))
        nxt[8] = int(mx.argmax(got[8]))
        inputs = nxt
    assert grammar.failure_of(batched[7]) is None and grammar.failure_of(batched[8]) is None
    assert grammar.failure_of(batched[7]) == grammar.failure_of(alone[7])


# -- whole runs --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny(model_root):
    model, _ = model_loader.load_model(str(tiny_models.build("llama", model_root)))
    return model


# (joins at step, prompt seed, prompt length, max_tokens, kind of processors, seed or None)
PLAN = [
    (0, 1, 23, 24, 0, None),
    (0, 2, 9, 30, 1, None),
    (0, 3, 40, 18, 4, None),
    (1, 4, 12, 26, 7, None),
    (1, 5, 17, 12, 2, 7),
    (3, 6, 31, 20, 5, None),
    (3, 7, 8, 22, 8, None),
    (5, 8, 15, 9, 10, None),
    (6, 9, 26, 16, 3, 11),
    (6, 10, 19, 25, 6, None),
    (9, 11, 14, 14, 11, None),
    (12, 12, 20, 10, 13, 5),
]


def _run(batch: DecodeBatch, tok, plan=PLAN, prompt=_ids, **insert) -> dict[int, tuple]:
    """Drive ``plan``: {plan index: (tokens, finish reason)}."""
    out, finish, uid_of = {}, {}, {}
    step = 0
    while True:
        for i, (at, seed, n, max_tokens, kind, sample) in enumerate(plan):
            if at == step:
                sampler = SeededSampler(0.9, sample, top_p=0.9, min_p=0.02) if sample else None
                uid_of[
                    batch.insert(
                        [prompt(n, seed)],
                        max_tokens=max_tokens,
                        sampler=sampler,
                        processors=_kinds(tok)[kind],
                        logprobs=i % 4 == 1,
                        **insert,
                    )
                ] = i
                out[uid_of[max(uid_of)]] = []
        _, generated = batch.next()
        for g in generated:
            out[g.uid].append(g.token)
            if g.finish_reason:
                finish[g.uid] = g.finish_reason
        step += 1
        if step > max(p[0] for p in plan) and not len(batch):
            break
    batch.close()
    return {uid_of[u]: (out[u], finish[u]) for u in out}


def test_mixed_rows_joining_and_leaving_same_tokens_as_per_row(tiny, smol):
    # The tiny llama: the same rows and processors as on SmolLM2 (whose one step is
    # compared above) at a tenth of the decode time.
    model, tok, plan = tiny, smol[1], PLAN
    want = _run(PerRow(model, eos=EOS, max_rows=8), tok, plan)
    got = _run(DecodeBatch(model, eos=EOS, max_rows=8), tok, plan)
    assert got == want
    assert len(want) == len(PLAN)
    # The biased rows' EOS ban held (kind 2), the grammar rows produced JSON text.
    assert EOS[0] not in want[4][0]


def test_speculation_with_processors_same_tokens_as_plain_per_row(smol):
    """`SpeculativeBatch` (verify steps per row, plain steps batch-wide) gives the tokens
    of plain per-row decoding, with prompts that repeat so that drafts are accepted."""
    model, tok = smol
    line = tok.encode("Mercury, Venus, Earth, Mars, Jupiter, Saturn, Uranus, Neptune\n")
    plan = [
        (0, 1, 0, 16, 1, None),
        (0, 2, 0, 16, 4, None),
        (0, 3, 0, 12, 8, None),
        (2, 4, 0, 12, 2, 3),
        (4, 5, 0, 14, 10, None),
    ]
    prompts = {i: line * 3 + line[: 2 + i] for i in range(1, 6)}
    want = _run(PerRow(model, eos=EOS, max_rows=8), tok, plan, lambda _, s: prompts[s])
    spec = SpeculativeBatch(model, eos=EOS, max_rows=8, ngram_max=3, timed=False)
    stats = NgramStats()
    got = _run(spec, tok, plan, lambda _, s: prompts[s], draft=(4, stats))
    assert got == want
    assert stats.accepted > 0  # speculation did keep drafts


def test_make_logits_processors_builds_the_batch_kinds(smol):
    tok = smol[1]
    procs = sampling.make_logits_processors(
        SimpleNamespace(
            logit_bias={5: 1.0},
            ignore_eos=True,
            repetition_context_size=16,
            repetition_penalty=1.1,
            presence_penalty=0.5,
            frequency_penalty=0.2,
            constraint=SCHEMA,
            grammar_scope="after_reasoning",
            grammar_triggers=(),
        ),
        tok,
    )
    assert split(procs) == (tuple(procs), ())
    assert [type(p).__name__ for p in procs] == [
        "LogitBias",
        "LogitBias",
        "Penalty",
        "Penalty",
        "Penalty",
        "ConstraintProcessor",
    ]
