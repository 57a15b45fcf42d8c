"""Unit tests for the prompt spec (params.prompt_spec) and its rendering (prompt.py), with a
real (tiny, in-memory) tokenizer and chat template."""

from __future__ import annotations

import json
import logging

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

import backend_pb2 as pb
from params import PromptSpec, prompt_spec
from prompting.render import PreparedPrompt, encode
from prompting.render import prepare_prompt as render_spec

# A Qwen3-style ChatML template, cut down: tools, tool calls, tool results, reasoning,
# names, enable_thinking, and one custom kwarg. `args_is_mapping` shows whether the
# template received tool-call arguments as an object.
CHATML = """\
{%- if greeting is defined %}[{{ greeting }}]{% endif %}
{%- if bos_first is defined %}{{ bos_token }}{% endif %}
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}
{% endif %}# Tools
<tools>{% for tool in tools %}
{{ tool | tojson }}{% endfor %}
</tools><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{% if message.reasoning_content %}<think>
{{ message.reasoning_content }}
</think>
{% endif %}{{ message.content }}
{%- for tc in message.tool_calls or [] %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}, \
"args_is_mapping": {{ (tc.function.arguments is mapping) | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response id="{{ message.tool_call_id }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}\
{% if message.name %} name={{ message.name }}{% endif %}{{ '\\n' }}\
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and enable_thinking is false %}<think>

</think>

{% else %}<think>
{% endif %}{% endif %}"""


class Prepared:
    """A request's parsed spec and its rendering, read together by the assertions below."""

    def __init__(self, spec: PromptSpec, prepared: PreparedPrompt) -> None:
        self.spec, self.text, self.token_ids = spec, prepared.text, prepared.token_ids
        self.starts_in_reasoning = prepared.initial_state == "reasoning"
        self.enable_thinking = spec.enable_thinking


def prepare_prompt(req: pb.PredictOptions, tokenizer) -> Prepared:
    """Parse at the edge, then render: the two steps a request goes through."""
    spec = prompt_spec(req)
    return Prepared(spec, render_spec(spec, tokenizer))


