"""prompt_disk with the embedded SmolLM2: an entry written by one DiskCache serves the
prompt and its follow-up after a restart exactly like a cold run."""

from __future__ import annotations

import mlx.core as mx
from helpers import DISK_FP
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import load_prompt_cache, make_prompt_cache

from caches.prompt_disk import DiskCache


def greedy_tokens(model, prompt, kv, n):
    steps = generate_step(
        mx.array(prompt, dtype=mx.uint32), model, prompt_cache=kv, sampler=lambda x: x.argmax(-1)
    )
    return [int(t) for t, _ in (next(steps) for _ in range(n))]


def test_restart_serves_the_prompt_and_its_follow_up_like_cold(smol, tmp_path):
    model, tok = smol
    messages = [
        {"role": "system", "content": "You are a careful assistant. " * 12},
        {"role": "user", "content": "List three facts about the river Thames."},
    ]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True)
    kv = make_prompt_cache(model)
    cold = greedy_tokens(model, prompt, kv, 12)
    seq = prompt + cold  # generate_step has already fed the last token it yielded
    assert kv[0].offset == len(seq)
    originals = [(c.keys[..., : c.offset, :], c.values[..., : c.offset, :]) for c in kv]

    first = DiskCache(tmp_path, 1 << 30, DISK_FP)
    assert first.put(seq, kv)
    assert first.flush(60)
    first.close()
    assert len(list(tmp_path.glob("*.safetensors"))) == 1
    # mlx-lm's own loader reads the file too, with our metadata.
    (path,) = tmp_path.glob("*.safetensors")
    _, meta = load_prompt_cache(str(path), return_metadata=True)
    assert meta["fingerprint"] == DISK_FP and meta["tokens"] == ",".join(map(str, seq))

    restarted = DiskCache(tmp_path, 1 << 30, DISK_FP)  # a new process would see the same
    assert len(restarted) == 1
    # The same prompt: the longer entry is trimmed to all but the last prompt token.
    hit = restarted.lookup(prompt)
    assert hit is not None and hit.tokens == tuple(seq) and hit.cached_len == len(prompt) - 1
    for c, orig in zip(hit.kv, originals, strict=True):  # bit-exact round trip
        assert c.keys.shape[2] == len(seq)  # only the tokens held, not the padded buffer
        assert all(
            mx.array_equal(a, b).item()
            for a, b in zip(
                (c.keys[..., : c.offset, :], c.values[..., : c.offset, :]), orig, strict=True
            )
        )
        assert c.trim(len(seq) - hit.cached_len) == len(seq) - hit.cached_len
    assert greedy_tokens(model, prompt[hit.cached_len :], hit.kv, 12) == cold

    # A follow-up turn: the stored sequence is a prefix, served whole.
    follow = seq + tok.encode("\nThanks! And one more?", add_special_tokens=False)
    hit = restarted.lookup(follow)
    assert hit is not None and hit.cached_len == len(seq)
    warm_tokens = greedy_tokens(model, follow[len(seq) :], hit.kv, 12)
    assert warm_tokens == greedy_tokens(model, follow, make_prompt_cache(model), 12)
    st = restarted.stats()
    assert (st.hits, st.misses, st.loads, st.corrupt) == (2, 0, 2, 0) and st.load_ms > 0
    assert restarted.lookup(tok.encode("Something else entirely")) is None
    assert restarted.stats().misses == 1
    restarted.close()
