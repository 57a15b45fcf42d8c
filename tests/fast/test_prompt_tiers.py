"""The prompt cache's disk tier without a server: load options and the request's
PromptCachePath, and TieredPromptCache falling back to disk and back-filling memory.
Restarted backend processes: tests/process/test_prompt_tiers.py.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from helpers import held, load_opts, token_kv

import backend_pb2
import params
from caches.prompt_tiers import TieredPromptCache
from prompt_cache import PromptCache


def test_load_options_and_request_path(tmp_path):
    models = tmp_path / "models"
    lp = load_opts(ModelPath=str(models))
    assert lp.prompt_cache_dir == "" and lp.prompt_cache_disk_bytes == 10 * 2**30
    lp = load_opts("prompt_cache_dir:kv", "prompt_cache_disk_bytes:2GiB", ModelPath=str(models))
    assert lp.prompt_cache_dir == str(models / "kv") and lp.prompt_cache_disk_bytes == 2 * 2**30
    with pytest.raises(ValueError, match="prompt_cache_disk_bytes"):
        load_opts("prompt_cache_disk_bytes:lots")

    def gen(load, path):
        return params.generation_params(backend_pb2.PredictOptions(PromptCachePath=path), load)

    plain = load_opts(ModelPath=str(models))
    assert gen(plain, "").prompt_cache_dir == ""
    assert gen(plain, str(models / "c")).prompt_cache_dir == str((models / "c").resolve())
    assert gen(plain, "rel/c").prompt_cache_dir == str((models / "rel/c").resolve())
    for bad in (str(tmp_path / "elsewhere"), str(models), "../x"):
        with pytest.raises(ValueError, match=r"PredictOptions\.PromptCachePath"):
            gen(plain, bad)
    with pytest.raises(ValueError, match="PromptCachePath"):  # no ModelPath to confine it to
        gen(load_opts(), "/tmp/c")
    # The load option wins; the request's path is then ignored (even one outside).
    opt = load_opts(f"prompt_cache_dir:{tmp_path / 'opt'}", ModelPath=str(models))
    assert gen(opt, str(tmp_path / "elsewhere")).prompt_cache_dir == str(tmp_path / "opt")
    assert gen(opt, "").prompt_cache_dir == str(tmp_path / "opt")


def test_tiered_cache_falls_back_to_disk_and_back_fills_memory(tmp_path):
    fp = "0123456789abcdef:" + "a" * 32
    tiers = TieredPromptCache(PromptCache(4), fp, 1 << 20)
    d = str(tmp_path / "d")
    toks = list(range(1, 41))
    tiers.insert("m", toks, token_kv(toks, heads=2, dim=8, dtype=mx.float16), d)
    tiers.insert(
        "m", [7, 7, 7], token_kv([7, 7, 7], heads=2, dim=8, dtype=mx.float16)
    )  # no directory: memory only
    assert tiers.flush(10)
    assert tiers.disk_memory()["prompt_cache_disk_entries"] == 1
    tiers.clear()  # as after a restart: memory empty, disk kept
    assert len(tiers) == 0
    hit = tiers.fetch("m", [*toks, 99], d)
    assert hit.disk_hit and hit.cached_tokens == 40 and hit.rest == [99]
    assert held(hit.kv) == toks
    assert len(tiers) == 1  # copied into memory
    again = tiers.fetch("m", [*toks, 99], d)  # now memory serves it
    assert not again.disk_hit and again.cached_tokens == 40
    tiers.close()
    other = TieredPromptCache(PromptCache(4), fp, 1 << 20)
    exact = other.fetch("m", toks, d)
    other.close()
    assert exact.disk_hit and exact.cached_tokens == 39 and held(exact.kv) == toks[:39]
    # Memory only without a directory, or with no fingerprint (disk tier off).
    fresh = TieredPromptCache(PromptCache(4), None, 1 << 20)
    assert fresh.fetch("m", [*toks, 99], d).cached_tokens == 0 and fresh.disk(d) is None
    assert not tiers.fetch("m", [1, 2, 3, 5], "").disk_hit


def test_a_directory_slow_to_open_is_not_waited_for(tmp_path, monkeypatch):
    # Opening a directory scans its entries' headers; on a stalled file system (stood in
    # for by a DiskCache that waits on an event) the engine waits at most _OPEN_WAIT_S,
    # serves from memory meanwhile, and uses the directory once it has opened.
    import threading
    import time

    from caches import prompt_tiers

    stall = threading.Event()
    real = prompt_tiers.DiskCache

    def stalled(*args, **kwargs):
        stall.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(prompt_tiers, "DiskCache", stalled)
    monkeypatch.setattr(prompt_tiers, "_OPEN_WAIT_S", 0.2)
    tiers = TieredPromptCache(PromptCache(4), "0123456789abcdef:" + "a" * 32, 1 << 20)
    d = str(tmp_path / "d")
    toks = [1, 2, 3, 4]
    kv = token_kv(toks, heads=2, dim=8, dtype=mx.float16)
    start = time.monotonic()
    tiers.insert("m", toks, kv, d)  # memory only: the directory is still opening
    assert tiers.fetch("m", [*toks, 5], d).cached_tokens == 4  # from memory
    assert time.monotonic() - start < 5  # two bounded waits, not the stall
    assert tiers.disk_memory()["prompt_cache_disk_entries"] == 0
    stall.set()
    for _ in range(500):
        if tiers.disk(d) is not None:
            break
        time.sleep(0.01)
    tiers.insert("m", [9, 9, 9], token_kv([9, 9, 9], heads=2, dim=8, dtype=mx.float16), d)
    assert tiers.flush(10) and tiers.disk_memory()["prompt_cache_disk_entries"] == 1
    tiers.close()


def test_a_session_memory_evicted_comes_back_from_disk_beside_the_shared_prefix(tmp_path):
    # Issue 38: two sessions on one system prompt. Memory keeps the prefix once; the
    # least recently used session's own turns are evicted from memory, and its next turn
    # is served from the disk tier (which holds every entry written), the hit going back
    # into memory as its own tokens only: the prefix there is not stored twice.
    fp = "0123456789abcdef:" + "a" * 32
    tiers = TieredPromptCache(PromptCache(None), fp, 1 << 20)
    d = str(tmp_path / "d")
    system = list(range(100, 130))
    a, b = [*system, *range(200, 210)], [*system, *range(300, 306)]

    def kv(toks):
        return token_kv(toks, heads=2, dim=8, dtype=mx.float16)

    per_token = 2 * 2 * 2 * 8 * 2  # layers x (keys, values) x heads x dim x float16
    tiers.insert("m", a, kv(a), d)
    tiers.insert("m", b, kv(b), d)
    assert tiers.flush(10) and tiers.disk_memory()["prompt_cache_disk_entries"] == 2
    assert tiers.nbytes == (30 + 10 + 6) * per_token
    assert tiers.fetch("m", [*b, 1], d).cached_tokens == len(b)  # b most recently used
    assert tiers.trim_to(max_bytes=(30 + 6) * per_token) == 1  # a's own 10 tokens go
    assert tiers.fetch("m", [*a, 1]).cached_tokens == 30  # memory alone: the prefix
    hit = tiers.fetch("m", [*a, 1], d)
    assert hit.disk_hit and hit.cached_tokens == len(a) and held(hit.kv) == a
    assert tiers.nbytes == (30 + 10 + 6) * per_token and len(tiers) == 2
    tiers.close()
