"""The fast tier (``make test-fast``): no model (neither the embedded model's weights nor
its tokenizer), no backend process; well under a minute. Its tests carry no tier marker."""

from __future__ import annotations

import pytest
from mlx_lm.tokenizer_utils import TokenizerWrapper
from toy_tokenizer import toy_tokenizer


@pytest.fixture(scope="module")
def tok() -> TokenizerWrapper:
    """The toy tokenizer of tests/toy_tokenizer.py, loaded by mlx-lm."""
    return toy_tokenizer()
