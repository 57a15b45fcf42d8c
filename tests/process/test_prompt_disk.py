"""prompt_disk: a writer process SIGKILLed in the middle of a write leaves no entry."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

from helpers import DISK_FP, ROOT, file_names, wait_until

from caches.prompt_disk import DiskCache

# --------------------------------------------------------------------------- crashes
CHILD = textwrap.dedent(
    """
    import os, sys, time
    sys.path[:0] = [{root!r}, {tests!r}]
    import mlx.core as mx
    from caches import prompt_disk
    from helpers import token_kv
    real = prompt_disk._write_all

    def half_then_hang(fd, data):
        real(fd, data[: len(data) // 2])
        open({marker!r}, "w").close()
        time.sleep(600)  # deliberate: hangs mid-write until the test kills it

    prompt_disk._write_all = half_then_hang
    cache = prompt_disk.DiskCache({dir!r}, 1 << 30, {fp!r})
    tokens = list(range(1, 400))
    cache.put(tokens, token_kv(tokens, heads=2, dim=8, dtype=mx.float16))
    time.sleep(600)  # deliberate: the writer thread hangs; the test kills this process
    """
)


def test_sigkill_in_the_middle_of_a_write_leaves_no_entry(tmp_path):
    cache_dir, marker = tmp_path / "cache", tmp_path / "half-written"
    script = CHILD.format(
        root=str(ROOT),
        tests=str(ROOT / "tests"),
        marker=str(marker),
        dir=str(cache_dir),
        fp=DISK_FP,
    )
    child = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        # Up to 60 s for the child to import MLX and write half (or to fail).
        wait_until(lambda: marker.exists() or child.poll() is not None, 60, interval=0.1)
        assert marker.exists(), "the child never started writing"
        (tmp,) = cache_dir.iterdir()
        assert tmp.name.startswith(".tmp-") and tmp.stat().st_size > 0
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    restarted = DiskCache(cache_dir, 1 << 30, DISK_FP)
    assert len(restarted) == 0 and restarted.lookup(list(range(1, 401))) is None
    assert file_names(cache_dir) == []  # the dead writer's temporary file is gone
    restarted.close()
