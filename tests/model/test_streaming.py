"""Streamed UTF-8 through the real engine and servicer, over gRPC: a scripted model
(tests/scripted.py) replays the real SmolLM2 tokenizer's ids of characters it splits over
several byte-level tokens; every chunk holds whole characters only."""

from __future__ import annotations

from inprocess import InProcessServer
from scripted import ScriptedModel

import backend_pb2
import params
from prompting import render as prompt_mod
from seam.tokenizer import vocab_size


def test_multibyte_characters_split_over_tokens_stream_whole(smollm):
    text = "Zoë says 🙂 and 日本語 — Straße."
    token_ids = smollm.encode(text, add_special_tokens=False)
    # The tokenizer really splits some characters over several byte-level tokens.
    pieces = [smollm.decode([t]) for t in token_ids]
    assert any("\ufffd" in p for p in pieces)
    model = ScriptedModel(vocab_size(smollm), 2)
    srv = InProcessServer(model, smollm)
    try:
        req = backend_pb2.PredictOptions(Prompt="Say:", Tokens=len(token_ids) + 5)
        prompt_len = len(prompt_mod.prepare_prompt(params.prompt_spec(req), smollm).token_ids)
        model.set_script(prompt_len, token_ids)
        replies = list(srv.stub.PredictStream(req))
        chunks = [r.message.decode("utf-8") for r in replies]
        assert all("\ufffd" not in c for c in chunks)
        assert "".join(chunks) == text
        assert srv.stub.Predict(req).message.decode("utf-8") == text
    finally:
        srv.stop()
