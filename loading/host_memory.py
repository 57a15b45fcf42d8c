"""The memory this process may use: one reader of physical memory and the cgroup limit.

Two budgets are shares of it, each with one name in logs and docs:

- ``memory_budget`` (engine/memory.py): what MLX may hold while serving; default on the CPU
  and CUDA 75% of `usable_memory` (on Metal the device's recommended working set instead);
- ``cpu_dequantize_budget`` (loading/cpu_fast_path.py): what float32 weights may take when
  ``cpu_dequantize`` is auto, and what a replacement model may take beside the loaded one
  (loading/loaded_model.py ``fits_beside``); default 50% of `usable_memory`.

Standard library only: run.sh's path imports it without MLX.
"""

from __future__ import annotations

import os
from pathlib import Path

# cgroup v2, then v1: the memory limit of the container the process runs in.
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
# cgroup v1 writes "no limit" as a number near 2**63; v2 writes "max".
UNLIMITED = 1 << 60


def physical_memory() -> int:
    """Bytes of physical memory of the machine."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cgroup_limit() -> int | None:
    """The cgroup's memory limit in bytes, or None when there is none."""
    for path in CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED:
            return int(text)
    return None


def usable_memory() -> int:
    """Physical memory, or the cgroup's limit when that is lower (bytes)."""
    limit = cgroup_limit()
    total = physical_memory()
    return total if limit is None else min(total, limit)
