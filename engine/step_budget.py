"""The per-step time budget of the batch: how many prompt tokens one step may prefill.

mlx-lm's `BatchGenerator` runs, per step, one decode token for every decoding row and
then one prefill chunk of `prefill_step_size` tokens for the rows still prefilling, and
reads that attribute on every step. A full chunk of a long prompt can take seconds on a
CPU, and every running stream waits that long for its next token. vLLM bounds this with a
token budget per step (`max_num_batched_tokens`: decodes first, prefill chunks in what is
left); here the budget is time, since tokens per second differ by orders of magnitude
between a 2-core CPU and a GPU: while rows decode, the chunk is what the measured prefill
speed fits into ``budget_ms`` after the decode step; with nobody decoding, the full chunk
(the fastest prefill).

How the step's prefill tokens are shared (issue 38): in arrival order, as vLLM's scheduler
gives its token budget to the oldest requests first (vllm/v1/core/sched/scheduler.py,
``schedule``: running requests, then waiting ones, each taking what is left of
``max_num_batched_tokens``), not in equal slices to every prefilling row. With 16 agents'
turns of 500 tokens arriving together and room for 4,000 tokens a step, equal slices end
every prefill in the second step; in order, half end in the first. `plan` says how many
rows the batch's prefill group may hold (the others wait to enter it, in order) and their
chunk.
"""

from __future__ import annotations

from engine.memory import MemoryProfile, copies

MIN_CHUNK = 16  # smallest prefill chunk (tokens per row): below it, per-step overhead rules
FIRST_CHUNK = 64  # the chunk before any speed was measured
CHUNK_QUANTUM = 16  # chunks are multiples of this (fewer distinct shapes for the kernels)
SMOOTHING = 0.3  # weight of the newest measurement in the moving averages
# The chunk by context (issue 32): a chunk's attention scores are chunk x context per head,
# so past CONTEXT_KNEE tokens of context the chunk halves each time the context doubles,
# never below CONTEXT_MIN_CHUNK. mlx-lm PR #1781 measured a 27B model at a 128k context:
# 2,048-token chunks peaked 11.2 GB above 512-token ones at the same prefill speed.
CONTEXT_KNEE = 8192
CONTEXT_MIN_CHUNK = 256


def for_context(context: int, max_chunk: int) -> int:
    """The largest chunk (tokens) for a row whose KV already holds ``context`` tokens."""
    if context <= CONTEXT_KNEE:
        return max_chunk
    scaled = max_chunk * CONTEXT_KNEE // context // CHUNK_QUANTUM * CHUNK_QUANTUM
    return min(max_chunk, max(CONTEXT_MIN_CHUNK, scaled))


class PrefillBudget:
    """Chooses each step's prefill chunk and learns from how long steps took.

    ``budget_ms``: the step time to stay within while rows decode (0: always the full
    chunk); ``max_chunk``: the full chunk (``prefill_step_size``), tokens per row.
    """

    def __init__(self, budget_ms: int, max_chunk: int) -> None:
        self.budget_s = max(budget_ms, 0) / 1000.0
        self.max_chunk = max_chunk
        self.decode_s = 0.0  # moving average of a decode-only step, seconds
        self.rate: float | None = None  # moving average of prefill tokens per second
        # The memory budget's room for the step's prefill working set (bytes) and the
        # model's profile that prices it; None: no memory budget.
        self.memory: tuple[int, MemoryProfile] | None = None

    def limit(self, room: int, profile: MemoryProfile) -> None:
        """The memory budget leaves ``room`` bytes for the next steps' prefill working
        set, priced by ``profile`` (`MemoryProfile.prefill`)."""
        self.memory = (room, profile)

    def chunk(self, prefill_rows: int, decoding: bool, context: int = 0, kv: int = 0) -> int:
        """Prompt tokens per prefilling row for the next step; ``context``: the most
        tokens a prefilling row's KV holds (`for_context`; the batch pads every row to
        the longest); ``kv``: the batch's KV bytes now. Under a memory budget, the step's
        working set over all ``prefill_rows`` rows (each chunk beside the context) fits
        its room beside the copies of that KV a step may hold (`engine.memory.copies`)."""
        largest = for_context(context, self.max_chunk)
        if self.memory is not None and prefill_rows > 0:
            room_bytes, profile = self.memory
            room_bytes -= copies(kv)
            largest = profile.chunk_within(room_bytes, prefill_rows, context, largest)
        largest = max(MIN_CHUNK, largest)
        if not decoding or self.budget_s <= 0 or prefill_rows == 0:
            return largest
        if self.rate is None:
            return min(FIRST_CHUNK, largest)
        room = max(self.budget_s - self.decode_s, 0.0) * self.rate / prefill_rows
        tokens = int(room) // CHUNK_QUANTUM * CHUNK_QUANTUM
        return max(MIN_CHUNK, min(largest, tokens))

    def plan(
        self, waiting: int, grouped: int, decoding: bool, context: int = 0, kv: int = 0
    ) -> tuple[int, int | None]:
        """(chunk, most rows in the prefill group; None: every row) for the next step:
        ``grouped`` rows prefill now, ``waiting`` more would join (module doc). Rows take
        about a full chunk each, in order, within the time budget; rows in the group stay
        (their KV is merged there). Where the time part is off (nobody decodes, budget
        0, no speed measured yet), every row joins and shares the chunk (`chunk`)."""
        rows = waiting + grouped
        tokens = self._tokens(decoding)
        if tokens is None or rows == 0:
            return self.chunk(rows, decoding, context, kv), None
        full = for_context(context, self.max_chunk)
        most = max(grouped, 1, int(tokens) // full)
        if most >= rows:
            return self.chunk(rows, decoding, context, kv), None
        return self.chunk(most, decoding, context, kv), most

    def _tokens(self, decoding: bool) -> float | None:
        """Prompt tokens the time budget leaves a step beside the decode (all rows
        together); None where no time budget applies."""
        if not decoding or self.budget_s <= 0 or self.rate is None:
            return None
        return max(self.budget_s - self.decode_s, 0.0) * self.rate

    def observe(self, seconds: float, prefill_tokens: int, decoding: bool) -> None:
        """One step took ``seconds``, prefilling ``prefill_tokens`` tokens (all rows), with
        or without decoding rows."""
        if prefill_tokens <= 0:
            if decoding:
                self.decode_s = _average(self.decode_s or None, seconds)
            return
        prefill_s = seconds - (self.decode_s if decoding else 0.0)
        if prefill_s > 0:
            self.rate = _average(self.rate, prefill_tokens / prefill_s)


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new
