"""PPO-clip with clip-higher, loss aggregation and its micro-batch invariance, KL estimators
(spec section 5). Expected numbers are hand-computed literals."""

import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from rlpr.algorithms.losses import (KL_ESTIMATORS, LOSS_AGGREGATIONS, Normaliser, aggregate_loss, kl_k1,
                                    kl_k2, kl_k3, ppo_clip_token_loss)

pytestmark = pytest.mark.unit

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"]


def logs(ratios):
    """logp for the given ratios against old_logp = 0 (float32, as in training)."""
    return torch.log(torch.tensor(ratios, dtype=torch.float32)), torch.zeros(len(ratios))


# ---------------------------------------------------------------------------------------------
# PPO-clip, ratio clipped to [1 - 0.2, 1 + 0.27]
# ---------------------------------------------------------------------------------------------

# (advantage, ratio, loss = max(-A r, -A clip(r, 0.8, 1.27)), clipped indicator)
PPO_CASES = [
    (2.0, 1.5, -2.54, 1.0),   # max(-3.0, -2.54): clipped at 1.27 -> -1.27 * 2
    (2.0, 0.5, -1.0, 0.0),    # max(-1.0, -1.6): unclipped -> -0.5 * 2
    (-2.0, 0.5, 1.6, 1.0),    # max(1.0, 1.6): clipped at 0.8 -> 0.8 * |A|
    (-2.0, 1.5, 3.0, 0.0),    # max(3.0, 2.54): unclipped -> 1.5 * |A|
    (2.0, 1.0, -2.0, 0.0),    # ratio exactly 1
    (-2.0, 1.0, 2.0, 0.0),    # ratio exactly 1
    (0.0, 1.5, 0.0, 0.0),     # zero advantage
    (1.0, 1.2, -1.2, 0.0),    # inside [0.8, 1.27]
    (-1.0, 0.9, 0.9, 0.0),    # inside [0.8, 1.27]
    (1.0, 1.27, -1.27, 0.0),  # at the upper edge (float32 ratio may be a hair off; loss ~ -1.27)
    (-3.0, 2.0, 6.0, 0.0),    # large ratio, negative A: not clipped (pessimistic bound)
    (3.0, 0.1, -0.3, 0.0),    # small ratio, positive A: not clipped
    (-3.0, 0.1, 2.4, 1.0),    # small ratio, negative A: clipped at 0.8 -> 0.8 * 3
    (3.0, 2.0, -3.81, 1.0),   # large ratio, positive A: clipped at 1.27 -> 1.27 * 3
]


@pytest.mark.parametrize("adv,ratio,loss,clipped", PPO_CASES)
def test_ppo_clip_single_token(adv, ratio, loss, clipped):
    logp, old = logs([ratio])
    out, ind = ppo_clip_token_loss(logp, old, torch.tensor([adv]))
    assert float(out[0]) == pytest.approx(loss, abs=1e-5)
    if ratio != 1.27:
        assert float(ind[0]) == clipped
    assert ind.dtype == torch.float32


def test_ppo_clip_vectorised_and_defaults():
    advs = [c[0] for c in PPO_CASES]
    ratios = [c[1] for c in PPO_CASES]
    logp, old = logs(ratios)
    out, ind = ppo_clip_token_loss(logp, old, torch.tensor(advs), 0.2, 0.27)
    out_default, ind_default = ppo_clip_token_loss(logp, old, torch.tensor(advs))
    assert torch.equal(out, out_default) and torch.equal(ind, ind_default)
    torch.testing.assert_close(out, torch.tensor([c[2] for c in PPO_CASES]), atol=1e-5, rtol=0)
    assert out.shape == ind.shape == (len(PPO_CASES),)


def test_ppo_ratio_one_exact():
    # logp == old_logp -> ratio exp(0) == 1 exactly -> loss exactly -A, nothing clipped
    logp = torch.tensor([-0.3, -2.0, -7.5])
    adv = torch.tensor([0.7, -1.25, 3.0])
    out, ind = ppo_clip_token_loss(logp, logp.clone(), adv)
    assert torch.equal(out, -adv)
    assert torch.equal(ind, torch.zeros(3))


