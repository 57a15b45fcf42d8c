"""gpt-oss (Harmony) tool calls with gpt-oss's real special tokens: read by the output pipeline
and held to the declared tools by the tool-call grammar (`tool_parser:openai`,
`reasoning_parser:openai_gptoss`).

o200k_harmony's files are not available offline here, so the tokenizer is the embedded
SmolLM2 one with gpt-oss's special tokens added under their real ids and texts (openai's
tiktoken `o200k_harmony`: <|return|> 200002, <|constrain|> 200003, <|channel|> 200005,
<|start|> 200006, <|end|> 200007, <|message|> 200008, <|call|> 200012; the ids between are
placeholders, as gpt-oss's reserved ones). What gpt-oss writes for a call is vLLM's
tests/tool_parsers/test_openai_tool_parser.py test_extract_tool_calls_single_tool,
rendered by openai_harmony (`render_conversation_for_completion`: the analysis message, then
the commentary message to `functions.get_current_weather` with content type json)."""

from __future__ import annotations

import json

import pytest
import tiny_models
from helpers import PICK_TOOLS, chat_request, grammar_matcher
from inprocess import InProcessServer
from mlx_lm.tokenizer_utils import TokenizerWrapper
from scripted import ScriptedModel
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerFast

import params
from decoding import tool_grammar
from decoding.output import OutputPipeline
from decoding.parsers import apply_parser_overrides
from decoding.tool_calls import merge_tool_call_deltas
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size

GPT_OSS = {
    "<|startoftext|>": 199998,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
}
ANALYSIS = 'User asks: "What is the weather in Tokyo?" We need to use get_current_weather tool.'
CALL = (
    "<|channel|>commentary to=functions.get_current_weather <|constrain|>json<|message|>"
    '{"location": "Tokyo"}<|call|>'
)
# gpt-oss's completion after the prompt's `<|start|>assistant`
COMPLETION = f"<|channel|>analysis<|message|>{ANALYSIS}<|end|><|start|>assistant{CALL}"
WEATHER = {
    "type": "object",
    "properties": {"location": {"type": "string"}, "unit": {"type": "string"}},
    "required": ["location"],
}
TOOLS = [{"type": "function", "function": {"name": "get_current_weather", "parameters": WEATHER}}]


@pytest.fixture(scope="module")
def harmony():
    """The embedded SmolLM2 tokenizer with gpt-oss's special tokens at their ids, wrapped by
    mlx-lm and given LocalAI's gpt-oss parser names."""
    spec = json.loads((tiny_models.tokenizer_dir() / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    for i in range(len(vocab), min(GPT_OSS.values())):  # unreachable: no merge makes them
        vocab[f"<|unused_{i}|>"] = i
    names = {i: text for text, i in GPT_OSS.items()}
    for i in range(min(GPT_OSS.values()), max(GPT_OSS.values()) + 1):
        spec["added_tokens"].append(
            {"id": i, "content": names.get(i, f"<|reserved_{i}|>"), "special": True,
             "single_word": False, "lstrip": False, "rstrip": False, "normalized": False}
        )  # fmt: skip
    hf = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), eos_token="<|return|>"
    )
    assert {t: hf.convert_tokens_to_ids(t) for t in GPT_OSS} == GPT_OSS
    wrapper = TokenizerWrapper(hf, eos_token_ids={GPT_OSS["<|return|>"], GPT_OSS["<|call|>"]})
    return hf, apply_parser_overrides(wrapper, "openai", "openai_gptoss")


def test_the_completion_is_gpt_oss_special_tokens(harmony):
    hf, _ = harmony
    ids = hf.encode(COMPLETION, add_special_tokens=False)
    specials = [i for i in ids if i >= min(GPT_OSS.values())]
    assert specials == [200005, 200008, 200007, 200006, 200005, 200003, 200008, 200012]


def test_the_pipeline_reads_the_call(harmony):
    hf, tok = harmony
    pipe = OutputPipeline(tok, tools=TOOLS)
    for token in hf.encode(COMPLETION, add_special_tokens=False):
        pipe.feed(token)
    pipe.finish("stop")
    got = [(c.name, json.loads(c.arguments)) for c in pipe.tool_calls]
    assert got == [("get_current_weather", {"location": "Tokyo"})]
    assert (pipe.content, pipe.reasoning) == ("", ANALYSIS)


