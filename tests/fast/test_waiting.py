"""The tests' waiting helpers (tests/helpers.py): a wait that runs out fails loudly."""

from __future__ import annotations

import itertools

import pytest
from helpers import never, wait_until


def test_wait_until_returns_the_first_truthy_value() -> None:
    calls = itertools.count()
    assert wait_until(lambda: next(calls) >= 2 and "ready", 5, interval=0.001) == "ready"


def test_wait_until_raises_on_timeout_with_the_last_value_and_the_explanation() -> None:
    with pytest.raises(TimeoutError) as info:
        wait_until(lambda: 0, 0.05, interval=0.01, explain=lambda: "Status: BUSY")
    assert str(info.value) == "not within 0.05 s (last value 0): Status: BUSY"


def test_never_holds_only_while_the_predicate_stays_false() -> None:
    assert never(lambda: False, 0.05, interval=0.01)
    calls = itertools.count()
    assert not never(lambda: next(calls) == 3, 5, interval=0.001)
