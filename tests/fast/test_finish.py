"""How a sequence ends (decoding/finish.py): the one decision every runner calls, the
reasons' words (the metrics' label and the request log's ``finish=``), and no second
place that spells a reason out."""

from __future__ import annotations

import ast
import json

import pytest
from helpers import ROOT

from decoding.finish import FinishReason, finish_of, settled

EOS = frozenset({2, 7})


@pytest.mark.parametrize(
    ("token", "emitted", "max_tokens", "stops", "expected"),
    [
        (5, 1, 4, True, None),  # neither EOS nor the last token
        (2, 1, 4, True, FinishReason.STOP),  # EOS ends it
        (7, 1, 4, True, FinishReason.STOP),  # any of the EOS ids
        (2, 1, 4, False, None),  # IgnoreEOS: EOS is one more token
        (5, 4, 4, True, FinishReason.LENGTH),  # the max_tokens-th token
        (5, 5, 4, True, FinishReason.LENGTH),  # past it (an accepted draft ran over)
        (2, 4, 4, True, FinishReason.STOP),  # EOS as the last allowed token: stop wins
        (2, 4, 4, False, FinishReason.LENGTH),
    ],
)
def test_finish_of(token, emitted, max_tokens, stops, expected):
    assert finish_of(token, emitted, max_tokens, stops=stops, eos=EOS) is expected


def test_a_matched_stop_string_settles_any_end_as_stop():
    assert settled(FinishReason.LENGTH, stop_matched=True) is FinishReason.STOP
    assert settled(FinishReason.CANCELLED, stop_matched=True) is FinishReason.STOP
    assert settled(FinishReason.LENGTH, stop_matched=False) is FinishReason.LENGTH
    assert settled(FinishReason.CANCELLED, stop_matched=False) is FinishReason.CANCELLED


def test_the_reasons_are_the_words_clients_and_metrics_saw():
    assert [r.value for r in FinishReason] == ["stop", "length", "cancelled"]
    reason = FinishReason.LENGTH
    # Compared, hashed, logged, formatted and serialized as its word.
    assert reason == "length" and {"length": 1}[reason] == 1
    assert f"finish={reason}" == "finish=length" and str(reason) == "length"
    assert json.dumps({"finish_reason": reason}) == '{"finish_reason": "length"}'
    assert FinishReason("stop") is FinishReason.STOP


PRODUCT = ("batch", "decoding", "distributed", "edge", "engine", "prompting", "tasks")


def test_no_module_spells_a_finish_reason_out():
    """Every reason is a `FinishReason` member: the words live in decoding/finish.py."""
    words = {r.value for r in FinishReason}
    found = []
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == ROOT / "decoding" / "finish.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            docstrings = {
                id(node.body[0].value)
                for node in ast.walk(tree)
                if isinstance(
                    node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
                )
                and node.body
                and isinstance(node.body[0], ast.Expr)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and node.value in words
                    and id(node) not in docstrings
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    assert found == []
