"""The EMA standard-deviation filter schedule (spec section 4) on synthetic per-step mean stds.

Protocol (module docstring): for each step t, `begin_step(t)`, then `keep(t, stds)` for each
rollout round, then `end_step(t, mean_std)` with the pre-filter mean std of ALL groups of step t.
"""

import copy
import json
import math

import pytest
from hypothesis import given, settings, strategies as st

from rlpr.algorithms.std_filter import EMAStdFilter

pytestmark = pytest.mark.unit

NAN, INF = float("nan"), float("inf")

# steps 1..5 get large means that must NOT enter the initial EMA; steps 6..10 are the recorded ones
WARM_MEANS = [100.0, 100.0, 100.0, 100.0, 100.0, 0.25, 0.5, 0.75, 1.0, 1.5]  # steps 1..10
# ema at step 11 = (0.25 + 0.5 + 0.75 + 1.0 + 1.5) / 5 = 4.0 / 5 = 0.8


def run_warmup(f: EMAStdFilter, means=WARM_MEANS):
    for t, m in enumerate(means, start=1):
        f.begin_step(t)
        f.end_step(t, m)


def step(f: EMAStdFilter, t: int, stds, mean_std=None):
    """One full protocol step; returns (ema used by the step, keep decisions)."""
    f.begin_step(t)
    ema = f.ema
    decisions = f.keep(t, stds)
    finite = [s for s in stds if math.isfinite(s)]
    f.end_step(t, mean_std if mean_std is not None else sum(finite) / len(finite))
    return ema, decisions


# ---------------------------------------------------------------------------------------------
# warm-up: steps 1..10 keep everything finite
# ---------------------------------------------------------------------------------------------

def test_warmup_keeps_everything_even_zero_std():
    f = EMAStdFilter()
    stds = [0.0, 1e-12, 0.01, 5.0, 1e9]
    for t in range(1, 11):
        f.begin_step(t)
        assert f.ema is None
        assert not f.active(t) and f.threshold(t) is None
        assert f.keep(t, stds) == [True] * 5
        assert f.keep(t, [0.0]) == [True]
        f.end_step(t, WARM_MEANS[t - 1])


def test_warmup_records_means_of_steps_6_to_10_only():
    f = EMAStdFilter()
    for t, m in enumerate(WARM_MEANS, start=1):
        f.begin_step(t)
        f.end_step(t, m)
        expected = [x for s, x in enumerate(WARM_MEANS[:t], start=1) if s >= 6]
        assert f.history == expected
    assert f.history == [0.25, 0.5, 0.75, 1.0, 1.5]
    assert f.ema is None


def test_step_11_ema_is_exact_average_of_the_5_means():
    f = EMAStdFilter()
    run_warmup(f)
    f.begin_step(11)
    assert f.ema == 0.8  # 4.0 / 5, exact (not blended with m_10 = 1.5)
    assert f.active(11)
    assert f.threshold(11) == 0.4  # 0.5 * 0.8


def test_step_11_ema_other_means():
    # (0.1 + 0.2 + 0.3 + 0.4 + 0.5) / 5 = 0.3 ; python: 1.5 / 5 == 0.3
    f = EMAStdFilter()
    run_warmup(f, [9.0] * 5 + [0.1, 0.2, 0.3, 0.4, 0.5])
    f.begin_step(11)
    assert f.ema == pytest.approx(0.3, abs=1e-15)


# ---------------------------------------------------------------------------------------------
# from step 12: ema = 0.99 * ema + 0.01 * m_{t-1}
# ---------------------------------------------------------------------------------------------

def test_ema_recurrence_hand_values():
    f = EMAStdFilter()
    run_warmup(f)
    f.begin_step(11)
    assert f.ema == 0.8
    f.end_step(11, 0.4)  # m_11
    f.begin_step(12)
    assert f.ema == pytest.approx(0.796, abs=1e-14)  # 0.99*0.8 + 0.01*0.4 = 0.792 + 0.004
    f.end_step(12, 1.0)  # m_12
    f.begin_step(13)
    assert f.ema == pytest.approx(0.79804, abs=1e-14)  # 0.99*0.796 + 0.01*1.0 = 0.78804 + 0.01
    f.end_step(13, 0.2)  # m_13
    f.begin_step(14)
    assert f.ema == pytest.approx(0.7920596, abs=1e-14)  # 0.99*0.79804 + 0.002 = 0.7900596 + 0.002


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.0, 10.0), min_size=10, max_size=10),
       st.lists(st.floats(0.0, 10.0), min_size=1, max_size=15))
def test_ema_recurrence_uses_mean_of_previous_step(warm, later):
    f = EMAStdFilter()
    run_warmup(f, warm)
    expected = sum(warm[5:]) / 5
    prev = None
    for t, m in enumerate(later, start=11):
        f.begin_step(t)
        if t > 11:
            expected = 0.99 * expected + 0.01 * prev
        assert f.ema == pytest.approx(expected, rel=1e-12, abs=1e-12)
        f.end_step(t, m)
        prev = m


def test_configurable_constants():
    # warmup 4, init 2 (steps 3 and 4 recorded), decay 0.9, beta 0.9
    f = EMAStdFilter(beta=0.9, warmup_steps=4, init_steps=2, decay=0.9)
    run_warmup(f, [50.0, 50.0, 0.25, 0.75])
    assert f.history == [0.25, 0.75]
    f.begin_step(5)
    assert f.ema == 0.5  # (0.25 + 0.75) / 2
    assert f.threshold(5) == 0.45  # 0.9 * 0.5
    f.end_step(5, 1.5)
    f.begin_step(6)
    assert f.ema == pytest.approx(0.6, abs=1e-14)  # 0.9*0.5 + 0.1*1.5 = 0.45 + 0.15


