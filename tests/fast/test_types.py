"""The type checker: mypy, with the project's configuration (pyproject.toml's [tool.mypy]:
every product module, every function typed, no Any returned as a typed value), must find
nothing. Fails with mypy's own report."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mypy_is_clean_on_the_checked_folders() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    report = (run.stdout + run.stderr).strip()
    assert run.returncode == 0, f"mypy found errors:\n{report}"
    assert report.startswith("Success: no issues found"), report


def test_what_crosses_a_thread_is_a_frozen_dataclass() -> None:
    # Requests in (event loop -> prepare pool -> engine thread), the mailbox's items,
    # results out (engine thread -> event loop), the snapshots other threads read.
    from decoding.output import Delta
    from decoding.tool_calls import ToolCall, ToolCallDelta
    from engine.jobs import Event
    from engine.mailbox import Call, Stop, Submit, Wake
    from engine.model_calls import ModelMetadata
    from engine.prepare import Intake, PreparedRequest
    from engine.scheduler import RequestMetrics
    from engine.status import StatusSnapshot
    from engine.vision_prompt import VisionPreparedPrompt, VisionPrompt
    from params import GenerationParams, GenerationRequest, LoadParams, PromptSpec
    from prompting.render import PreparedPrompt
    from tasks.embedding import EmbeddingOutput
    from tasks.scoring import CandidateResult

    crossing = [
        GenerationRequest, GenerationParams, PromptSpec, LoadParams, Intake, PreparedRequest,
        PreparedPrompt, VisionPreparedPrompt, VisionPrompt, Call, Submit, Wake, Stop, Event,
        Delta, ToolCall, ToolCallDelta, RequestMetrics, StatusSnapshot, ModelMetadata,
        EmbeddingOutput, CandidateResult,
    ]  # fmt: skip
    thawed = [
        c.__name__
        for c in crossing
        if not dataclasses.is_dataclass(c) or not c.__dataclass_params__.frozen
    ]
    assert thawed == []
