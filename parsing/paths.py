"""Where a directory named in a request may be: ``safe_cache_dir`` confines LocalAI's
``PromptCachePath`` to its models directory (read by ``params.py``)."""

from __future__ import annotations

import os
from pathlib import Path


def safe_cache_dir(prompt_cache_path: str, model_dir: str) -> Path:
    """The disk-cache directory for LocalAI's ``PromptCachePath``, confined to ``model_dir``.

    LocalAI sends ``PromptCachePath`` as its models directory (``ModelOptions.ModelPath``)
    joined with the model YAML's ``prompt_cache_path``; it creates only the parent. A
    relative ``prompt_cache_path`` is taken under ``model_dir``. Symlinks are resolved
    before the check, so a link cannot lead outside either.

    Args:
        prompt_cache_path: ``PredictOptions.PromptCachePath`` (or load option
            ``prompt_cache_dir``).
        model_dir: the models directory LocalAI names (``ModelOptions.ModelPath``).

    Returns:
        The resolved absolute directory (it may not exist yet; ``DiskCache`` creates it).

    Raises:
        ValueError: if either is empty or holds a NUL byte, or the path resolves to
            ``model_dir`` itself or anywhere outside it.
    """
    for name, value in (("PromptCachePath", prompt_cache_path), ("model directory", model_dir)):
        if not value or not value.strip():
            raise ValueError(f"{name} is empty; the prompt cache directory needs both")
        if "\0" in value:
            raise ValueError(f"{name} contains a NUL byte")
    root = Path(os.path.realpath(model_dir))
    path = Path(prompt_cache_path)
    if not path.is_absolute():
        path = root / path
    real = Path(os.path.realpath(path))
    if real == root or root not in real.parents:
        raise ValueError(
            f"PromptCachePath {prompt_cache_path!r} resolves to {real}, which is not inside "
            f"the models directory {root}; set prompt_cache_path in the model's YAML to a "
            "relative path such as 'cache/<model name>'"
        )
    return real
