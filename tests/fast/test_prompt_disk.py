"""Tests for prompt_disk: the disk tier of the prompt cache, with real mlx-lm KV caches
filled with known values (``token_kv``; no model needed). The restart with the embedded
SmolLM2: tests/model/test_prompt_disk.py; a writer killed mid-write:
tests/process/test_prompt_disk.py.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import logging
import os
import threading
from pathlib import Path

import mlx.core as mx
import pytest
from helpers import DISK_FP, file_names, held
from helpers import token_kv as any_token_kv

from caches import prompt_disk
from caches.prompt_disk import DiskCache, model_fingerprint
from parsing.paths import safe_cache_dir

HEADS, DIM, LAYERS = 2, 8, 2
# Entries of known values: 2 heads of 8 float16 numbers per token in each of 2 layers.
token_kv = functools.partial(any_token_kv, n_layers=LAYERS, heads=HEADS, dim=DIM, dtype=mx.float16)


def entry_size(n_tokens):
    """Bytes of one file of ``token_kv`` with ``n_tokens`` tokens (as written)."""
    return n_tokens * HEADS * DIM * 2 * 2 * LAYERS  # keys+values, float16


def put_all(cache: DiskCache, *seqs):
    for s in seqs:
        assert cache.put(s, token_kv(s))
        assert cache.flush(30)


# --------------------------------------------------------------------------- matching
def test_prefix_trim_and_min_tokens(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2, 3], [5, 6, 7, 8, 9])
    hit = cache.lookup([1, 2, 3, 4])
    assert (hit.cached_len, hit.tokens, held(hit.kv)) == (3, (1, 2, 3), [1, 2, 3])
    assert [c.offset for c in hit.kv] == [3, 3]
    hit = cache.lookup([5, 6, 0])  # diverging: trimmable entry, common prefix 2
    assert (hit.cached_len, hit.tokens) == (2, (5, 6, 7, 8, 9))
    assert cache.lookup([5, 6, 0], min_tokens=3) is None
    assert cache.lookup([1, 2, 3]).cached_len == 2  # exact: one token left to feed
    assert cache.lookup([4]) is None and cache.lookup([]) is None
    # Storing the same tokens again writes nothing.
    assert not cache.put([1, 2, 3], token_kv([1, 2, 3]))
    with pytest.raises(ValueError, match="holds 3 tokens but 2"):
        cache.put([1, 2], token_kv([1, 2, 3]))
    cache.close()


def test_longer_trimmable_entry_replaces_its_prefixes(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2], [1, 2, 3, 4])
    assert len(cache) == 1 and len(file_names(tmp_path)) == 1
    assert cache.lookup([1, 2, 3, 4, 5]).tokens == (1, 2, 3, 4)
    cache.close()


# --------------------------------------------------------------------------- corruption
def _only_file(d: Path) -> Path:
    (path,) = d.glob("*.safetensors")
    return path


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_damaged_file_is_skipped_once_and_deleted(tmp_path, caplog, damage):
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2, 3, 4])
    cache.close()
    path = _only_file(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-20] ^= 0xFF  # tensor data: the header still parses
    else:
        data = data[: len(data) - 37]
    path.write_bytes(bytes(data))

    restarted = DiskCache(tmp_path, 1 << 20, DISK_FP)
    assert len(restarted) == 1  # the header alone looks fine
    with caplog.at_level(logging.WARNING, logger="localai.mlx.caches.prompt_disk"):
        assert restarted.lookup([1, 2, 3, 4, 5]) is None
        assert restarted.lookup([1, 2, 3, 4, 5]) is None
    warnings = [r for r in caplog.records if "checksum mismatch" in r.getMessage()]
    assert len(warnings) == 1 and "deleted" in warnings[0].getMessage()
    assert not path.exists() and len(restarted) == 0
    assert restarted.stats().corrupt == 1 and restarted.stats().misses == 2
    restarted.close()


def test_garbage_header_is_deleted_at_start(tmp_path, caplog):
    bad = tmp_path / f"{'0' * 32}-{'1' * 64}.safetensors"
    bad.write_bytes(b"\xff" * 100)
    other = tmp_path / "notes.txt"  # not ours: never touched
    other.write_text("keep me")
    with caplog.at_level(logging.WARNING, logger="localai.mlx.caches.prompt_disk"):
        cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    assert not bad.exists() and other.read_text() == "keep me"
    assert "unreadable header" in caplog.text and cache.stats().corrupt == 1
    cache.close()


def test_renamed_file_with_other_tokens_is_refused(tmp_path):
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2, 3])
    cache.close()
    path = _only_file(tmp_path)
    path.rename(tmp_path / f"{'f' * 32}-{path.name.split('-')[1]}")
    again = DiskCache(tmp_path, 1 << 20, DISK_FP)
    assert len(again) == 0 and file_names(tmp_path) == []
    again.close()


# --------------------------------------------------------------------------- fingerprints
def test_other_fingerprint_is_never_used_and_stale_ones_are_removed(tmp_path):
    a = DiskCache(tmp_path, 1 << 20, "1111111111111111:" + "a" * 32)
    put_all(a, [1, 2, 3])
    a.close()
    # Another model / settings (other lineage): kept for it, never used here.
    b = DiskCache(tmp_path, 1 << 20, "2222222222222222:" + "a" * 32)
    assert b.lookup([1, 2, 3, 4]) is None and len(b) == 0
    assert b.stats().entries == 1 and len(file_names(tmp_path)) == 1
    put_all(b, [1, 2, 3])
    b.close()
    assert len(file_names(tmp_path)) == 2
    # The same model path and settings with changed files: certainly stale.
    c = DiskCache(tmp_path, 1 << 20, "1111111111111111:" + "b" * 32)
    assert c.lookup([1, 2, 3, 4]) is None
    assert c.stats().entries == 1 and len(file_names(tmp_path)) == 1
    c.close()
    # b's entry is still b's.
    b2 = DiskCache(tmp_path, 1 << 20, "2222222222222222:" + "a" * 32)
    assert b2.lookup([1, 2, 3, 4]).cached_len == 3
    b2.close()


def test_format_versions(tmp_path, monkeypatch):
    for version in (0, 2):
        monkeypatch.setattr(prompt_disk, "FORMAT_VERSION", version)
        w = DiskCache(tmp_path, 1 << 20, DISK_FP)
        put_all(w, [version + 1, 9])
        w.close()
    monkeypatch.undo()
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    # Version 0 is older: removed. Version 2 is unknown (newer): kept, never used.
    assert len(cache) == 0 and cache.stats().entries == 1
    assert cache.lookup([3, 9, 9]) is None and cache.lookup([1, 9, 9]) is None
    cache.close()


def test_model_fingerprint(tmp_path):
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "tokenizer.json").write_text("{}")
    (model / "model.safetensors").write_bytes(os.urandom(3 << 20))
    fp = model_fingerprint(model, {"kv_bits": None})
    lineage, content = fp.split(":")
    assert (len(lineage), len(content)) == (16, 32)
    assert model_fingerprint(model, {"kv_bits": None}) == fp
    other_settings = model_fingerprint(model, {"kv_bits": 8})
    assert other_settings.split(":")[0] != lineage  # another lineage: not stale, foreign
    (model / "tokenizer.json").write_text('{"x": 1}')
    changed = model_fingerprint(model, {"kv_bits": None})
    assert changed.split(":")[0] == lineage and changed != fp  # same lineage: stale
    with (model / "model.safetensors").open("r+b") as f:
        f.write(b"\0" * 16)  # a new weights header
    assert model_fingerprint(model, {"kv_bits": None}) != changed
    assert model_fingerprint([model / "config.json"], {}) != fp
    with pytest.raises(ValueError, match=r"no config\.json"):
        model_fingerprint(tmp_path, {})
    with pytest.raises(ValueError, match="does not exist"):
        model_fingerprint(tmp_path / "nope", {})
    with pytest.raises(ValueError, match="JSON"):
        model_fingerprint(model, {"x": object()})


# --------------------------------------------------------------------------- failures
def test_unwritable_directory_serves_on(tmp_path, caplog):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.ERROR, logger="localai.mlx.caches.prompt_disk"):
        cache = DiskCache(blocker / "cache", 1 << 20, DISK_FP)  # root can't mkdir under a file
        assert not cache.put([1, 2], token_kv([1, 2]))
        assert cache.lookup([1, 2, 3]) is None
    assert not cache.stats().writable
    assert sum("no more entries will be written" in r.getMessage() for r in caplog.records) == 1
    cache.close()


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
def test_full_or_read_only_disk_stops_writing_once(tmp_path, caplog, monkeypatch, code):
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2, 3])

    def fail(fd, data):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(prompt_disk, "_write_all", fail)
    with caplog.at_level(logging.ERROR, logger="localai.mlx.caches.prompt_disk"):
        assert cache.put([7, 8], token_kv([7, 8]))
        assert cache.flush(30)
        assert not cache.put([9, 9], token_kv([9, 9]))  # writing has stopped
    st = cache.stats()
    assert (st.writable, st.write_errors, st.writes) == (False, 1, 1)
    assert os.strerror(code) in caplog.text
    assert sum("no more entries" in r.getMessage() for r in caplog.records) == 1
    assert len(file_names(tmp_path)) == 1  # the temporary file was removed
    assert cache.lookup([1, 2, 3, 4]).cached_len == 3  # reading goes on
    cache.close()


def test_read_only_cache_reads_and_never_writes(tmp_path):
    w = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(w, [1, 2, 3])
    w.close()
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    ro = DiskCache(tmp_path, 1 << 20, DISK_FP, read_only=True)
    assert not ro.put([4, 5], token_kv([4, 5]))
    assert ro.lookup([1, 2, 3, 4]).cached_len == 3
    path = _only_file(tmp_path)
    path.write_bytes(path.read_bytes()[:-8])
    ro2 = DiskCache(tmp_path, 1 << 20, DISK_FP, read_only=True)
    assert ro2.lookup([1, 2, 3, 4]) is None and path.exists()  # skipped, not deleted
    assert list(before) == file_names(tmp_path)
    ro.close()
    ro2.close()


def test_full_queue_drops_without_blocking(tmp_path, caplog, monkeypatch):
    gate = threading.Event()
    real = prompt_disk._write_all

    def slow(fd, data):
        gate.wait(30)
        real(fd, data)

    monkeypatch.setattr(prompt_disk, "_write_all", slow)
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP, queue_size=1)
    with caplog.at_level(logging.WARNING, logger="localai.mlx.caches.prompt_disk"):
        results = [cache.put([i, i + 1], token_kv([i, i + 1])) for i in range(1, 20, 2)]
    gate.set()
    assert cache.flush(30)
    st = cache.stats()
    assert results[0] and not all(results) and st.dropped == results.count(False)
    assert st.writes == results.count(True) and "write queue full" in caplog.text
    cache.close()


# --------------------------------------------------------------------------- budget
def test_lru_eviction_by_budget_survives_restart(tmp_path):
    a, b, c, d, e = ([i, i, i, i] for i in range(1, 6))
    probe = DiskCache(tmp_path / "probe", 1 << 20, DISK_FP)
    put_all(probe, a)
    size = probe.stats().nbytes  # every 4-token entry has this size
    probe.close()
    assert size > entry_size(4)  # tensor data plus the header
    budget = 3 * size + size // 2
    cache = DiskCache(tmp_path, budget, DISK_FP)
    put_all(cache, a, b, c)
    assert len(cache) == 3 and cache.stats().nbytes == 3 * size
    assert cache.lookup([*a, 0]) is not None  # a is now the most recently used
    put_all(cache, d)  # evicts b, the least recently used
    assert cache.lookup([*b, 0]) is None and cache.stats().evictions == 1
    cache.close()
    # The order survives a restart: c is now the oldest.
    again = DiskCache(tmp_path, budget, DISK_FP)
    assert again.stats().nbytes == 3 * size
    put_all(again, e)
    assert again.lookup([*c, 0]) is None
    assert all(again.lookup([*s, 0]) is not None for s in (a, d, e))
    assert again.stats().evictions == 1
    again.close()
    # A smaller budget at start-up evicts down to it; a zero budget stores nothing.
    small = DiskCache(tmp_path, size, DISK_FP)
    assert len(small) == 1 and small.stats().evictions == 2
    small.close()
    assert DiskCache(tmp_path, 0, DISK_FP).put(a, token_kv(a)) is False


# --------------------------------------------------------------------------- directory
def test_safe_cache_dir(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    assert safe_cache_dir(str(models / "cache" / "smol"), str(models)) == models / "cache/smol"
    assert safe_cache_dir("cache", str(models)) == models / "cache"
    for bad in (str(models / ".." / "elsewhere"), "/etc", str(models), "../x"):
        with pytest.raises(ValueError, match="not inside the models directory"):
            safe_cache_dir(bad, str(models))
    (models / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="not inside"):
        safe_cache_dir(str(models / "link" / "cache"), str(models))
    with pytest.raises(ValueError, match="PromptCachePath is empty"):
        safe_cache_dir("", str(models))
    with pytest.raises(ValueError, match="model directory is empty"):
        safe_cache_dir("cache", "")
    with pytest.raises(ValueError, match="max_bytes"):
        DiskCache(tmp_path, -1, DISK_FP)
    with pytest.raises(ValueError, match="fingerprint"):
        DiskCache(tmp_path, 1, "")


# --------------------------------------------------------------------------- hostile files
def _within(seconds: float, work):
    """``work()``'s result, run in a thread; fails when it has not returned in ``seconds``."""
    out: list = []
    t = threading.Thread(target=lambda: out.append(work()), daemon=True)
    t.start()
    t.join(seconds)
    return (not t.is_alive()), out


