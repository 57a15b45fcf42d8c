"""`batch.decode.DecodeBatch` against mlx-lm's own `BatchGenerator` (0.32's, the steps it
replaces): driven alike (the same rows inserted at the same steps), both give the same
greedy tokens, the same prefill progress and segment ends, and finished rows hand over a
KV holding exactly their tokens. Rows join at different steps, one starts from a cached
prefix, one has segments, prefill chunks are small so that rows prefill over several
steps beside decoding rows. Models: the embedded SmolLM2-135M and a tiny random-weight
llama.
"""

from __future__ import annotations

import random

import mlx.core as mx
import pytest
import tiny_models
from mlx_lm.generate import BatchGenerator, generate_step
from mlx_lm.models.cache import make_prompt_cache

from batch.decode import DecodeBatch
from loading import model_loader


def _ids(n: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    return [rnd.randrange(100, 40000) for _ in range(n)]


def _prefix_cache(model, ids: list[int]) -> list:
    """A KV cache holding ``ids`` (prefilled alone, as a prompt-cache entry would be)."""
    kv = make_prompt_cache(model)
    model(mx.array([ids]), cache=kv)
    mx.eval([c.state for c in kv])
    return kv


# (step it joins at, segments, cached prefix length, max_tokens)
PLAN = [
    (0, [_ids(37, 1)], 0, 12),
    (0, [_ids(9, 2)], 0, 20),
    (2, [_ids(20, 3), _ids(15, 4), _ids(6, 5)], 0, 10),  # segments
    (3, [_ids(50, 6)], 24, 14),  # the first 24 tokens from a cached prefix
    (7, [_ids(3, 7)], 0, 5),
]


def _drive(model, eos: list[int], ours: bool, step_size: int):
    """Run PLAN; (tokens per row, prompt responses per step, finished (kv, tokens))."""
    if ours:
        gen = DecodeBatch(model, eos=eos, max_rows=8, prefill_step_size=step_size)
    else:
        gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in eos],
            completion_batch_size=8,
            prefill_batch_size=8,
            prefill_step_size=step_size,
        )
    order, out, prompts, finished = [], {}, [], {}
    step = 0
    while True:
        for at, segments, cached, n in PLAN:
            if at != step:
                continue
            flat = [t for s in segments for t in s]
            kv = _prefix_cache(model, flat[:cached]) if cached else None
            rest = [flat[cached:]] if cached else segments
            if ours:
                uid = gen.insert(rest, max_tokens=n, cache=kv, tokens=flat[:cached])
            else:
                (uid,) = gen.insert_segments(
                    [rest],
                    max_tokens=[n],
                    caches=[kv] if kv is not None else None,
                    all_tokens=[flat[:cached]],
                )
            order.append(uid)
            out[uid] = []
        pr, responses = gen.next()
        prompts.append([(r.uid, tuple(r.progress), r.end_of_segment, r.end_of_prompt) for r in pr])
        for r in responses:
            out[r.uid].append(r.token)
            if r.finish_reason is not None:
                finished[r.uid] = (r.finish_reason, r.prompt_cache, list(r.all_tokens))
        step += 1
        if step > max(at for at, *_ in PLAN) and not pr and not responses:
            break
    gen.close()
    return [out[u] for u in order], prompts, [finished[u] for u in order]


def _started_early(prompts: list[list[tuple]]) -> list[list[tuple]]:
    """mlx-lm's prompt responses per step as ours come: a row whose chunk ended its prompt
    (all but the last token) starts decoding in that step (`DecodeBatch._start_ready`),
    not the next, so its end-of-prompt response comes with that chunk's."""
    out = [list(step) for step in prompts]
    for i in range(1, len(out)):
        for entry in [e for e in out[i] if e[3]]:
            uid, (_, total) = entry[0], entry[1]
            if any(e[0] == uid and e[1][0] == total - 1 and e[2] for e in out[i - 1]):
                out[i].remove(entry)
                out[i - 1].append(entry)
    return out


def _trimmed(prompts: list[list[tuple]]) -> list[list[tuple]]:
    while prompts and not prompts[-1]:
        prompts = prompts[:-1]
    return prompts


@pytest.fixture(scope="module")
def tiny(model_root):
    model, _ = model_loader.load_model(str(tiny_models.build("llama", model_root)))
    return model


