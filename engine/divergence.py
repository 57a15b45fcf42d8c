"""Where a prompt parted from the prompt cache, and why a request missed it.

For every request the scheduler starts (`Scheduler.start`, engine thread), before the
lookup, the cache's ``nearest`` finds the stored prompt sharing the most leading tokens
with it (memory tier; `prompt_cache.Nearest`) and what the entries evicted last shared.
After the lookup, `record` logs at DEBUG the token index where the prompt parts from that
stored prompt, with a few detokenized tokens either side (the prompt's and the stored
one's), and counts a miss by reason
(``localai_mlx_prompt_cache_miss_reasons_total{reason}``, `metrics.MISS_REASONS`).

A request *misses* when the cache served less than half of its prompt (``2 * cached <
prompt``), unless it served all but the last token, or the whole nearest stored prompt
(a prompt that extends a stored one with much new text missed nothing). The reason is
the first that holds:

- ``evicted``: an entry evicted to honour the cache's bounds shares at least half of the
  prompt, more than any stored one: raise max_cache_entries / max_cache_bytes /
  memory_budget, or add a disk tier (prompt_cache_dir).
- ``cold``: nothing is stored for this model (the first requests after a load).
- ``untrimmable``: a stored prompt shares more tokens than were reused, but its KV cannot
  be cut back to them (rotating or recurrent caches): set prompt_checkpoint_interval.
- ``diverged``: the nearest stored prompt parts early; the debug line shows where. A
  client that changes a few tokens near the start of every prompt (a nonce, a date) is
  fixed with load option volatile_spans.

Costs the scan of the stored entries that ``longest_common_prefix`` cost before (slice
comparisons in C) plus the evicted ones; the text is decoded only when DEBUG is on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from prompt_cache import CacheLookup, Nearest

log = logging.getLogger("localai.mlx." + __name__)

WINDOW = 6  # tokens shown either side of the divergence point
_TEXT_IDS = 1 << 64  # ids at or above are image key ids (engine/vision_prompt.py), not text


def miss_reason(near: Nearest, prompt_tokens: int, cached_tokens: int) -> str | None:
    """The reason a request whose prompt has ``prompt_tokens`` tokens, ``cached_tokens``
    of them served by the cache, missed it (module doc), or None for a hit."""
    served = cached_tokens
    if 2 * served >= prompt_tokens or served >= prompt_tokens - 1:
        return None
    if near.stored and near.common == len(near.stored) and served >= near.common:
        return None  # the prompt extends a stored one, which was reused whole
    if 2 * near.evicted >= prompt_tokens and near.evicted > max(near.common, served):
        return "evicted"
    if near.entries == 0:
        return "cold"
    if near.common > served:
        return "untrimmable"
    return "diverged"


def _text(tokenizer: Any, ids: Sequence[int]) -> str:
    parts: list[str] = []
    run: list[int] = []
    for t in ids:
        if t < _TEXT_IDS:
            run.append(int(t))
            continue
        if run:
            parts.append(str(tokenizer.decode(run)))
            run = []
        parts.append("<image>")
    if run:
        parts.append(str(tokenizer.decode(run)))
    return "".join(parts)


def window(tokenizer: Any, ids: Sequence[int], at: int) -> tuple[str, str]:
    """(text of the `WINDOW` tokens of ``ids`` before index ``at``, text of the `WINDOW`
    from it); image key ids read ``<image>``; ("?", "?") when the tokenizer fails."""
    try:
        return (
            _text(tokenizer, ids[max(0, at - WINDOW) : at]),
            _text(tokenizer, ids[at : at + WINDOW]),
        )
    except Exception:  # a tokenizer refusing odd ids must not fail the request
        return "?", "?"


def record(
    near: Nearest, ids: Sequence[int], lookup: CacheLookup, tokenizer: Any, metrics: Any
) -> str | None:
    """After the ``lookup`` of prompt ``ids`` (``near``: the cache's ``nearest`` before
    it): count a miss by reason (``metrics.cache_miss``) and log the divergence point at
    DEBUG. Returns the miss reason, None for a hit."""
    n, cached = len(ids), lookup.cached_tokens
    reason = miss_reason(near, n, cached)
    if reason is not None:
        metrics.cache_miss(reason)
    if log.isEnabledFor(logging.DEBUG):
        at = near.common
        before, after = window(tokenizer, ids, at)
        stored_after = window(tokenizer, near.stored, at)[1] if near.stored else ""
        log.debug(
            "prompt cache: %d of %d prompt tokens reused%s; the nearest of %d stored "
            "prompts parts at token %d: %r then %r (stored: %r); evicted ones share %d; %s",
            cached,
            n,
            " (disk)" if lookup.disk_hit else "",
            near.entries,
            at,
            before,
            after,
            stored_after,
            near.evicted,
            f"miss: {reason}" if reason else "hit",
        )
    return reason