def test_ppo_clip_uses_the_log_ratio():
    # ratio = exp(logp - old): logp = -1, old = -1 - log(1.5) -> ratio 1.5; A = 2 -> clipped, -2.54
    old = torch.tensor([-1.0 - math.log(1.5)])
    out, ind = ppo_clip_token_loss(torch.tensor([-1.0]), old, torch.tensor([2.0]))
    assert float(out[0]) == pytest.approx(-2.54, abs=1e-5) and float(ind[0]) == 1.0


def test_ppo_custom_clip_range():
    # symmetric clip 0.1: A=1, r=1.5 -> -1.1 (clipped); A=-1, r=0.5 -> 0.9 (clipped)
    logp, old = logs([1.5, 0.5])
    out, ind = ppo_clip_token_loss(logp, old, torch.tensor([1.0, -1.0]), 0.1, 0.1)
    torch.testing.assert_close(out, torch.tensor([-1.1, 0.9]), atol=1e-6, rtol=0)
    assert ind.tolist() == [1.0, 1.0]


def test_ppo_gradient_zero_when_clipped():
    # d loss / d logp = -A * r when unclipped, 0 when clipped
    # tokens: (A=2, r=1.5) clipped; (A=2, r=0.5) -> -1.0; (A=-2, r=0.5) clipped; (A=-2, r=1.5) -> 3.0
    logp, old = logs([1.5, 0.5, 0.5, 1.5])
    logp.requires_grad_(True)
    out, _ = ppo_clip_token_loss(logp, old, torch.tensor([2.0, 2.0, -2.0, -2.0]))
    out.sum().backward()
    torch.testing.assert_close(logp.grad, torch.tensor([0.0, -1.0, 0.0, 3.0]), atol=1e-5, rtol=0)


# ---------------------------------------------------------------------------------------------
# aggregation modes, hand values
# ---------------------------------------------------------------------------------------------

# seq 0: [1, 2, 3]; seq 1: [4, 5]; seq 2: [6]
VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
SEQ = torch.tensor([0, 0, 0, 1, 1, 2])
NORM = Normaliser(tokens=6, sequences=3)


def test_aggregation_hand_values():
    # token_mean: 21 / 6 = 3.5
    # seq_mean_token_mean: (6/3 + 9/2 + 6/1) / 3 = (2 + 4.5 + 6) / 3 = 12.5 / 3 = 4.1666...
    # seq_mean_token_sum: (6 + 9 + 6) / 3 = 7
    assert float(aggregate_loss(VALUES, SEQ, 3, NORM, "token_mean")) == pytest.approx(3.5, abs=1e-6)
    assert float(aggregate_loss(VALUES, SEQ, 3, NORM)) == pytest.approx(3.5, abs=1e-6)  # default
    assert float(aggregate_loss(VALUES, SEQ, 3, NORM, "seq_mean_token_mean")) == pytest.approx(12.5 / 3, abs=1e-6)
    assert float(aggregate_loss(VALUES, SEQ, 3, NORM, "seq_mean_token_sum")) == pytest.approx(7.0, abs=1e-6)


def test_aggregation_hand_split_into_micro_batches():
    # micro-batch A = seqs {0, 2} (seq idx 0, 1), micro-batch B = seq {1} (seq idx 0),
    # each divided by the mini-batch normaliser (6 tokens, 3 sequences)
    va, sa = torch.tensor([1.0, 2.0, 3.0, 6.0]), torch.tensor([0, 0, 0, 1])
    vb, sb = torch.tensor([4.0, 5.0]), torch.tensor([0, 0])
    # token_mean: 12/6 + 9/6 = 2 + 1.5 = 3.5
    # seq_mean_token_mean: (2 + 6)/3 + 4.5/3 = 8/3 + 1.5 = 4.1666...
    # seq_mean_token_sum: (6 + 6)/3 + 9/3 = 4 + 3 = 7
    expected = {"token_mean": 3.5, "seq_mean_token_mean": 12.5 / 3, "seq_mean_token_sum": 7.0}
    parts = {"token_mean": (2.0, 1.5), "seq_mean_token_mean": (8 / 3, 1.5), "seq_mean_token_sum": (4.0, 3.0)}
    for mode in MODES:
        a = float(aggregate_loss(va, sa, 2, NORM, mode))
        b = float(aggregate_loss(vb, sb, 1, NORM, mode))
        assert a == pytest.approx(parts[mode][0], abs=1e-6) and b == pytest.approx(parts[mode][1], abs=1e-6)
        assert a + b == pytest.approx(expected[mode], abs=1e-6)