def _constraint(tok, choice: str, mode: str) -> params.GenerationRequest:
    req = chat_request("Weather?", Tools=json.dumps(TOOLS), ToolChoice=choice)
    req.Metadata["tool_grammar"] = mode
    request = params.GenerationRequest(
        prompt=params.prompt_spec(req), params=params.generation_params(req)
    )
    return tool_grammar.with_tool_grammar(request, tok)


def _takes(tok, source: str, ids: list[int]) -> bool:
    m = grammar_matcher(tok, source)
    if m.validate_tokens(ids) != len(ids):
        return False
    m.consume_tokens(ids)
    return m.is_accepting() or m.validate_tokens([GPT_OSS["<|return|>"]]) == 1


def test_lazy_grammar_holds_the_call_from_its_trigger(harmony):
    hf, tok = harmony
    request = _constraint(tok, '"auto"', "on")
    source = request.params.constraint.source
    (trigger,) = request.params.grammar_triggers
    assert trigger == " to=functions."
    # the grammar writes the specials as gpt-oss's tokens, not text
    for text in ("<|constrain|>", "<|message|>", "<|call|>"):
        assert f"<[{GPT_OSS[text]}]>" in source, text
    # What the TriggerGate hands over: the text from the trigger on, then the model's tokens.
    handed = CALL[CALL.index(trigger) :]
    assert _takes(tok, source, hf.encode(handed, add_special_tokens=False))
    for bad in (
        handed.replace("get_current_weather", "rm_rf"),  # an undeclared tool
        handed.replace('"location"', '"place"'),  # the required parameter left out
    ):
        assert not _takes(tok, source, hf.encode(bad, add_special_tokens=False)), bad


def test_required_grammar_takes_gpt_oss_completion(harmony):
    hf, tok = harmony
    request = _constraint(tok, '"required"', "required")
    source = request.params.constraint.source
    assert request.params.grammar_triggers == ()
    ids = hf.encode(COMPLETION, add_special_tokens=False)
    assert _takes(tok, source, ids)
    # without the analysis message too
    assert _takes(tok, source, hf.encode(CALL, add_special_tokens=False))
    bad = COMPLETION.replace("functions.get_current_weather", "functions.rm_rf")
    assert not _takes(tok, source, hf.encode(bad, add_special_tokens=False))
    # a final answer instead of the call is not taken
    final = "<|channel|>final<|message|>It is sunny.<|return|>"
    assert not _takes(tok, source, hf.encode(final, add_special_tokens=False))


# Over gRPC around the real engine, a scripted gpt-oss certain of an undeclared tool (as
# tests/fast/test_call_formats.py's scripted formats), the declared one `PICK_TOOLS`.
KILL = '<|channel|>commentary to=functions.kill <|constrain|>json<|message|>{"unit": "c"}<|call|>'


def test_scripted_gpt_oss_call_is_held_to_the_declared_tool(harmony):
    hf, _ = harmony
    plain = TokenizerWrapper(hf, eos_token_ids={GPT_OSS["<|return|>"], GPT_OSS["<|call|>"]})
    model = ScriptedModel(vocab_size(plain), GPT_OSS["<|return|>"])
    options = ["tool_parser:openai", "reasoning_parser:openai_gptoss"]
    srv = InProcessServer(model, plain, options)
    try:
        got = {}
        for mode in ("required", "off"):
            req = chat_request("Hi", Tokens=60, Tools=PICK_TOOLS, ToolChoice='"required"')
            req.Metadata["tool_grammar"] = mode
            prompt = len(prompt_mod.prepare_prompt(params.prompt_spec(req), plain).token_ids)
            model.set_script(prompt, hf.encode(KILL, add_special_tokens=False))
            deltas = [d for r in srv.stub.PredictStream(req) for d in r.chat_deltas]
            (whole,) = srv.stub.Predict(req).chat_deltas
            calls = [(c.name, json.loads(c.arguments)) for c in whole.tool_calls]
            merged = merge_tool_call_deltas(c for d in deltas for c in d.tool_calls)
            assert [(c.name, json.loads(c.arguments)) for c in merged] == calls
            got[mode] = calls
    finally:
        srv.stop()
    assert got["required"] == [("pick", {"unit": "c"})]
    assert got["off"] == [("kill", {"unit": "c"})]  # without the grammar it comes through
