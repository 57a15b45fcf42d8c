"""The one prepare step: a Predict request in, everything its job needs out, in one hop.

Between the event loop and the engine thread a request takes a single trip to one worker
pool, where it is
- measured (`parsing.bounds`: texts by their length, windows and lists by the context
  and documented counts, before anything is decoded or rendered),
- parsed (`params.parse_request`: every field read and bounded), its tool-call grammar
  built when one applies (`tool_grammar.with_tool_grammar`: needs the model's tool parser),
- its constraint compiled for the model's tokenizer (`grammar.compile_constraint`; the
  compile is kept, so the sequence's processor reuses it) and its LogitBias ids checked
  against the vocabulary,
- its prompt rendered and tokenized (volatile spans removed first:
  `prompt.without_volatile`; images decoded and preprocessed: `vision_prompt.prepare`),
  refused early when its text cannot fit the context,
- and the decisions that need its token count made (`prompting.fit`): the prompt fits the
  context, the Tokens cap, the memory budget can ever hold it.
No MLX here (the engine thread owns it). Every ``ValueError`` raised here comes from the
request and leaves as ``InvalidArgument`` (INVALID_ARGUMENT); other errors are the
server's.

The constraint's compile is bounded in time (`grammar.VALIDATE_TIMEOUT_S`): `run` stops
waiting once the compile has taken longer and refuses the request (a compile already
running finishes in the background and is kept for the next request).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import params as params_mod
from decoding import grammar, sampling, tool_grammar
from engine import vision_prompt
from errors import invalid_argument
from loading.loaded_model import LoadedModel
from params import GenerationRequest, LoadParams
from parsing.bounds import Bounds
from parsing.constraint import Constraint
from prompting import fit
from prompting.render import PreparedPrompt, without_volatile

T = TypeVar("T")

PREPARE_THREADS = 2  # requests prepared at once; more wait their turn
POLL_S = 0.05  # how often `run` looks whether a compile has started, seconds

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def workers() -> concurrent.futures.ThreadPoolExecutor:
    """The prepare pool: off the event loop and off the engine thread; made on first use."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                PREPARE_THREADS, thread_name_prefix="prepare"
            )
        return _pool


async def off_engine(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the prepare pool, awaited from the event loop: work that needs the
    tokenizer but no MLX (tokenizing Rerank documents, Embedding and TokenizeString texts)
    leaves the engine thread free to step the batch meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(workers(), fn, *args)


@dataclass(frozen=True)
class Intake:
    """What the prepare step reads of the engine for one request: the model it is for,
    that model's memory budget (None: none to check) and whether its prompts should come
    with their chat boundary (prefill checkpoints, `Scheduler.wants_boundaries`)."""

    loaded: LoadedModel
    memory: fit.NeverFits | None = None
    boundaries: bool = False


@dataclass(frozen=True)
class PreparedRequest:
    """A request ready for the engine thread (crosses from the prepare pool to it).

    ``max_tokens``: what it may generate, capped to the context (`fit.max_tokens`);
    ``model_serial``: the model its ids were made for (`LoadedModel.serial`).
    """

    request: GenerationRequest
    prompt: PreparedPrompt
    max_tokens: int
    model_serial: int

    @property
    def vision(self) -> vision_prompt.VisionPrompt | None:
        """The image part of an image prompt; None for text."""
        if isinstance(self.prompt, vision_prompt.VisionPreparedPrompt):
            return self.prompt.vision
        return None


class Progress:
    """What the prepare step is doing, for the event loop that waits on it: the
    constraint being compiled and since when (`time.monotonic`), or None."""

    def __init__(self) -> None:
        self.compiling: tuple[Constraint, float] | None = None


def parse(message: Any, load: LoadParams | None, bounds: Bounds | None = None) -> GenerationRequest:
    """The parsed request of a ``backend_pb2.PredictOptions``; InvalidArgument naming the
    first bad field. ``bounds``: the model's (`fit.bounds`), checked on lengths first."""
    try:
        return params_mod.parse_request(message, load, bounds)
    except ValueError as exc:
        raise invalid_argument(exc) from None


def prepare(message: Any, intake: Intake, progress: Progress | None = None) -> PreparedRequest:
    """Parse, compile, render, tokenize and fit one request (module doc); any thread.

    Raises InvalidArgument for anything the request must change, ResourceExhausted when
    the memory budget can never hold it."""
    loaded = intake.loaded
    request = parse(message, loaded.params, fit.bounds(loaded))
    try:
        request = tool_grammar.with_tool_grammar(request, loaded.tokenizer)
        constraint = request.params.constraint
        if constraint is not None:
            if progress is not None:
                progress.compiling = (constraint, time.monotonic())
            grammar.compile_constraint(constraint, loaded.tokenizer)
            if progress is not None:
                progress.compiling = None
        sampling.check_logit_bias(request.params, loaded.tokenizer)
        prompt = vision_prompt.prepare(
            without_volatile(request.prompt, loaded.params.volatile_spans),
            loaded,
            lambda text: fit.check_text(text, loaded),
            intake.boundaries,
        )
        prompt_len = len(prompt.token_ids)
        cap = fit.max_tokens(loaded, prompt_len, request.params.max_tokens)
    except ValueError as exc:
        raise invalid_argument(exc) from None
    if intake.memory is not None:
        fit.check_memory(intake.memory, loaded, prompt_len, cap)
    return PreparedRequest(request, prompt, cap, loaded.serial)


async def run(
    message: Any, intake: Intake, timeout_s: float = grammar.VALIDATE_TIMEOUT_S
) -> PreparedRequest:
    """`prepare` on the prepare pool, awaited from the event loop; InvalidArgument once the
    request's constraint has compiled for more than ``timeout_s`` seconds."""
    progress = Progress()
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(workers(), prepare, message, intake, progress)
    while True:
        compiling = progress.compiling
        wait = POLL_S if compiling is None else max(compiling[1] + timeout_s - time.monotonic(), 0)
        done, _ = await asyncio.wait({future}, timeout=wait)
        if done:
            return future.result()
        compiling = progress.compiling
        if compiling is not None and time.monotonic() - compiling[1] >= timeout_s:
            # Nobody awaits it any more: its outcome must not be logged as never retrieved.
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise invalid_argument(grammar.timeout_error(compiling[0], timeout_s))
