"""mlx-lm's own tool parser modules (mlx_lm/tool_parsers/), as formats.

minimax_m2 and longcat are registered formats (vLLM's names) read by mlx-lm's modules of
those names. Every module mlx-lm may infer from a chat template (`_infer_tool_parser` in
mlx_lm/tokenizer_utils.py; no LocalAI `tool_parser` name) is described here as a format
too, unregistered, named as its module: its markers, how its arguments stream and its
tool-call grammar, so that `tool_formats.in_effect` finds them by the parser function
(`tool_formats.for_parser`), never by a name.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlx_lm.tool_parsers import (
    function_gemma,
    gemma4,
    glm47,
    json_tools,
    kimi_k2,
    kimi_k3,
    laguna,
    minicpm5,
    mistral,
    muse_spark,
    pythonic,
    qwen3_coder,
)
from mlx_lm.tool_parsers import longcat as _longcat
from mlx_lm.tool_parsers import minimax_m2 as _minimax_m2

from decoding import call_formats
from decoding.tool_calls import JSON_OBJECT, XmlStream
from decoding.tool_formats import ToolFormat, describe_mlx_lm, register
from decoding.tool_formats import glm as _glm
from decoding.tool_formats import kimi_k2 as _kimi_k2
from decoding.tool_formats import mistral as _mistral
from decoding.tool_formats import qwen3_xml as _qwen3_xml

MINIMAX_M2 = register(
    ToolFormat(
        "minimax_m2",
        _minimax_m2.parse_tool_call,
        _minimax_m2.tool_call_start,
        _minimax_m2.tool_call_end,
        grammar=call_formats.GRAMMARS["minimax_m2"],
        stream=XmlStream(
            call_open=r"\s*<invoke name=(?P<name>[^>]+)>",
            param_first=r"\s*<parameter name=(?P<key>[^>]+)>",
            param_next=r"\s*<parameter name=(?P<key>[^>]+)>",
            value_close="</parameter>",
            call_close=r"\s*</invoke>",
            synth_close="</invoke>",
            trim="strip",
        ),
    )
)
LONGCAT = register(
    ToolFormat(
        "longcat",
        _longcat.parse_tool_call,
        _longcat.tool_call_start,
        _longcat.tool_call_end,
        whole="mlx-lm's parser reads the block when it closes",
        # vLLM's longcat parser is its hermes one: the content is the text before the first
        # call, None when that is empty (tests/tool_parsers/test_longcat_tool_parser.py)
        blank_content=True,
    )
)


def _module(module: Any, **fields: Any) -> ToolFormat:
    name = module.__name__.rsplit(".", 1)[-1]
    start, end = module.tool_call_start, module.tool_call_end
    return ToolFormat(name, module.parse_tool_call, start, end, **fields)


_WHOLE = "mlx-lm's parser reads the block when it closes"
MLX_LM = (
    # hermes' grammar: `<tool_call>{"name", "arguments"}</tool_call>`
    _module(json_tools, stream=JSON_OBJECT, grammar=call_formats.json_tools),
    _module(mistral, stream=_mistral.MISTRAL.stream),
    _module(kimi_k2, stream=_kimi_k2.STREAM),
    _module(qwen3_coder, stream=_qwen3_xml.STREAM),
    # mlx-lm's glm47 (laguna is the same parser) strips string values
    _module(glm47, stream=dataclasses.replace(_glm.STREAM, trim="strip")),
    _module(laguna, stream=dataclasses.replace(_glm.STREAM, trim="strip")),
    # LFM2's `<|tool_call_start|>[...]<|tool_call_end|>`: the pythonic grammar given those
    # markers writes that block.
    _module(pythonic, grammar=call_formats.GRAMMARS["pythonic"], whole=_WHOLE),
    _module(gemma4, whole=_WHOLE),
    _module(function_gemma, whole=_WHOLE),
    _module(minicpm5, whole=_WHOLE),
    _module(muse_spark, whole=_WHOLE),
    _module(kimi_k3, whole=_WHOLE),
    MINIMAX_M2,
    LONGCAT,
)
for _fmt in MLX_LM:
    describe_mlx_lm(_fmt)
