"""Delivery in steps (engine/delivery.py, engine/jobs.py): one hand-off from the engine
thread to an event loop per engine step, and a reader that lags takes the events it missed
joined into one. Over real gRPC on the embedded model: tests/model/test_delivery.py."""

from __future__ import annotations

import asyncio
import threading
import time

from helpers import gen_params
from inprocess import InProcessServer
from scripted import ScriptedModel

import backend_pb2
from decoding.output import Delta, ToolCallDelta
from engine import delivery
from engine.core import Engine
from engine.jobs import Event, Job, joined, merged
from errors import BackendError, Unavailable
from params import GenerationRequest, PromptSpec
from seam.tokenizer import vocab_size


def ev(content="", reasoning="", tools=(), logprobs=(), tokens=1, **kw) -> Event:
    delta = Delta(content, reasoning, tuple(tools), tuple(logprobs))
    return Event(delta, prompt_tokens=5, tokens=tokens, prompt_ms=1.0, generation_ms=tokens, **kw)


def job_on(loop) -> Job:
    return Job(GenerationRequest(gen_params(), PromptSpec()), (1, 2), loop=loop)


# -- joining -------------------------------------------------------------------------------
def test_merged_concatenates_in_order_and_takes_the_latest_counters():
    lp = [{"token": str(i), "logprob": -float(i)} for i in range(4)]
    first = ToolCallDelta(0, "call_1", "get", "")
    events = [
        ev(reasoning="a", logprobs=lp[:1], tokens=1),
        ev(reasoning="b", content="c", logprobs=lp[1:2], tokens=2),
        ev(content="d", tools=[first], logprobs=lp[2:3], tokens=3),
        ev(tools=[ToolCallDelta(0, arguments='{"x"'), ToolCallDelta(0, arguments=": 1}")],
           logprobs=lp[3:], tokens=4, cached_tokens=2),
    ]  # fmt: skip
    (one,) = joined(events)
    assert one == merged(events)
    assert (one.delta.reasoning, one.delta.content) == ("ab", "cd")
    assert [t.arguments for t in one.delta.tool_calls] == ["", '{"x"', ": 1}"]
    assert one.delta.tool_calls[0] is first
    assert list(one.delta.logprobs) == lp
    assert (one.tokens, one.generation_ms, one.cached_tokens) == (4, 4, 2)
    assert not one.final
    assert merged(events[:1]) is events[0]


def test_a_final_event_merges_and_ends_what_follows_is_dropped():
    events = [ev("a"), ev("b", tokens=2), ev("c", tokens=3, finish_reason="stop"), ev("x")]
    (one,) = joined(events)
    assert (one.delta.content, one.finish_reason, one.tokens) == ("abc", "stop", 3)
    assert one.final


def test_an_error_arrives_apart_from_the_output_before_it():
    err = BackendError("generation failed")
    first, last = joined([ev("a"), ev("b"), ev(error=err)])
    assert (first.delta.content, first.final) == ("ab", False)
    assert last.error is err and not last.delta
    # With no output before it, an error merges with what carried none.
    (only,) = joined([ev(), ev(error=err)])
    assert only.error is err


def test_an_earlier_output_kind_starts_a_new_event():
    """A reply says reasoning, content, tool calls in that order; content after a tool
    call (or reasoning after content) must not be moved before it."""
    call = ToolCallDelta(0, "call_1", "get", "{}")
    events = [ev(reasoning="r"), ev(content="c"), ev(tools=[call]), ev(content="d"), ev("e")]
    got = joined(events)
    assert [(e.delta.reasoning, e.delta.content, e.delta.tool_calls) for e in got] == [
        ("r", "c", (call,)),
        ("", "de", ()),
    ]


# -- the reader ----------------------------------------------------------------------------
STREAM = [ev(f"t{i} ", tokens=i + 1) for i in range(40)] + [
    ev("end", tokens=41, finish_reason="length")
]


def _engine_thread(job: Job, events: list[Event], gate: threading.Event | None = None):
    """Emits ``events`` one a step, as the engine thread does."""

    @delivery.in_steps
    def step(event: Event) -> None:
        job.emit(event)

    def run() -> None:
        for i, event in enumerate(events):
            if gate is not None and i == 10:
                gate.wait(10)  # the reader has paused: go on while it does
            step(event)
            time.sleep(0.001)

    t = threading.Thread(target=run)
    t.start()
    return t


async def _read(job: Job, pause_after: int | None = None, paused: threading.Event | None = None):
    got = []
    async for event in job.events():
        got.append(event)
        if pause_after is not None and len(got) == pause_after:
            assert paused is not None
            paused.set()
            await asyncio.sleep(0.3)  # the engine goes on meanwhile
    return got


