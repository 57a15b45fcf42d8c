"""Training data: local JSONL in the formats mlx-lm reads (mlx_lm/tuner/datasets.py:
``{"messages": [...]}``, ``{"prompt": ..., "completion": ...}``, ``{"text": ...}``), each
row checked and tokenized up front so a bad row fails the job naming its file and line.

mlx-lm's own reader (``load_local_dataset``) runs ``json.loads`` over the lines (no line
number on a parse error) and picks the format from the first row only: a later row of
another shape fails with a KeyError at whatever training step reaches it. The tokenizing
stays mlx-lm's (``create_dataset`` picks its ChatDataset / CompletionsDataset /
TextDataset, whose ``process`` renders the chat template and masks the prompt).

``dataset_source`` is a ``.jsonl`` file (the training rows) or a directory with
``{split}.jsonl`` (``dataset_split``, default train) and optionally ``valid.jsonl`` (the
evaluation rows), mlx-lm's layout.
"""

from __future__ import annotations

import json
import types
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

MAX_ERRORS = 10  # bad lines named in one message


@dataclass(frozen=True)
class Rows:
    """Tokenized rows, as mlx-lm's ``iterate_batches`` reads them: (tokens, prompt offset)."""

    path: str
    fmt: str
    items: list[tuple[list[int], int]]
    longest: int

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[list[int], int]:
        return self.items[i]


def _format_of(row: dict[str, Any]) -> str:
    # The order of mlx_lm.tuner.datasets.create_dataset.
    if "prompt" in row and "completion" in row:
        return "completions"
    if "messages" in row:
        return "chat"
    if "text" in row:
        return "text"
    return ""


def _row_problem(row: Any, fmt: str) -> str:
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    got = _format_of(row)
    if not got:
        return (
            "no 'messages', 'prompt'+'completion' or 'text' field (keys: "
            + ", ".join(sorted(row)[:8])
            + ")"
        )
    if got != fmt:
        return f"a {got} row in a {fmt} dataset (every row must have the first row's format)"
    if fmt == "completions":
        for key in ("prompt", "completion"):
            if not isinstance(row[key], str):
                return f"'{key}' must be a string"
    elif fmt == "text":
        if not isinstance(row["text"], str) or not row["text"]:
            return "'text' must be a non-empty string"
    else:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            return "'messages' must be a non-empty list"
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                return f"messages[{i}] must be an object with a 'role'"
            if not isinstance(m.get("content", ""), str | list):
                return f"messages[{i}].content must be a string or a list of parts"
    return ""


def read(path: Path) -> tuple[str, list[tuple[int, dict[str, Any]]]]:
    """(format, [(line number, row)]) of a JSONL file; ValueError naming bad lines."""
    rows: list[tuple[int, dict[str, Any]]] = []
    errors: list[str] = []
    fmt = ""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ValueError(f"dataset {path}: not UTF-8 text ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            errors.append(f"line {number}: not valid JSON ({exc.args[0].split(':')[0]})")
            continue
        if not fmt and isinstance(row, dict):
            fmt = _format_of(row)
        problem = _row_problem(row, fmt) if fmt else _row_problem(row, "chat")
        if problem:
            errors.append(f"line {number}: {problem}")
        else:
            rows.append((number, row))
    if errors:
        more = f" (and {len(errors) - MAX_ERRORS} more)" if len(errors) > MAX_ERRORS else ""
        raise ValueError(f"dataset {path}: " + "; ".join(errors[:MAX_ERRORS]) + more)
    if not rows:
        raise ValueError(f"dataset {path} has no rows")
    return fmt, rows


def tokenize(path: Path, tokenizer: TokenizerWrapper, mask_prompt: bool | None) -> Rows:
    """Read and tokenize ``path`` with mlx-lm's dataset classes. ``mask_prompt`` None:
    masked for prompt/completion rows, not for chat and text rows (trl's SFT defaults)."""
    from mlx_lm.tuner.datasets import create_dataset

    fmt, rows = read(path)
    mask = (fmt == "completions") if mask_prompt is None else mask_prompt
    if mask and fmt == "text":
        raise ValueError(f"dataset {path}: mask_prompt needs prompt/completion or chat rows")
    dataset = create_dataset(
        [row for _, row in rows], tokenizer, types.SimpleNamespace(mask_prompt=mask)
    )
    items: list[tuple[list[int], int]] = []
    errors = []
    for number, row in rows:
        try:
            tokens, offset = dataset.process(row)
        except Exception as exc:  # the template or tokenizer refused this row
            errors.append(f"line {number}: {type(exc).__name__}: {exc}")
            continue
        if offset >= len(tokens):
            errors.append(f"line {number}: nothing to learn after the prompt")
            continue
        items.append((list(tokens), int(offset)))
    if errors:
        raise ValueError(f"dataset {path}: " + "; ".join(errors[:MAX_ERRORS]))
    return Rows(str(path), fmt, items, max(len(t) for t, _ in items))


def locate(source: str, split: str) -> tuple[Path, Path | None]:
    """(training file, validation file or None) of ``dataset_source``."""
    src = Path(source)
    if src.is_file():
        return src, None
    train = src / f"{split}.jsonl"
    if not train.is_file():
        found = sorted(p.name for p in src.glob("*.jsonl"))
        raise ValueError(
            f"dataset directory {src} has no {split}.jsonl (dataset_split {split!r}); "
            f"it holds: {', '.join(found) or 'no .jsonl files'}"
        )
    valid = src / "valid.jsonl"
    return train, (valid if valid.is_file() and split != "valid" else None)
