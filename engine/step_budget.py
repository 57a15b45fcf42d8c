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

How the step's prefill tokens are shared (issue 38): the chunk one row could take is the
budget of the whole step, shared by the rows that prefill in it (vLLM's token budget per
step, ``max_num_batched_tokens``: vllm/v1/core/sched/scheduler.py, ``schedule``), the rows
with the fewest tokens left first (`batch.decode._pick`). Measured on the agent replay
(BENCHMARKS.md U): the turns of 16 sessions arrived together, all 14-16 prefilled in one
step of 16 full chunks (1.2 s), every row's first token at its end, 2.5x fewer prompt
tokens per second than one session at a time (each row's cached context padded to the
longest). In turns, shortest first, the first of them decodes after one chunk's time,
the next while the others prefill, and no step pads rows to another's context.
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

    def plan(self, decoding: bool, context: int = 0, kv: int = 0) -> int:
        """The prompt tokens of the next step, over all its prefilling rows (module doc):
        the chunk one row may take (`chunk`: the full chunk, or what the time budget
        leaves beside the decode, within the memory budget's room)."""
        return self.chunk(1, decoding, context, kv)

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