# ---------------------------------------------------------------------------------------------
# keep iff std >= beta * ema (boundary included); non-finite always dropped
# ---------------------------------------------------------------------------------------------

def test_keep_boundary_beta_default():
    f = EMAStdFilter()  # beta 0.5
    run_warmup(f)
    f.begin_step(11)  # ema 0.8 -> threshold 0.4
    stds = [0.4, math.nextafter(0.4, 0.0), math.nextafter(0.4, 1.0), 0.0, 0.8, 0.39, 2.0]
    assert f.keep(11, stds) == [True, False, True, False, True, False, True]


def test_keep_boundary_beta_09():
    # means of steps 6..10 [0.25, 0.5, 0.75, 0.5, 0.5] -> ema 2.5 / 5 = 0.5; threshold 0.9*0.5 = 0.45
    f = EMAStdFilter(beta=0.9)
    run_warmup(f, [3.0] * 5 + [0.25, 0.5, 0.75, 0.5, 0.5])
    f.begin_step(11)
    assert f.ema == 0.5 and f.threshold(11) == 0.45
    stds = [0.45, math.nextafter(0.45, 0.0), 0.46, 0.25, 0.0]
    assert f.keep(11, stds) == [True, False, True, False, False]


def test_keep_boundary_after_recurrence():
    f = EMAStdFilter(beta=0.9)
    run_warmup(f)
    f.begin_step(11)
    f.end_step(11, 0.4)
    f.begin_step(12)
    limit = 0.9 * f.ema  # ~0.9 * 0.796 = 0.7164
    assert limit == pytest.approx(0.7164, abs=1e-12)
    assert f.keep(12, [limit, math.nextafter(limit, 0.0), 0.72, 0.71]) == [True, False, True, False]


@pytest.mark.parametrize("t", [1, 5, 10])
def test_non_finite_dropped_during_warmup(t):
    f = EMAStdFilter()
    run_warmup(f, WARM_MEANS[:t - 1])
    f.begin_step(t)
    assert f.keep(t, [NAN, INF, -INF, 0.0, 1.0]) == [False, False, False, True, True]


def test_non_finite_dropped_when_active():
    f = EMAStdFilter()
    run_warmup(f)
    f.begin_step(11)
    assert f.keep(11, [NAN, INF, -INF, 0.4, 10.0]) == [False, False, False, True, True]


def test_disabled_keeps_everything_finite():
    f = EMAStdFilter(enabled=False)
    run_warmup(f)
    for t in range(11, 20):
        f.begin_step(t)
        assert not f.active(t) and f.threshold(t) is None
        assert f.keep(t, [0.0, 1e-9, 0.3, 100.0]) == [True] * 4
        assert f.keep(t, [NAN, INF, 0.0]) == [False, False, True]
        f.end_step(t, 0.5)


def test_non_finite_mean_is_not_recorded():
    f = EMAStdFilter()
    for t in range(1, 11):
        f.begin_step(t)
        f.end_step(t, NAN if t == 7 else 0.5)
    assert f.history == [0.5, 0.5, 0.5, 0.5]
    f.begin_step(11)
    assert f.ema == 0.5


# ---------------------------------------------------------------------------------------------
# state_dict / load_state_dict round trip continues the schedule identically
# ---------------------------------------------------------------------------------------------

ROUND_STDS = [
    [0.1 * ((3 * t + k) % 7) for k in range(6)] + ([NAN] if t % 4 == 0 else []) for t in range(1, 16)
]
ROUND_MEANS = [0.05 + 0.07 * ((5 * t) % 9) for t in range(1, 16)]  # steps 1..15, varied


def simulate(f: EMAStdFilter, steps):
    out = []
    for t in steps:
        ema, keep = step(f, t, ROUND_STDS[t - 1], ROUND_MEANS[t - 1])
        out.append((t, ema, f.threshold(t), keep))
    return out


@pytest.mark.parametrize("beta", [0.5, 0.9])
@pytest.mark.parametrize("split", [7, 1, 5, 6, 10, 11, 12, 14])
@pytest.mark.parametrize("serialise", ["plain", "json", "deepcopy"])
def test_state_dict_round_trip(beta, split, serialise):
    reference = EMAStdFilter(beta=beta)
    straight = simulate(reference, range(1, 16))
    # the schedule really filters something after step 10 (otherwise the test would be weak)
    assert any(not all(k) for _, _, _, k in straight[10:])

    first = EMAStdFilter(beta=beta)
    part1 = simulate(first, range(1, split + 1))
    state = first.state_dict()
    if serialise == "json":
        state = json.loads(json.dumps(state))
    elif serialise == "deepcopy":
        state = copy.deepcopy(state)
    fresh = EMAStdFilter(beta=beta)
    fresh.load_state_dict(state)
    part2 = simulate(fresh, range(split + 1, 16))
    resumed = part1 + part2
    assert len(resumed) == 15
    for (t, ema_a, thr_a, keep_a), (u, ema_b, thr_b, keep_b) in zip(straight, resumed):
        assert t == u
        assert ema_a == ema_b, f"ema differs at step {t}"
        assert thr_a == thr_b
        assert keep_a == keep_b, f"keep differs at step {t}"
    assert fresh.state_dict() == reference.state_dict()


def test_state_dict_is_a_snapshot():
    f = EMAStdFilter()
    simulate(f, range(1, 8))
    state = f.state_dict()
    saved = copy.deepcopy(state)
    simulate(f, range(8, 12))
    assert state == saved  # later steps did not mutate the saved history list