def _release(fifo: Path) -> None:
    """Unblock a reader stuck opening ``fifo`` (the state before the fix), so the test
    thread ends."""
    with contextlib.suppress(OSError):  # nobody is waiting on it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_or_directory_named_like_an_entry_never_blocks(tmp_path, caplog):
    # At the start-up scan: a FIFO and a directory with entries' names.
    fifo = tmp_path / f"{'0' * 32}-{'1' * 64}.safetensors"
    os.mkfifo(fifo)
    (tmp_path / f"{'2' * 32}-{'3' * 64}.safetensors").mkdir()
    try:
        with caplog.at_level(logging.WARNING):
            done, out = _within(10, lambda: DiskCache(tmp_path, 1 << 20, DISK_FP))
        assert done, "opening the cache blocked on a FIFO"
    finally:
        _release(fifo)
    (cache,) = out
    assert len(cache) == 0 and cache.stats().entries == 0
    assert caplog.text.count("not a regular file") == 2
    # The FIFO is not ours to delete (this cache never makes one); it is only skipped.
    assert fifo.exists()
    # At a lookup: an indexed entry's file replaced by a FIFO is a miss, and forgotten.
    put_all(cache, [1, 2, 3])
    (entry,) = [p for p in tmp_path.iterdir() if p.is_file()]
    entry.unlink()
    os.mkfifo(entry)
    try:
        done, out = _within(10, lambda: cache.lookup([1, 2, 3, 4]))
        assert done, "a lookup blocked on a FIFO"
    finally:
        _release(entry)
    assert out == [None] and len(cache) == 0
    assert cache.lookup([1, 2, 3, 4]) is None and cache.stats().misses == 2
    cache.close()


