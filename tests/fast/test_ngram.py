"""ngram_spec without a model: the n-gram index (longest, then most recent match) and the
drafting gate's checks of its options. Speculation against plain decoding on real models:
tests/model/test_ngram.py.
"""

from __future__ import annotations

import pytest

from decoding.ngram_spec import DraftGate, NgramIndex

# ---- the index --------------------------------------------------------------------


def test_index_prefers_longest_then_most_recent_match():
    index = NgramIndex(1, 3)
    index.extend([1, 2, 3, 9, 2, 3, 8, 5, 2, 3, 7, 1, 2, 3])
    # (1, 2, 3) occurred once earlier, at the start: its continuation wins over the more
    # recent (2, 3) -> 7 and (3,) -> 7.
    assert index.propose(2) == [9, 2]
    index.extend([4])
    assert index.propose(3) == []  # 4 never occurred before
    index.extend([2, 3])
    assert index.propose(1) == [4]  # (4, 2, 3) is new; (2, 3) was last followed by 4


def test_index_continues_a_period_and_respects_ngram_min():
    index = NgramIndex(2, 2)
    index.extend([5, 6, 5, 6])
    # (5, 6) last occurred at the start, 2 tokens back: the draft repeats the period.
    assert index.propose(5) == [5, 6, 5, 6, 5]
    only_pairs = NgramIndex(2, 3)
    only_pairs.extend([1, 2, 3, 2])
    assert only_pairs.propose(3) == []  # (3, 2) and (2, 3, 2) are new; 1-grams ignored


@pytest.mark.parametrize(
    ("options", "field"),
    [
        (dict(width=-1), "num_draft_tokens"),
        (dict(ngram_min=0), "ngram_min"),
        (dict(ngram_max=1, ngram_min=2), "ngram_size"),
    ],
)
def test_bad_options_name_the_option(options, field):
    kwargs = dict(width=3, ngram_max=3, tokens=[1, 2]) | options
    with pytest.raises(ValueError, match=field):
        DraftGate(**kwargs)