def make_tokenizer(chat_template: str | None = CHATML, thinking: bool = True) -> TokenizerWrapper:
    """Byte-level BPE without merges (encodes any text), BOS added by the post-processor."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<s>", "<|im_start|>", "<|im_end|>"])
    if thinking:
        tok.add_tokens(["<think>", "</think>"])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="<|im_end|>", chat_template=chat_template
    )
    return TokenizerWrapper(hf)


@pytest.fixture(scope="module")
def tokenizer() -> TokenizerWrapper:
    return make_tokenizer()


def message(role: str, content: str = "", **fields: str) -> pb.Message:
    return pb.Message(role=role, content=content, **fields)


CHAT = [message("system", "You are terse."), message("user", "Hi there")]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


def request(messages=CHAT, **fields) -> pb.PredictOptions:
    return pb.PredictOptions(UseTokenizerTemplate=True, Messages=messages, **fields)


def test_plain_prompt_is_used_as_given(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(pb.PredictOptions(Prompt="Once upon"), tokenizer)
    assert p.text == "Once upon"
    assert p.token_ids == tuple(tokenizer.encode("Once upon"))
    assert p.token_ids[0] == tokenizer.bos_token_id
    assert p.starts_in_reasoning is False
    assert p.enable_thinking is None


def test_prompt_used_when_template_flag_off_or_no_messages(tokenizer: TokenizerWrapper) -> None:
    assert prepare_prompt(pb.PredictOptions(Prompt="x", Messages=CHAT), tokenizer).text == "x"
    assert (
        prepare_prompt(pb.PredictOptions(Prompt="y", UseTokenizerTemplate=True), tokenizer).text
        == "y"
    )


def test_template_renders_turns(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(request(Prompt="ignored"), tokenizer)
    assert "<|im_start|>system\nYou are terse.<|im_end|>" in p.text
    assert "<|im_start|>user\nHi there<|im_end|>" in p.text
    assert p.text.endswith("<|im_start|>assistant\n<think>\n")
    assert p.starts_in_reasoning is True  # default: TokenizerWrapper passes has_thinking
    assert p.token_ids == tuple(encode(tokenizer, p.text))


def test_tools_json_appears(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(request(Tools=json.dumps(TOOLS)), tokenizer)
    assert "# Tools" in p.text
    assert json.dumps(TOOLS[0]) in p.text
    assert "You are terse." in p.text


def test_tool_choice_none_offers_no_tools(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(request(Tools=json.dumps(TOOLS), ToolChoice="none"), tokenizer)
    assert "# Tools" not in p.text and json.dumps(TOOLS[0]) not in p.text
    p = prepare_prompt(request(Tools=json.dumps(TOOLS), ToolChoice="auto"), tokenizer)
    assert json.dumps(TOOLS[0]) in p.text


def test_tool_calls_arguments_become_objects(tokenizer: TokenizerWrapper) -> None:
    calls = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "broken", "arguments": "{oops"}},
    ]
    msgs = [
        *CHAT,
        message("assistant", "", tool_calls=json.dumps(calls), reasoning_content="Need weather."),
        message("tool", "18C sunny", tool_call_id="c1", name="get_weather"),
    ]
    p = prepare_prompt(request(msgs), tokenizer)
    assert (
        '{"name": "get_weather", "arguments": {"city": "Paris"}, "args_is_mapping": true}' in p.text
    )
    # not JSON: kept verbatim as a string
    assert '{"name": "broken", "arguments": "{oops", "args_is_mapping": false}' in p.text
    assert "<think>\nNeed weather.\n</think>" in p.text
    assert '<tool_response id="c1">\n18C sunny\n</tool_response>' in p.text


def test_name_forwarded(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(request([message("user", "hey", name="alice")]), tokenizer)
    assert "<|im_start|>user name=alice\nhey<|im_end|>" in p.text


@pytest.mark.parametrize(("flag", "expected"), [("false", False), ("FALSE", False), ("True", True)])
def test_enable_thinking_changes_rendering(
    tokenizer: TokenizerWrapper, flag: str, expected: bool
) -> None:
    p = prepare_prompt(request(Metadata={"enable_thinking": flag}), tokenizer)
    assert p.enable_thinking is expected
    assert p.starts_in_reasoning is expected
    if expected:
        assert p.text.endswith("<think>\n")
    else:
        assert p.text.endswith("<think>\n\n</think>\n\n")


def test_chat_template_kwargs_merged_and_win(tokenizer: TokenizerWrapper) -> None:
    metadata = {
        "enable_thinking": "true",
        "chat_template_kwargs": json.dumps({"greeting": "hello", "enable_thinking": False}),
    }
    p = prepare_prompt(request(Metadata=metadata), tokenizer)
    assert p.text.startswith("[hello]")
    assert p.enable_thinking is False
    assert p.starts_in_reasoning is False


@pytest.mark.parametrize(
    ("fields", "name"),
    [
        ({"Tools": "{nope"}, "Tools"),
        ({"Tools": '{"a": 1}'}, "Tools"),
        ({"Metadata": {"enable_thinking": "yes"}}, "Metadata.enable_thinking"),
        ({"Metadata": {"chat_template_kwargs": "{bad"}}, "Metadata.chat_template_kwargs"),
        ({"Metadata": {"chat_template_kwargs": "[1]"}}, "Metadata.chat_template_kwargs"),
        (
            {"Metadata": {"chat_template_kwargs": '{"tokenize": true}'}},
            "Metadata.chat_template_kwargs",
        ),
        ({"Messages": [message("assistant", tool_calls="{bad")]}, r"Messages\[0\]\.tool_calls"),
        ({"Messages": [message("assistant", tool_calls='{"a": 1}')]}, r"Messages\[0\]\.tool_calls"),
        ({"Messages": [message("", "x")]}, r"Messages\[0\]\.role"),
    ],
)
def test_bad_json_names_the_field(tokenizer: TokenizerWrapper, fields: dict, name: str) -> None:
    fields = {"Messages": CHAT, **fields}
    req = pb.PredictOptions(UseTokenizerTemplate=True, **fields)
    with pytest.raises(ValueError, match=rf"PredictOptions\.{name}"):
        prepare_prompt(req, tokenizer)


def test_template_error_becomes_value_error() -> None:
    tok = make_tokenizer("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(ValueError, match=r"PredictOptions\.Messages.*roles must alternate"):
        prepare_prompt(request(), tok)


def test_no_double_bos() -> None:
    tok = make_tokenizer()
    bos = tok.bos_token_id
    ids = encode(tok, "<s>hello")
    assert ids.count(bos) == 1
    assert ids[0] == bos
    assert encode(tok, "hello")[0] == bos  # normal behaviour adds it
    assert encode(tok, "hello").count(bos) == 1

    p = prepare_prompt(request(Metadata={"chat_template_kwargs": '{"bos_first": true}'}), tok)
    assert p.text.startswith("<s>")
    assert p.token_ids.count(bos) == 1


def test_no_chat_template_falls_back_to_join(caplog: pytest.LogCaptureFixture) -> None:
    tok = make_tokenizer(chat_template=None)
    with caplog.at_level(logging.WARNING, logger="localai.mlx.prompting.render"):
        p = prepare_prompt(request(), tok)
    assert p.text == "You are terse.\nHi there"
    assert "no chat template" in caplog.text


def test_tokenizer_without_thinking_never_starts_in_reasoning() -> None:
    tok = make_tokenizer(thinking=False)
    assert not tok.has_thinking
    assert prepare_prompt(request(), tok).starts_in_reasoning is False


def test_raw_prompt_ending_in_think_starts_in_reasoning(tokenizer: TokenizerWrapper) -> None:
    p = prepare_prompt(pb.PredictOptions(Prompt="Q?\n<think>\n  "), tokenizer)
    assert p.starts_in_reasoning is True
    p = prepare_prompt(pb.PredictOptions(Prompt="<think>x</think>"), tokenizer)
    assert p.starts_in_reasoning is False


def test_empty_prompt_without_bos_is_rejected() -> None:
    tok = make_tokenizer()
    tok._tokenizer._tokenizer.post_processor = None  # no BOS: empty text gives no ids
    with pytest.raises(ValueError, match=r"PredictOptions\.Prompt"):
        prepare_prompt(pb.PredictOptions(), tok)


def test_trailing_assistant_message_is_continued(tokenizer: TokenizerWrapper) -> None:
    msgs = [*CHAT, message("assistant", '{"answer": "')]
    p = prepare_prompt(request(msgs), tokenizer)
    assert p.spec.continue_final
    # Cut right after the prefilled content: no end of turn, no new generation prompt.
    assert p.text.endswith(
        '<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n{"answer": "'
    )
    assert p.token_ids == tuple(encode(tokenizer, p.text))
    assert not p.starts_in_reasoning


def test_continued_message_that_opens_a_think_block_starts_in_reasoning(
    tokenizer: TokenizerWrapper,
) -> None:
    p = prepare_prompt(request([*CHAT, message("assistant", "<think>\nFirst,")]), tokenizer)
    assert p.text.endswith("assistant\n<think>\nFirst,")
    assert p.starts_in_reasoning


def test_template_that_drops_the_final_content_cannot_be_continued() -> None:
    tok = make_tokenizer("{% for m in messages %}{{ m.role }}{% endfor %}")
    with pytest.raises(ValueError, match="cannot be continued"):
        prepare_prompt(request([*CHAT, message("assistant", "x")]), tok)