def test_a_read_that_outlasts_its_bound_is_a_miss_and_dropped(tmp_path, monkeypatch, caplog):
    # A file system that stalls (a hung network mount): the reader thread blocks on the
    # read; the lookup waits its bound and misses; while the read hangs, lookups miss at
    # once (no second wait); the late bytes are dropped, and the entry serves again after.
    cache = DiskCache(tmp_path, 1 << 20, DISK_FP)
    put_all(cache, [1, 2, 3])
    stall = threading.Event()
    real = prompt_disk.fmt.read_file

    def stalling(path):
        stall.wait(30)
        return real(path)

    monkeypatch.setattr(prompt_disk.fmt, "read_file", stalling)
    monkeypatch.setattr(prompt_disk, "_READ_WAIT_S", 0.3)
    assert prompt_disk.read_wait(0) == 0.3
    with caplog.at_level(logging.WARNING):
        done, out = _within(10, lambda: cache.lookup([1, 2, 3, 4]))
        assert done and out == [None]
        done, again = _within(0.25, lambda: cache.lookup([1, 2, 3, 4]))  # under the bound
        assert done and again == [None]
    assert "served as a miss" in caplog.text
    st = cache.stats()
    assert (st.hits, st.misses, st.late, st.loads) == (0, 2, 2, 0)
    stall.set()
    for _ in range(200):  # the stalled read ends; its bytes go nowhere
        if not cache._stuck():
            break
        threading.Event().wait(0.01)
    hit = cache.lookup([1, 2, 3, 4])
    assert (hit.cached_len, held(hit.kv)) == (3, [1, 2, 3])
    assert (cache.stats().hits, len(cache)) == (1, 1)
    cache.close()
