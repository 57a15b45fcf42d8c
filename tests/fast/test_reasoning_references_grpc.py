"""vLLM's reasoning-parser cases (tests/vllm_reasoning_cases.py) over real gRPC: one
served engine; per (tool_parser, reasoning_parser) pair the toy tokenizer with LocalAI's
names is installed with a scripted model that replays each case's output token ids through
the real engine, output pipeline and servicer. Predict's reply must equal vLLM's result and
the joined PredictStream; ModelMetadata shows each format's markers.

The prompt is raw text (no template): "Hi", then the format's start marker where the
case's prompt opened the block, start and end where it closed it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from helpers import joined_stream
from inprocess import InProcessServer
from scripted import ScriptedModel
from vllm_reasoning_cases import CASES, KNOWN, Case, expected, prompt_tail

import backend_pb2
import params
from decoding import reasoning_formats
from decoding.parsers import apply_parser_overrides
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

ALL = sorted(CASES + [c for c, _ in KNOWN], key=lambda c: (c.tool, c.parser))
OURS = {id(c): ours for c, ours in KNOWN}


class Served:
    """One server; `use` installs the model for a parser pair when it changes."""

    def __init__(self, tok) -> None:
        self.tok = tok
        self.srv = InProcessServer()
        self.pair: tuple[str, str] | None = None
        self.model: ScriptedModel | None = None
        self.named = tok

    def use(self, tool: str, parser: str):
        if self.pair != (tool, parser):
            named = apply_parser_overrides(self.tok, tool, parser)
            model = ScriptedModel(vocab_size(named), named.eos_token_id)
            load = params.load_params(backend_pb2.ModelOptions(Model="scripted"))
            install = self.srv.engine.install(model, named, load)
            asyncio.run_coroutine_threadsafe(install, self.srv.loop).result(60)
            self.pair, self.model, self.named = (tool, parser), model, named
        return self.srv.stub, self.model, self.named


@pytest.fixture(scope="module")
def served(tok):
    s = Served(tok)
    try:
        yield s
    finally:
        s.srv.stop()


def request(case: Case) -> backend_pb2.PredictOptions:
    fmt = reasoning_formats.resolve(case.parser)
    assert fmt is not None
    tail = prompt_tail(fmt, case.prompt)
    return backend_pb2.PredictOptions(Prompt="Hi" + tail, Tokens=4000, Temperature=0.0)


def predict_and_stream(served: Served, case: Case) -> tuple[dict, dict]:
    stub, model, named = served.use(case.tool, case.parser)
    req = request(case)
    prompt = prompt_mod.prepare_prompt(params.prompt_spec(req), named)
    model.set_script(len(prompt.token_ids), named.encode(case.output, add_special_tokens=False))
    d = stub.Predict(req).chat_deltas[0]
    whole = {
        "calls": [(c.name, json.loads(c.arguments)) for c in d.tool_calls],
        "content": d.content,
        "reasoning": d.reasoning_content,
    }
    return whole, joined_stream(stub.PredictStream(req))


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.id)
def test_predict_and_stream_extract_what_vllm_extracts(served, case):
    whole, streamed = predict_and_stream(served, case)
    want = {**expected(case), **OURS.get(id(case), {})}
    assert whole == want, case.why or case.source
    assert streamed == whole


@pytest.mark.parametrize("name", sorted(reasoning_formats.FORMATS))
def test_model_metadata_shows_the_formats_markers(served, name):
    stub, _, _ = served.use("", name)
    markers = stub.ModelMetadata(backend_pb2.ModelOptions()).tool_format
    assert (markers.reasoning_start, markers.reasoning_end) == (
        reasoning_formats.FORMATS[name].markers
    )