# SmolLM2 whole; the 8-token prefill chunks (every segment end, many steps) on the tiny llama.
@pytest.mark.parametrize(
    ("step_size", "which"), [(2048, "smol"), (2048, "tiny"), (8, "tiny")], ids=str
)
def test_same_greedy_tokens_and_progress_as_mlx_lm_batch_generator(which, step_size, request):
    model = (
        request.getfixturevalue("smol")[0] if which == "smol" else request.getfixturevalue(which)
    )
    eos = [] if which == "tiny" else [2]
    want_tokens, want_prompts, want_done = _drive(model, eos, False, step_size)
    got_tokens, got_prompts, got_done = _drive(model, eos, True, step_size)
    assert got_tokens == want_tokens
    assert _trimmed(got_prompts) == _trimmed(_started_early(want_prompts))
    for tokens, (reason, _, _), (*_, n) in zip(got_tokens, got_done, PLAN, strict=True):
        assert len(tokens) == n if reason == "length" else tokens[-1] in eos
    for (reason, kv, tokens), (w_reason, _, w_tokens) in zip(got_done, want_done, strict=True):
        assert (reason, tokens) == (w_reason, w_tokens)
        assert all(c.offset == len(tokens) for c in kv)
    # The segmented row stopped at each segment end (20, then 35), then at 40 - 1.
    seg_uid = 2
    ends = [p for step in got_prompts for (u, p, end, _) in step if u == seg_uid and end]
    assert [p[0] for p in ends] == [20, 35, 40, 41]
    assert ends[-1] == (41, 41)


def test_a_finished_rows_kv_continues_as_mlx_lm_solo_decoding(tiny):
    """The KV a finished row hands over holds exactly its tokens: decoding on from it
    alone gives what one long solo run gives."""
    prompt = _ids(30, 11)
    batch = DecodeBatch(tiny, max_rows=4)
    uid = batch.insert([prompt], max_tokens=6)
    batch.insert([_ids(17, 12)], max_tokens=9)
    done = None
    while done is None:
        _, responses = batch.next()
        done = next((r for r in responses if r.uid == uid and r.finish_reason), None)
    assert done.finish_reason == "length" and len(done.all_tokens) == 30 + 6
    solo = [int(t) for t, _ in generate_step(mx.array(prompt), tiny, max_tokens=10)]
    assert done.all_tokens[30:] == solo[:6]
    # The KV holds the prompt and all 6 tokens (the pipeline fed the 6th): trimmed to
    # drop the 6th, feeding it again continues the solo run.
    for c in done.prompt_cache:
        c.trim(1)
    more = generate_step(mx.array(solo[5:6]), tiny, max_tokens=4, prompt_cache=done.prompt_cache)
    assert [int(t) for t, _ in more] == solo[6:10]


def test_a_rows_first_token_comes_with_the_step_that_ends_its_prompt(tiny):
    """`_first_tokens`: the step whose chunk ends a row's prompt returns its first token
    (the same greedy token, never twice); a queued first token that ends its row (one
    token asked for) comes the usual way, with its finish, one step later; `pending`
    says a returned token was returned."""
    from batch.decode import pending

    batch = DecodeBatch(tiny, max_rows=4, prefill_step_size=16)
    running = batch.insert([_ids(12, 20)], max_tokens=30)  # decodes beside the others
    while not batch.next()[1]:
        pass
    prompt = _ids(40, 21)
    uid = batch.insert([prompt], max_tokens=5)
    one = batch.insert([_ids(10, 22)], max_tokens=1)
    got: dict[int, list] = {uid: [], one: []}
    ended_at, first_at, step = {}, {}, 0
    while len(got[uid]) < 5 or not got[one]:
        prompts, responses = batch.next()
        step += 1
        for p in prompts:
            if p.end_of_prompt:
                ended_at[p.uid] = step
        for r in responses:
            if r.uid in got:
                first_at.setdefault(r.uid, step)
                got[r.uid].append((r.token, r.finish_reason))
        if uid in first_at and step == first_at[uid]:
            token, _, returned = pending(batch, uid)
            assert (token, returned) == (got[uid][0][0], True)
    assert first_at[uid] == ended_at[uid]
    assert first_at[one] == ended_at[one] + 1 and got[one] == [(got[one][0][0], "length")]
    solo = [int(t) for t, _ in generate_step(mx.array(prompt), tiny, max_tokens=5)]
    assert [t for t, _ in got[uid]] == solo
    assert got[uid][-1][1] == "length" and running not in got