def test_aggregation_registry():
    assert set(LOSS_AGGREGATIONS) == set(MODES)


def test_aggregation_gradients():
    # d token_mean / d v = 1/6 per token; d seq_mean_token_mean / d v = 1/(3 * len(seq));
    # d seq_mean_token_sum / d v = 1/3
    for mode, grad in [("token_mean", [1 / 6] * 6),
                       ("seq_mean_token_mean", [1 / 9] * 3 + [1 / 6] * 2 + [1 / 3]),
                       ("seq_mean_token_sum", [1 / 3] * 6)]:
        v = VALUES.clone().requires_grad_(True)
        aggregate_loss(v, SEQ, 3, NORM, mode).backward()
        torch.testing.assert_close(v.grad, torch.tensor(grad), atol=1e-7, rtol=0)


# ---------------------------------------------------------------------------------------------
# invariance: summing micro-batch losses (same mini-batch Normaliser) == whole mini-batch loss
# ---------------------------------------------------------------------------------------------

@st.composite
def mini_batch_and_split(draw):
    """Sequences with their token values, and a partition of the sequences into micro-batches
    (any subset, any order: `micro_batches` sorts by length before chunking)."""
    n_seq = draw(st.integers(1, 10))
    lengths = draw(st.lists(st.integers(1, 7), min_size=n_seq, max_size=n_seq))
    seqs = [draw(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=k, max_size=k))
            for k in lengths]
    order = draw(st.permutations(list(range(n_seq))))
    cuts = sorted(draw(st.sets(st.integers(1, max(n_seq - 1, 1)), max_size=n_seq - 1))) if n_seq > 1 else []
    bounds = [0] + cuts + [n_seq]
    groups = [order[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    return seqs, groups


def flatten(seqs, members):
    values = [v for i in members for v in seqs[i]]
    seq = [j for j, i in enumerate(members) for _ in seqs[i]]
    return torch.tensor(values, dtype=torch.float64), torch.tensor(seq, dtype=torch.long)


@settings(max_examples=200, deadline=None)
@given(mini_batch_and_split(), st.sampled_from(MODES))
def test_micro_batch_split_invariance(data, mode):
    seqs, groups = data
    n_seq = len(seqs)
    norm = Normaliser(tokens=sum(len(s) for s in seqs), sequences=n_seq)
    values, seq = flatten(seqs, list(range(n_seq)))
    whole = aggregate_loss(values, seq, n_seq, norm, mode)
    total = torch.zeros((), dtype=torch.float64)
    for members in groups:
        v, s = flatten(seqs, members)
        total = total + aggregate_loss(v, s, len(members), norm, mode)
    assert abs(float(total) - float(whole)) <= 1e-7, (mode, float(total), float(whole))


@settings(max_examples=100, deadline=None)
@given(mini_batch_and_split())
def test_micro_batch_split_invariance_float32(data):
    seqs, groups = data
    n_seq = len(seqs)
    norm = Normaliser(tokens=sum(len(s) for s in seqs), sequences=n_seq)
    for mode in MODES:
        values, seq = flatten(seqs, list(range(n_seq)))
        whole = aggregate_loss(values.float(), seq, n_seq, norm, mode)
        total = sum(aggregate_loss(v.float(), s, len(m), norm, mode)
                    for m in groups for v, s in [flatten(seqs, m)])
        assert float(total) == pytest.approx(float(whole), abs=1e-4)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-10, 10, allow_nan=False, width=32), min_size=1, max_size=40),
       st.lists(st.integers(0, 5), min_size=1, max_size=40), st.data())
