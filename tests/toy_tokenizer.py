"""A toy tokenizer with Qwen/Hermes-style markers, built with the `tokenizers` library (no
model weights): a byte-level BPE whose ids 0..255 are the single bytes, plus whole-word
``PIECES`` and the think / tool-call markers, saved and loaded back through mlx-lm's own
``tokenizer_utils.load`` so that thinking, the tool parser and the streaming detokenizer
are inferred exactly as for a real model.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from mlx_lm import tokenizer_utils
from mlx_lm.tokenizer_utils import TokenizerWrapper
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from decoding.output import _byte_decoder

EOS_TEXT = "<|im_end|>"
MARKERS = ["<think>", "</think>", "<tool_call>", "</tool_call>"]
SPECIALS = [EOS_TEXT, "<|im_start|>"]
# A Qwen/Hermes-style template: mlx-lm infers the json_tools parser from "<tool_call>" plus
# "tool_call.name"; enable_thinking leaves the think block open in the prompt.
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for tool_call in m.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ tool_call.name }}", "arguments": {{ tool_call.arguments | tojson }}}\n'
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is false %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}"
    "{% endif %}"
)
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PIECES = [
    "Hello", " world", "!", "\n", "\n\n", "Let", " me", " think", "Sure", "The", " EN",
    "D!", "xENDy", "END", " ST", "OP", " more", "ST", "ART", "Answer", "Thinking", "plan",
    '{"name": "get_weather", ', '"arguments": {"city": "Paris"}}', WEATHER,
    '{"name": "get_time", "arguments": {}}', "{not json", '{"name": "x"',
]  # fmt: skip
TO_CHAR = {b: c for c, b in _byte_decoder().items()}  # byte -> its byte-level character


def byte_level(text: str) -> str:
    return "".join(TO_CHAR[b] for b in text.encode("utf-8"))


def build_hf(pieces, *, markers: bool = True) -> PreTrainedTokenizerFast:
    """Byte-level BPE: id b is byte b, then `pieces`; specials and markers are added tokens."""
    vocab = {TO_CHAR[b]: b for b in range(256)}
    for piece in pieces:
        vocab.setdefault(byte_level(piece), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True) for s in SPECIALS])
    if markers:  # Qwen3 stores its markers as non-special added tokens
        tok.add_tokens([AddedToken(s, special=False) for s in MARKERS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TEXT,
        chat_template=TEMPLATE if markers else None,
        clean_up_tokenization_spaces=False,
    )


def toy_tokenizer() -> TokenizerWrapper:
    """``build_hf(PIECES)`` saved and loaded back by mlx-lm, as a model's tokenizer is."""
    with tempfile.TemporaryDirectory() as tmp:
        build_hf(PIECES).save_pretrained(tmp)
        return tokenizer_utils.load(Path(tmp))


def ids(tok, *parts: str) -> list[int]:
    """Token ids: each part is a marker/special, a vocab piece, or `b:text` for its bytes."""
    vocab = tok.get_vocab()
    out = []
    for part in parts:
        if part.startswith("b:"):
            out += list(part[2:].encode("utf-8"))  # id b is byte b
        else:
            out.append(vocab[part] if part in vocab else vocab[byte_level(part)])
    return out
