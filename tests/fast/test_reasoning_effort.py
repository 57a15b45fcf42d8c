"""``Metadata`` ``reasoning_effort``: LocalAI sends it (a model file's or a request's
reasoning_effort, core/backend/options.go gRPCPredictOpts) for chat templates that read it,
gpt-oss's first (its system block says ``Reasoning: <effort>``, medium when unset). It is the
template's variable ``reasoning_effort``, as vLLM passes it (build_chat_params in
vllm/entrypoints/openai/chat_completion/protocol.py) and LocalAI's llama.cpp backend through
chat_template_kwargs (backend/cpp/llama-cpp/grpc-server.cpp); one of vLLM's values; unless
the request sets enable_thinking, "none" turns thinking off and a level on.

Parsing first, then over real gRPC through the real engine and the toy tokenizer with a
template reading the variable, the scripted model recording the prompt it is fed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import grpc
import mlx.core as mx
import pytest
from helpers import chat_request, load_opts
from inprocess import InProcessServer
from mlx_lm import tokenizer_utils
from scripted import ScriptedModel
from toy_tokenizer import PIECES, TEMPLATE, build_hf

import backend_pb2
import params
from parsing.options import REASONING_EFFORTS
from seam.tokenizer import vocab_size

# gpt-oss's way of reading it, in front of the toy Qwen-style template.
EFFORT_TEMPLATE = (
    "<|im_start|>system\nReasoning: {{ reasoning_effort | default('medium') }}<|im_end|>\n"
    + TEMPLATE
)


def chat(effort: str | None = None, PromptCacheRO: bool = False, **metadata: str):
    req = chat_request("Hello", Tokens=3, PromptCacheRO=PromptCacheRO)
    if effort is not None:
        req.Metadata["reasoning_effort"] = effort
    for key, value in metadata.items():
        req.Metadata[key] = value
    return req


def kwargs_of(req: backend_pb2.PredictOptions, load: params.LoadParams | None = None) -> dict:
    return dict(params.parse_request(req, load).prompt.template_kwargs)


@pytest.mark.parametrize("effort", REASONING_EFFORTS)
def test_each_value_reaches_the_template_kwargs(effort):
    assert kwargs_of(chat(effort)) == {
        "reasoning_effort": effort,
        "enable_thinking": effort != "none",
    }


def test_case_and_spaces_are_ignored_and_empty_is_unset():
    assert kwargs_of(chat(" High "))["reasoning_effort"] == "high"
    assert kwargs_of(chat("")) == {}
    assert kwargs_of(chat("  ")) == {}


@pytest.mark.parametrize("effort", ["extreme", "1", "low medium", "x" * 10_000])
def test_other_values_are_refused_naming_the_accepted_ones(effort):
    with pytest.raises(ValueError) as err:
        params.parse_request(chat(effort))
    message = str(err.value)
    assert message.startswith(
        "PredictOptions.Metadata.reasoning_effort must be one of none, minimal, low, medium, "
        "high, xhigh, max, got "
    )
    assert len(message) < 200  # the value is quoted cut to 40 characters


def test_enable_thinking_set_by_the_request_wins():
    assert kwargs_of(chat("high", enable_thinking="false"))["enable_thinking"] is False
    assert kwargs_of(chat("none", enable_thinking="true"))["enable_thinking"] is True
    blob = json.dumps({"enable_thinking": False})
    assert kwargs_of(chat("high", chat_template_kwargs=blob))["enable_thinking"] is False


def test_chat_template_kwargs_wins_and_localai_sends_both_alike():
    # LocalAI at HEAD also folds the metadata into the chat_template_kwargs blob (coerced),
    # core/config/model_config.go ResolveChatTemplateKwargs: the same value twice.
    blob = json.dumps({"reasoning_effort": "low", "enable_thinking": True})
    assert kwargs_of(chat("low", enable_thinking="true", chat_template_kwargs=blob)) == {
        "reasoning_effort": "low",
        "enable_thinking": True,
    }
    blob = json.dumps({"reasoning_effort": "high"})
    assert kwargs_of(chat("low", chat_template_kwargs=blob))["reasoning_effort"] == "high"
    # Only Metadata's reasoning_effort implies enable_thinking (vLLM: the request's field).
    assert kwargs_of(chat(chat_template_kwargs=blob)) == {"reasoning_effort": "high"}


def test_a_reasoning_budget_of_zero_still_turns_thinking_off():
    assert kwargs_of(chat("high", reasoning_budget="0"))["enable_thinking"] is False
    assert kwargs_of(chat("high"), load_opts("reasoning_budget:0"))["enable_thinking"] is False


def test_raw_prompts_have_no_template_kwargs():
    req = backend_pb2.PredictOptions(Prompt="Hello")
    req.Metadata["reasoning_effort"] = "high"
    assert kwargs_of(req) == {}


# --- over gRPC: the prompt the model is fed -----------------------------------------------


class Recording(ScriptedModel):
    """ScriptedModel that keeps every token it is fed (row 0)."""

    def __init__(self, vocab: int, eos: int) -> None:
        super().__init__(vocab, eos)
        self.fed: list[int] = []

    def __call__(self, inputs: mx.array, cache=None, **kwargs) -> mx.array:
        self.fed += [int(t) for t in inputs[0].tolist()]
        return super().__call__(inputs, cache, **kwargs)


@pytest.fixture(scope="module")
def effort_tok():
    hf = build_hf(PIECES)
    hf.chat_template = EFFORT_TEMPLATE
    with tempfile.TemporaryDirectory() as tmp:
        hf.save_pretrained(tmp)
        return tokenizer_utils.load(Path(tmp))


@pytest.fixture(scope="module")
def served(effort_tok):
    model = Recording(vocab_size(effort_tok), effort_tok.eos_token_id)
    srv = InProcessServer(model, effort_tok)
    yield srv, model
    srv.stop()


@pytest.mark.parametrize(
    ("effort", "thinking"), [("high", True), ("LOW", True), ("none", False), (None, None)]
)
def test_the_model_is_fed_the_effort_over_grpc(served, effort_tok, effort, thinking):
    srv, model = served
    model.fed = []
    # PromptCacheRO: nothing is stored, so every request prefills its whole prompt.
    reply = srv.stub.Predict(chat(effort, PromptCacheRO=True))
    expected_kwargs = {} if effort is None else {"reasoning_effort": effort.lower()}
    if thinking is not None:
        expected_kwargs["enable_thinking"] = thinking
    expected = effort_tok.apply_chat_template(
        [{"role": "user", "content": "Hello"}], add_generation_prompt=True, **expected_kwargs
    )
    assert reply.prompt_tokens == len(expected)
    assert model.fed[: len(expected)] == expected
    text = effort_tok.decode(model.fed[: len(expected)])
    assert f"Reasoning: {(effort or 'medium').lower()}" in text
    assert text.endswith("<think>\n\n</think>\n\n" if thinking is False else "<think>\n")


def test_a_bad_effort_is_invalid_argument_over_grpc(served):
    srv, _ = served
    with pytest.raises(grpc.RpcError) as err:
        srv.stub.Predict(chat("ultra"))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Metadata.reasoning_effort must be one of" in err.value.details()