def test_token_level_split_invariance_token_modes(values, seq_raw, data):
    """token_mean and seq_mean_token_sum only depend on token sums, so they are invariant even when
    a sequence's tokens straddle micro-batches (arbitrary token cut points)."""
    n = min(len(values), len(seq_raw))
    values = torch.tensor(values[:n], dtype=torch.float64)
    seq = torch.tensor(sorted(seq_raw[:n]), dtype=torch.long)
    n_seq = int(seq.max()) + 1
    norm = Normaliser(tokens=n, sequences=n_seq)
    cuts = sorted(data.draw(st.sets(st.integers(1, max(n - 1, 1)), max_size=n)) - {n}) if n > 1 else []
    bounds = [0] + cuts + [n]
    for mode in ["token_mean", "seq_mean_token_sum"]:
        whole = float(aggregate_loss(values, seq, n_seq, norm, mode))
        total = 0.0
        for a, b in zip(bounds, bounds[1:]):
            s = seq[a:b]
            _, local = torch.unique(s, return_inverse=True)
            total += float(aggregate_loss(values[a:b], local, int(local.max()) + 1, norm, mode))
        assert abs(total - whole) <= 1e-7


# ---------------------------------------------------------------------------------------------
# KL estimators
# ---------------------------------------------------------------------------------------------

LOGP = torch.tensor([-1.0, -2.0, -0.5, -3.0], dtype=torch.float64)
REF = torch.tensor([-1.5, -1.0, -0.5, -0.2], dtype=torch.float64)


def test_kl_hand_values():
    # d = logp - ref = [0.5, -1.0, 0.0, -2.8]
    torch.testing.assert_close(kl_k1(LOGP, REF), torch.tensor([0.5, -1.0, 0.0, -2.8], dtype=torch.float64))
    # k2 = 0.5 d^2 = [0.125, 0.5, 0, 3.92]
    torch.testing.assert_close(kl_k2(LOGP, REF), torch.tensor([0.125, 0.5, 0.0, 3.92], dtype=torch.float64))
    # k3 = exp(ref - logp) - (ref - logp) - 1 with ref - logp = [-0.5, 1.0, 0.0, 2.8]:
    #   exp(-0.5) + 0.5 - 1 = 0.10653065971263342; e - 2 = 0.7182818284590451; 0;
    #   exp(2.8) - 3.8 = 12.644646771097047
    torch.testing.assert_close(
        kl_k3(LOGP, REF),
        torch.tensor([0.10653065971263342, 0.7182818284590451, 0.0, 12.644646771097047], dtype=torch.float64))


def test_kl_registry():
    assert KL_ESTIMATORS == {"k1": kl_k1, "k2": kl_k2, "k3": kl_k3}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(-15, 0), st.floats(-15, 0)), min_size=1, max_size=20))
@example([(-2.5190448169510068e-14, 0.0)])  # exp(d) - d - 1 gave -1.1e-16 here
def test_kl_formulas_and_k3_non_negative(pairs):
    logp = torch.tensor([p for p, _ in pairs], dtype=torch.float64)
    ref = torch.tensor([r for _, r in pairs], dtype=torch.float64)
    d = logp - ref
    torch.testing.assert_close(kl_k1(logp, ref), d)
    torch.testing.assert_close(kl_k2(logp, ref), 0.5 * d * d)
    k3 = kl_k3(logp, ref)
    expected = torch.tensor([math.exp(r - p) - (r - p) - 1.0 for p, r in pairs], dtype=torch.float64)
    torch.testing.assert_close(k3, expected)
    assert (k3 >= 0).all()
    assert (kl_k2(logp, ref) >= 0).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kl_zero_when_equal(dtype):
    x = torch.tensor([-0.1, -1.0, -5.0, -20.0], dtype=dtype)
    for name, fn in KL_ESTIMATORS.items():
        assert torch.equal(fn(x, x.clone()), torch.zeros(4, dtype=dtype)), name


def test_k1_and_k3_are_unbiased_kl_estimates():
    # for x ~ p, E_p[k1] = E_p[k3] = KL(p || ref) = sum p log(p / ref)
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.2, 0.6], dtype=torch.float64)
    kl = float((p * (p / ref).log()).sum())
    # hand: 0.5 ln 2.5 + 0.3 ln 1.5 + 0.2 ln(1/3) = 0.458145 + 0.121640 - 0.219722 = 0.360063
    assert kl == pytest.approx(0.360063, abs=1e-6)
    assert float((p * kl_k1(p.log(), ref.log())).sum()) == pytest.approx(kl, abs=1e-12)
    assert float((p * kl_k3(p.log(), ref.log())).sum()) == pytest.approx(kl, abs=1e-12)
