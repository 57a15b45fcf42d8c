"""vLLM's own parser test cases, per parser name LocalAI's importer writes (`tool_parser:` /
`reasoning_parser:` options): the calls (names, arguments as JSON, order), content and
reasoning this backend extracts must equal what vLLM's parser of that name extracts.

The cases, each naming the vLLM test file it comes from: tests/vllm_parser_cases.py. The
model output is fed through `OutputPipeline`
twice on a byte-level toy tokenizer: as one token holding the whole text, and byte by byte
(every marker split across tokens); both must give vLLM's result, the streamed pieces must
join to the same calls, and no call may be streamed and then withdrawn (a withdrawn call
cannot be said on LocalAI's proto, so PredictStream would show what Predict leaves out).

Where this backend differs from vLLM for a reason, the case is in KNOWN_DIFFERENCES with
vLLM's result, ours, and the reason; ours is asserted so that a change shows.
Over real gRPC (Predict equals PredictStream): tests/fast/test_parser_references_grpc.py.
Wholesale: each test id of each vLLM file in `IDS` is a case, a known difference or not
applicable with a reason (test_every_vllm_test_id_is_a_case).
"""

from __future__ import annotations

import json

import pytest
from helpers import feed_output
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, TokenizerWrapper
from toy_tokenizer import build_hf
from vllm_parser_cases import CASES, IDS, KNOWN_DIFFERENCES, NOT_APPLICABLE, Case, expected

from decoding.output import OutputPipeline
from decoding.parsers import apply_parser_overrides


@pytest.fixture(scope="module")
def hf():
    """Byte-level BPE (id b = byte b) plus each case's whole output as one token."""
    texts = [c.output for c in CASES] + [c.output for c, _ in KNOWN_DIFFERENCES]
    return build_hf([t for t in texts if t], markers=False)


def extract(hf, case: Case, whole: bool) -> tuple[dict, bool]:
    """(what the pipeline extracted, whether a streamed call was withdrawn)."""
    tok = apply_parser_overrides(
        TokenizerWrapper(hf, BPEStreamingDetokenizer), case.tool, case.reasoning_parser
    )
    pipe = OutputPipeline(tok, initial_state=case.initial, tools=list(case.tools) or None)
    pieces = feed_output(hf, pipe, case.output, whole)
    calls = [(c.name, json.loads(c.arguments)) for c in pipe.tool_calls]
    withdrawn = any(p.dropped for p in pieces)
    indices = [c.index for c in pipe.tool_calls]
    # a withdrawn call's index is never reused: later calls' indices skip it
    assert indices == (sorted(set(indices)) if withdrawn else list(range(len(calls))))
    got = {"calls": calls, "content": pipe.content, "reasoning": pipe.reasoning}
    return got, withdrawn


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"{c.tool or '-'}/{c.reasoning_parser or '-'}/{c.id}"
)
def test_extracts_what_vllm_extracts(hf, case, whole):
    got, withdrawn = extract(hf, case, whole)
    assert got == expected(case), case.source
    assert not withdrawn  # PredictStream showed nothing Predict leaves out


@pytest.mark.parametrize("whole", [True, False], ids=["one_piece", "byte_by_byte"])
@pytest.mark.parametrize(("case", "ours"), KNOWN_DIFFERENCES, ids=lambda c: getattr(c, "id", ""))
def test_known_differences_from_vllm(hf, case, ours, whole):
    assert case.why  # every known difference says why
    got, withdrawn = extract(hf, case, whole)
    want = {**expected(case), **{k: v for k, v in ours.items() if k != "withdrawn"}}
    assert got == want, case.why
    if "withdrawn" in ours and not whole:
        assert withdrawn


def test_every_vllm_test_id_is_a_case():
    """Wholesale, for each vLLM file in IDS: each of its test ids is a case's, a known
    difference's or not applicable with a reason, and no case names an id the file lacks."""
    every_case = CASES + [c for c, _ in KNOWN_DIFFERENCES]
    for source, ids in IDS.items():
        assert len(ids) == len(set(ids)), source
        cases = {i for c in every_case if c.source == source for i in c.vllm_ids}
        not_applicable = {i for s, i in NOT_APPLICABLE if s == source}
        missing = [i for i in ids if i not in cases | not_applicable]
        assert not missing, (source, missing)
        extra = (cases | not_applicable) - set(ids)  # a case's id the file does not have
        assert not extra, (source, extra)
        assert not cases & not_applicable, source
    assert all(NOT_APPLICABLE.values())  # every one says why
