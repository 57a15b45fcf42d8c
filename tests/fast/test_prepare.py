"""The one prepare step (engine/prepare.py) and the decisions it makes once (prompting/fit.py):
the prompt text and its tokens against the context, the Tokens cap, the memory budget,
images for a text-only model; the constraint compiled, its time bound; every request error
INVALID_ARGUMENT. The toy tokenizer, no model."""

from __future__ import annotations

import asyncio
import base64
import io
import threading

import pytest
from helpers import ids, served
from PIL import Image

import backend_pb2 as pb
import params
from decoding import grammar
from engine import prepare
from engine.memory import MemoryBudget, MemoryProfile
from errors import InvalidArgument, ResourceExhausted
from parsing import constraint as reading
from prompting import fit


def _png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


PNG = _png()


# --------------------------------------------------------------------------- the context
def test_the_prompt_text_is_refused_before_tokenizing_when_it_cannot_fit(tok) -> None:
    loaded = served(tok, context=4)
    limit = 4 * loaded.max_token_chars
    fit.check_text("x" * limit, loaded)  # at the bound: tokenizing decides
    with pytest.raises(InvalidArgument, match=rf"{limit + 1} characters, more than the 4-token"):
        fit.check_text("x" * (limit + 1), loaded)
    fit.check_text("x" * 10**6, served(tok, context=None))  # unknown context: no bound
    fit.check_text("x" * 10**6, served(tok, context=4, options=("max_kv_size:16",)))


def test_the_tokens_cap_is_the_room_the_context_leaves(tok) -> None:
    loaded = served(tok, context=10)
    assert fit.max_tokens(loaded, 3, 100) == 7
    assert fit.max_tokens(loaded, 3, 5) == 5
    assert fit.max_tokens(loaded, 9, 100) == 1
    big = served(tok, context=10**6)
    assert fit.max_tokens(big, 3, 10**9) == params.MAX_TOKENS_CAP  # the absolute cap too
    with pytest.raises(InvalidArgument, match="the prompt is 10 tokens but the context holds 10"):
        fit.max_tokens(loaded, 10, 1)
    # A rotating cache never fills: Tokens -1 (UNTIL_CONTEXT_FULL) still ends somewhere.
    rotating = served(tok, context=10, options=("max_kv_size:8",))
    assert fit.max_tokens(rotating, 50, 10**9) == params.MAX_TOKENS_CAP
    assert fit.kv_tokens(rotating, 50, 100) == 8
    assert fit.kv_tokens(loaded, 3, 7) == 10


def test_memory_that_can_never_hold_the_request_is_refused_with_the_numbers(tok) -> None:
    loaded = served(tok)
    budget = MemoryBudget(300_000, 1000, MemoryProfile(1000, 0, 0), 512)
    fit.check_memory(budget, loaded, 200, 56)  # 256 tokens: 256 kB
    with pytest.raises(ResourceExhausted, match="257 tokens with the generation budget"):
        fit.check_memory(budget, loaded, 200, 57)  # the KV grows by 256 tokens: 512 kB
    fit.check_memory(MemoryBudget.off(loaded), loaded, 10**6, 10**6)


def test_images_for_a_text_only_model_are_refused_saying_why(tok) -> None:
    loaded = served(tok, text_only_reason="distributed mode serves text")
    fit.check_images(loaded, 0)
    with pytest.raises(InvalidArgument, match=r"serves text only .*distributed mode serves text"):
        fit.check_images(loaded, 1)


