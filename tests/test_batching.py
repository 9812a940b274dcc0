"""Token-budget micro-batches (trainer.micro_batch_tokens, reward.max_batch_tokens): every
sequence once, no forward above the budget (padding included) unless a sequence alone is
longer, the same number of micro-batches on every rank under lock-step."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlpr.model.batching import split_batches, token_budget_batches, width_batches
from rlpr.train.update import Sample, micro_batches

pytestmark = pytest.mark.unit


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=40), st.integers(1, 1000))
def test_token_budget_batches_cover_every_sequence_within_the_budget(lengths, budget):
    batches = token_budget_batches(lengths, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for b in batches:
        padded = len(b) * max(lengths[i] for i in b)
        assert padded <= budget or len(b) == 1
        assert [lengths[i] for i in b] == sorted((lengths[i] for i in b), reverse=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 80), st.integers(0, 200)), max_size=40), st.integers(1, 4000))
def test_width_batches_cover_every_row_within_the_budget_and_the_waste(rows, budget):
    widths, totals = [w for w, _ in rows], [w + past for w, past in rows]
    batches = width_batches(widths, totals, budget)
    assert sorted(i for b in batches for i in b) == list(range(len(rows)))
    for b in batches:
        assert len(b) * max(totals[i] for i in b) <= budget or len(b) == 1
        assert min(widths[i] for i in b) >= 0.75 * max(widths[i] for i in b)


def test_an_outlier_continuation_gets_its_own_forward():
    """The demo's case: 29 rows continue their caches by 22-24 tokens, a few re-tokenize apart early."""
    widths = [23] * 29 + [30, 44, 50, 73]
    batches = width_batches(widths, [w + 100 for w in widths], 100_000)
    assert [sorted(widths[i] for i in b) for b in batches] == [[73], [44, 50], [23] * 29 + [30]]


def test_split_batches_by_count_or_budget():
    lengths = [5, 9, 2, 7, 3]
    assert split_batches(lengths, 2) == [[1, 3], [0, 4], [2]]  # longest first, 2 at a time
    assert split_batches(lengths, 2, sort=False) == [[0, 1], [2, 3], [4]]
    assert split_batches(lengths, 2, max_tokens=18) == [[1, 3], [0, 4, 2]]  # 9 x 2, then 5 x 3
    assert split_batches(lengths, 2, max_tokens=4) == [[1], [3], [0], [4], [2]]  # a longer one alone


@pytest.mark.parametrize("share", [False, True])
def test_micro_batches_hold_at_most_the_budget(share):
    g = torch.Generator().manual_seed(0)
    samples = []
    for k in range(3):
        prompt = torch.randint(3, 100, (4 + 2 * k,), generator=g).tolist()
        for i in range(5):
            samples.append(Sample(prompt + [7] * (1 + (3 * i + k) % 11), len(prompt), 0.0))
    batches = micro_batches(samples, 1, 0, share, max_tokens=48)
    assert sorted(id(s) for mb in batches for s in mb.samples) == sorted(id(s) for s in samples)
    for mb in batches:
        assert len(mb.samples) * max(len(s.input_ids) for s in mb.samples) <= 48
        if share:  # one prompt per micro-batch, so it runs once for it
            assert len({tuple(s.input_ids[:s.prompt_len]) for s in mb.samples}) == 1
    assert len(batches) < len(samples)  # the budget packs several sequences per forward


@given(st.lists(st.integers(1, 200), min_size=1, max_size=40), st.sampled_from([0.25, 0.5]))
def test_similar_widths_keeps_every_row_once_and_bounds_its_padding(widths, waste):
    from rlpr.model.batching import similar_widths

    groups = similar_widths(widths, waste)
    assert sorted(i for g in groups for i in g) == list(range(len(widths)))
    for g in groups:
        widest = max(widths[i] for i in g)
        assert all(widths[i] >= (1 - waste) * widest for i in g)
    heads = [widths[g[0]] for g in groups]
    assert heads == sorted(heads, reverse=True)  # widest first: a group ends where the next row is too short


def test_the_update_splits_one_prompts_responses_by_width():
    """micro_batches with a shared prefix: responses of one prompt in micro-batches of similar widths
    (5- and 60-token responses are not padded together), every response once, the prefix kept."""
    from rlpr.train.update import Sample, micro_batches

    prompt = [7, 8, 9]
    samples = [Sample(prompt + [1] * n, len(prompt), 0.5) for n in (60, 5, 58, 6, 29, 59)]
    batches = micro_batches(samples, 8, 0, share_prefix=True)
    assert all(mb.prefix == prompt for mb in batches)
    assert sorted(s.response_len for mb in batches for s in mb.samples) == [5, 6, 29, 58, 59, 60]
    assert [sorted(s.response_len for s in mb.samples) for mb in batches] == [[58, 59, 60], [29], [5, 6]]