def test_a_reader_that_pauses_gets_merged_events_with_the_same_stream():
    async def main():
        loop = asyncio.get_running_loop()
        fast = job_on(loop)
        t = _engine_thread(fast, STREAM)
        steady = await _read(fast)
        t.join()
        slow, paused = job_on(loop), threading.Event()
        t = _engine_thread(slow, STREAM, paused)
        lagging = await _read(slow, pause_after=1, paused=paused)
        t.join()
        return steady, lagging

    steady, lagging = asyncio.run(main())
    assert "".join(e.delta.content for e in steady) == "".join(e.delta.content for e in STREAM)
    assert "".join(e.delta.content for e in lagging) == "".join(e.delta.content for e in STREAM)
    assert len(lagging) < len(STREAM) / 2, [e.delta.content for e in lagging]
    assert lagging[-1].final and lagging[-1].tokens == 41
    assert [e.tokens for e in lagging] == sorted({e.tokens for e in lagging})


def test_the_backlog_counts_untaken_events_and_a_read_takes_them_all():
    async def main():
        job = job_on(asyncio.get_running_loop())
        for event in STREAM[:5]:
            job.emit(event)  # outside a step: each hand-off at once, nobody reads yet
        before = job.backlog
        events = job.events()
        first = await anext(events)
        await events.aclose()
        return before, first, job.backlog

    before, first, after = asyncio.run(main())
    assert (before, after) == (5, 0)
    assert first.delta.content == "t0 t1 t2 t3 t4 "


def test_a_failure_outside_a_step_arrives_at_once():
    """A watchdog fails a job from its own thread while no engine step runs."""

    async def main():
        job = job_on(asyncio.get_running_loop())
        threading.Timer(0.05, job.fail, [Unavailable("the engine thread is stuck")]).start()
        return [e async for e in job.events()]

    (only,) = asyncio.run(asyncio.wait_for(main(), 5))
    assert isinstance(only.error, Unavailable)


def test_a_follower_shadow_emits_nothing():
    job = job_on(None)
    job.emit(STREAM[0])
    job.fail(BackendError("x"))
    assert job.backlog == 0


# -- hand-offs -----------------------------------------------------------------------------
class CountingLoop:
    """Stands in for an event loop: counts hand-offs and runs them at once."""

    def __init__(self) -> None:
        self.calls = 0

    def call_soon_threadsafe(self, callback, *args) -> None:
        self.calls += 1
        callback(*args)


def test_one_step_for_many_jobs_is_one_hand_off_per_event_loop():
    loop, other = CountingLoop(), CountingLoop()
    jobs = [job_on(loop) for _ in range(32)] + [job_on(other) for _ in range(3)]

    @delivery.in_steps
    def step() -> None:
        for job in jobs:
            job.emit(ev("a"))
            job.emit(ev("b"))  # a second event of one job rides on the same wake-up

    step()
    assert (loop.calls, other.calls) == (1, 1)
    assert all(job.backlog == 2 for job in jobs)
    step()  # nobody read: nothing new to wake anybody for
    assert (loop.calls, other.calls) == (1, 1)
    jobs[0].fail(BackendError("x"))  # outside a step: at once
    assert loop.calls == 1  # ... but it too rides on the wake-up that nobody took yet


def test_a_nested_step_hands_off_once_at_the_outer_end():
    loop = CountingLoop()
    jobs = [job_on(loop) for _ in range(4)]

    @delivery.in_steps
    def inner(job: Job) -> None:
        job.emit(ev("a"))

    @delivery.in_steps
    def outer() -> None:
        for job in jobs:
            inner(job)
        assert loop.calls == 0

    outer()
    assert loop.calls == 1


def test_the_engine_hands_off_once_a_step_for_eight_streams(tok, monkeypatch):
    """Eight concurrent streams of 24 tokens each through the real engine and servicer: at
    most one hand-off per engine step, far fewer than the tokens delivered."""
    hand_offs: list[int] = []
    real = delivery._hand_over
    monkeypatch.setattr(
        delivery,
        "_hand_over",
        lambda loop, wakes: (hand_offs.append(len(wakes)), real(loop, wakes)),
    )
    steps = []
    step = Engine._step
    monkeypatch.setattr(Engine, "_step", lambda self: (steps.append(1), step(self))[1])
    model = ScriptedModel(vocab_size(tok), tok.eos_token_id, step_seconds=0.002)
    srv = InProcessServer(model, tok, options=["max_batch_size:8"])
    try:
        req = backend_pb2.PredictOptions(Prompt="Hello", Tokens=24, IgnoreEOS=True)
        texts: list[str] = []
        start = threading.Barrier(8)

        def stream() -> None:
            start.wait()
            texts.append("".join(r.message.decode() for r in srv.stub.PredictStream(req)))

        readers = [threading.Thread(target=stream) for _ in range(8)]
        hand_offs.clear(), steps.clear()
        for t in readers:
            t.start()
        for t in readers:
            t.join(60)
    finally:
        srv.stop()
    assert len(texts) == 8 and len(set(texts)) == 1
    woken = sum(hand_offs)
    assert woken >= 8  # every stream was woken, in steps
    assert len(hand_offs) <= len(steps), (len(hand_offs), len(steps))
    assert len(hand_offs) < 8 * 24 / 2, hand_offs
