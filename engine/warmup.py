"""Warm-up at LoadModel: the batch path run once on throwaway prompts.

MLX compiles kernels on first use (the CPU backend through the system compiler, cached
under ``$TMPDIR/mlx/<version>/cpu``; Metal and CUDA likewise), so in a fresh container
the first request after LoadModel paid several seconds for them (7.1 s to its first
token against 0.2 s for the next ones, measured on 2 CPU cores). `warm_up` runs what a
request runs — a prefill chunk, decode steps alone and at the batch size in use, the
greedy sampler and a sampled one with LocalAI's defaults (temperature 0.9, top_p 0.95,
top_k 40), the fused and compiled functions of the CPU path, all inside the model's
forward — through the same `BatchRunner` the scheduler uses, then drops everything it
made: no prompt-cache entry, no metrics, no log line per request. Bounded: a few
hundred prompt tokens and a handful of decode steps. Option ``warmup:false`` skips it.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from decoding import sampling
from engine.checkpoints import Checkpoints
from engine.jobs import Job
from engine.sequence import Sequence
from engine.sequences import BatchRunner
from loading.loaded_model import LoadedModel
from params import GenerationParams, GenerationRequest, PromptSpec
from prompt_cache import CacheLookup, PromptCache

logger = logging.getLogger("localai.mlx." + __name__)

WARMUP_PROMPT_TOKENS = 64  # the single row's prompt (one prefill chunk at most)
WARMUP_NEW_TOKENS = 3  # decode steps per round
MAX_STEPS = 64  # a bound on the batch steps of one round, whatever happens

_GREEDY = GenerationParams(
    max_tokens=WARMUP_NEW_TOKENS,
    temperature=0.0,
    top_p=1.0,
    top_k=0,
    min_p=0.0,
    repetition_penalty=0.0,
    repetition_context_size=20,
    presence_penalty=0.0,
    frequency_penalty=0.0,
    xtc_threshold=0.0,
    xtc_probability=0.0,
    seed=1,
    stop=(),
    logprobs=False,
    top_logprobs=0,
    ignore_eos=True,
    logit_bias=None,
    correlation_id="warm-up",
    model_identity="",
    cache_write=False,
)
# What LocalAI sends by default (core/config/model_config.go's defaults).
_SAMPLED = dataclasses.replace(_GREEDY, temperature=0.9, top_p=0.95, top_k=40)


def warm_up(loaded: LoadedModel) -> float:
    """Run the batch path on throwaway prompts; returns the seconds it took.

    Two rounds: one row with a prompt of up to WARMUP_PROMPT_TOKENS tokens (one prefill
    chunk), then two rows of short prompts decoding together, one greedy and one
    sampled. Engine thread only (it calls MLX).
    """
    start = time.perf_counter()
    tokenizer = loaded.tokenizer
    eos = frozenset(tokenizer.eos_token_ids)
    sentence = tokenizer.encode("The quick brown fox jumps over the lazy dog. ")
    text_ids = [t for t in sentence if t not in eos]
    if not text_ids:
        return 0.0
    checkpoints = Checkpoints(loaded, PromptCache(1), single_process=False)
    runner = BatchRunner(loaded, eos, checkpoints)
    long_len = max(2, min(WARMUP_PROMPT_TOKENS, loaded.params.prefill_step_size + 1))
    # Batched decode compiles the same kernels at any row count above one: two rows do.
    rounds = [[long_len], [8] * min(2, max(1, loaded.params.max_batch_size))]
    try:
        for lengths in rounds:
            jobs: dict[int, Sequence] = {}
            for i, n in enumerate(lengths):
                params = _GREEDY if i % 2 == 0 else _SAMPLED
                ids = (text_ids * (n // len(text_ids) + 1))[:n]
                job = Sequence(Job(GenerationRequest(params, PromptSpec()), tuple(ids)))
                sampler = sampling.make_sampler(params, tokenizer)
                processors = sampling.make_logits_processors(params, tokenizer)
                lookup = CacheLookup(None, 0, ids)
                jobs[runner.start(job, ids, lookup, sampler, processors, 0)] = job
            for _ in range(MAX_STEPS):
                if not runner.rows:
                    break
                runner.step(jobs)
    finally:
        runner.close()
    return time.perf_counter() - start