# --------------------------------------------------------------------------- the step
def test_one_step_parses_renders_tokenizes_and_caps(tok) -> None:
    loaded = served(tok, context=64)
    message = pb.PredictOptions(Prompt="Hello world", Tokens=1000)
    ready = prepare.prepare(message, prepare.Intake(loaded))
    assert ready.prompt.token_ids == ids(tok, "Hello world")
    assert ready.request.prompt.prompt == "Hello world"
    assert ready.max_tokens == 64 - len(ids(tok, "Hello world"))
    assert (ready.model_serial, ready.vision) == (7, None)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"Prompt": "x", "TopP": 2.0}, "PredictOptions.TopP"),  # parsing
        ({"Prompt": "x", "Grammar": "root ::= root"}, "matches no string"),  # compiling
        ({"Prompt": "x", "LogitBias": '{"100000": 1}'}, "LogitBias token ids"),  # vocabulary
        ({"Prompt": "Hello" * 40}, "the context holds 64"),  # the prompt's tokens
        ({"Prompt": "x" * 10**5}, "characters, more than the 64-token context"),  # its text
        ({"Prompt": "x", "Images": [PNG]}, "serves text only"),  # images, text model
    ],
)
def test_every_request_error_is_invalid_argument_before_queueing(tok, fields, needle) -> None:
    with pytest.raises(InvalidArgument, match=needle):
        prepare.prepare(pb.PredictOptions(**fields), prepare.Intake(served(tok, context=64)))


def test_the_memory_budget_is_asked_with_the_capped_tokens(tok) -> None:
    asked: list[int] = []

    class Budget:
        def never_fits(self, tokens: int) -> str | None:
            asked.append(tokens)
            return "too big" if tokens > 20 else None

    loaded = served(tok, context=16)
    prepare.prepare(
        pb.PredictOptions(Prompt="Hello", Tokens=1000), prepare.Intake(loaded, Budget())
    )
    assert asked == [16]  # prompt + the cap the context leaves, not Tokens 1000
    wide = served(tok, context=64)
    with pytest.raises(ResourceExhausted, match="too big"):
        prepare.prepare(
            pb.PredictOptions(Prompt="Hello", Tokens=30), prepare.Intake(wide, Budget())
        )


def test_a_constraint_is_compiled_for_the_model_off_the_loop(tok) -> None:
    rules = [" | ".join(f"r{k}" for k in range(60))]
    rules += [" | ".join(f'"{k}x{i}"' for i in range(100)) for k in range(60)]
    text = "\n".join(f"r{k} ::= {rule}" for k, rule in enumerate(rules, -1)).replace("r-1", "root")
    assert len(text.encode()) < reading.MAX_GRAMMAR_BYTES
    loaded = served(tok, context=64)
    message = pb.PredictOptions(Prompt="x", Grammar=text)

    async def main() -> int:
        ticks = 0
        task = asyncio.ensure_future(prepare.run(message, prepare.Intake(loaded)))
        while not task.done():
            await asyncio.sleep(0.001)
            ticks += 1
        assert task.result().request.params.constraint is not None
        return ticks

    # The loop kept running while ~60 KB of grammar compiled on the prepare pool.
    assert asyncio.run(main()) >= 5


def test_a_compile_that_outlasts_its_bound_is_refused(tok, monkeypatch) -> None:
    started, release = threading.Event(), threading.Event()

    def slow_compile(constraint, tokenizer) -> None:
        started.set()
        release.wait(30)

    monkeypatch.setattr(grammar, "compile_constraint", slow_compile)
    message = pb.PredictOptions(Prompt="x", Grammar='root ::= "yes" | "no"')
    try:
        with pytest.raises(InvalidArgument, match=r"^PredictOptions\.Grammar: .* within 0.2 s"):
            asyncio.run(prepare.run(message, prepare.Intake(served(tok)), timeout_s=0.2))
        assert started.is_set()
    finally:
        release.set()  # the compile finishes in the background


def test_a_chat_boundary_only_when_asked(tok) -> None:
    loaded = served(tok, context=256)
    message = pb.PredictOptions(UseTokenizerTemplate=True)
    for role, content in [
        ("system", "Sure"),
        ("user", "Hello"),
        ("assistant", "The"),
        ("user", "!"),
    ]:
        message.Messages.add(role=role, content=content)
    plain = prepare.prepare(message, prepare.Intake(loaded))
    marked = prepare.prepare(message, prepare.Intake(loaded, boundaries=True))
    assert plain.prompt.checkpoints == ()
    assert len(marked.prompt.checkpoints) == 1
    assert 0 < marked.prompt.checkpoints[0] < len(marked.prompt.token_ids)
