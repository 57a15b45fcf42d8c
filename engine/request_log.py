"""The end of a request, told: its log line, its Prometheus series and GetMetrics' figures;
and the bound on what requests make the log say (`RepeatFilter`).

`finished` runs once per request, when the scheduler ends it (engine thread).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from decoding.finish import FinishReason
from engine.metrics import Recorder
from engine.sequence import Sequence

logger = logging.getLogger("localai.mlx.engine.scheduler")  # the per-request line's logger


@dataclass(frozen=True)
class RequestMetrics:
    """Metrics of the last finished request, for GetMetrics."""

    tokens_per_second: float = 0.0
    tokens_generated: int = 0
    prompt_tokens_processed: int = 0
    draft_tokens_accepted: int = 0


def finish_label(outcome: FinishReason | str) -> FinishReason | None:
    """The finish reason ``outcome`` counts as in the metrics: itself; CANCELLED for the
    error status CANCELLED (cancelled before it started); None (an error) otherwise."""
    if isinstance(outcome, FinishReason):
        return outcome
    return FinishReason.CANCELLED if outcome == "CANCELLED" else None


def finished(
    job: Sequence,
    outcome: FinishReason | str,
    metrics: Recorder,
    on_metrics: Callable[[RequestMetrics], None],
) -> None:
    """Log ``job``'s line, record its series in ``metrics`` and hand its figures to
    ``on_metrics`` (when it generated any). ``outcome``: its finish reason or error status."""
    now = time.perf_counter()
    _, gen_ms = job.timings(now)
    tps = (job.tokens - 1) / (gen_ms / 1000.0) if gen_ms > 0 and job.tokens > 1 else 0.0
    ttft = ((job.t_first or now) - job.submitted) * 1000.0
    if job.tokens:
        on_metrics(
            RequestMetrics(tps, job.tokens, job.prompt_tokens - job.cached_tokens, job.drafted)
        )
    runner = job.runner
    drafting = runner is not None and runner.drafts
    metrics.request_finished(
        now - job.submitted,
        finish_label(outcome),
        job.prompt_tokens,
        job.cached_tokens,
        "disk" if job.disk_hit else "memory",
        job.tokens,
    )
    if drafting and runner is not None:
        metrics.speculation(runner.proposed(job), job.drafted)
    logger.info(
        "request %s: prompt=%d cached=%d generated=%d ttft=%.1fms tok/s=%.1f finish=%s%s%s",
        job.params.correlation_id or "-",
        job.prompt_tokens,
        job.cached_tokens,
        job.tokens,
        ttft,
        tps,
        outcome,
        f" drafted={job.drafted}" if drafting else "",
        " disk_hit=1" if job.disk_hit else "",
    )


REPEAT_WINDOW_S = 60.0  # a warning repeated within this many seconds is counted, not logged


class RepeatFilter(logging.Filter):
    """A handler filter that bounds the warnings requests cause: the first record of each
    warning (the same logger and message template) in a `REPEAT_WINDOW_S` window is
    logged, the repeats are counted, and the first one after the window is logged with
    their count ("... [1,234 more like this in the last 60 s]"). So 20,000 requests that
    each hit the same warning (a volatile-span pattern timing out, a prompt without a chat
    template) write a line a minute, not 20,000. INFO and below (the per-request line)
    pass. Thread-safe: records come from the engine, prepare and event-loop threads."""

    def __init__(self, window_s: float = REPEAT_WINDOW_S) -> None:
        super().__init__()
        self.window_s = window_s
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str], list[float]] = {}  # key -> [since, count]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        key = (record.name, str(record.msg))
        now = time.monotonic()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window_s:
                seen[1] += 1
                return False
            self._seen[key] = [now, 0]
            if len(self._seen) > 4096:  # templates, not values: a few dozen in practice
                self._seen = {key: self._seen[key]}
        if seen is not None and seen[1]:
            record.msg = (
                f"{record.getMessage()} [{int(seen[1]):,} more like this in the last "
                f"{now - seen[0]:.0f} s]"
            )
            record.args = None
        return True
