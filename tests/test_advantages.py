"""Group advantage estimators (spec section 4) against hand-computed values.

All expected numbers below are literals worked out by hand (derivations in the comments); the
code under test is only ever compared against them, never against itself.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from rlpr.algorithms.advantages import (ADVANTAGES, centred_moments, compute_advantages, dr_grpo, grpo,
                                        reinforce, reinforce_pp, reward_moments, rloo)

pytestmark = pytest.mark.unit

TOL = dict(atol=1e-6, rtol=1e-6)


def close(actual, expected, **tol):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), **(tol or TOL))


# ---------------------------------------------------------------------------------------------
# GRPO: (r - mean) / (std_unbiased + 1e-6), 0 for a whole group with std < 1e-6
# ---------------------------------------------------------------------------------------------

def test_grpo_brief_example():
    # group 0: [1, 0, 0, 1]: mean 0.5, deviations +-0.5, sum of squares 1, unbiased var 1/3,
    #          std 0.5773502691896257; adv = +-0.5 / (0.5773502691896257 + 1e-6) = +-0.8660239037870368
    # group 1: [0.5]*4: std 0 -> every member exactly 0
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5, 0.5, 0.5, 0.5]]), "grpo")
    assert adv.shape == (2, 4)
    a = 0.8660239037870368
    close(adv, [[a, -a, -a, a], [0.0, 0.0, 0.0, 0.0]])
    assert torch.equal(adv[1], torch.zeros(4))


def test_grpo_uneven_group():
    # [1, 2, 3, 6]: mean 3, deviations [-2, -1, 0, 3], sum sq 14, unbiased var 14/3,
    # std 2.160246899469287; adv = dev / 2.160247899469287
    adv = grpo(torch.tensor([[1.0, 2.0, 3.0, 6.0]]))
    close(adv, [[-0.9258196712013211, -0.46290983560066057, 0.0, 1.3887295068019816]])


def test_grpo_uses_unbiased_std():
    # [0, 1]: mean 0.5; unbiased std sqrt(0.5) = 0.7071067811865476 -> adv +-0.5/0.7071077811865476
    # = +-0.7071057811879616.  (The biased std 0.5 would give +-1.)
    adv = compute_advantages(torch.tensor([[0.0, 1.0]]))  # default name is grpo
    close(adv, [[-0.7071057811879616, 0.7071057811879616]])
    assert not torch.allclose(adv.abs(), torch.ones(2), atol=1e-3)


@pytest.mark.parametrize("value", [0.0, 0.1, 0.3, 1.0, -2.7, 1e6])
def test_grpo_zero_variance_group_is_exactly_zero(value):
    # 0.1 and 0.3 are not exact in float32, so the computed mean may differ from the members by
    # rounding; the group must still give exactly 0 for every member.
    rewards = torch.full((3, 8), value)
    adv = compute_advantages(rewards, "grpo")
    assert torch.equal(adv, torch.zeros(3, 8))


def test_grpo_tiny_variance_below_eps_is_zero():
    # [0, 1e-7, 0, 1e-7]: unbiased std ~5.8e-8 < 1e-6 -> all zero (without the rule the
    # members would get +-5e-8 / (5.8e-8 + 1e-6) ~ +-0.047)
    rewards = torch.tensor([[0.0, 1e-7, 0.0, 1e-7]])
    assert torch.equal(compute_advantages(rewards, "grpo"), torch.zeros(1, 4))


def test_grpo_groups_are_independent():
    # the zero-variance row does not disturb the other row and vice versa
    a = 0.8660239037870368
    rewards = torch.tensor([[0.5, 0.5, 0.5, 0.5], [1.0, 0.0, 0.0, 1.0], [7.0, 7.0, 7.0, 7.0]])
    close(grpo(rewards), [[0.0] * 4, [a, -a, -a, a], [0.0] * 4])


# ---------------------------------------------------------------------------------------------
# RLOO: r_i - mean of the other n - 1 rewards
# ---------------------------------------------------------------------------------------------

def test_rloo_hand_values():
    # [1, 0, 0, 1]: for r=1 the others are {0, 0, 1}, mean 1/3 -> 2/3; for r=0 the others are
    #               {1, 0, 1}, mean 2/3 -> -2/3
    # [1, 2, 3, 6]: 1 - (2+3+6)/3 = -8/3; 2 - (1+3+6)/3 = -4/3; 3 - (1+2+6)/3 = 0; 6 - (1+2+3)/3 = 4
    # [0.5]*4: 0 everywhere
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 6.0], [0.5] * 4]), "rloo")
    close(adv, [[2 / 3, -2 / 3, -2 / 3, 2 / 3], [-8 / 3, -4 / 3, 0.0, 4.0], [0.0] * 4])


def test_rloo_pair():
    # n = 2: each member minus the other one: [3, 5] -> [-2, 2]
    close(rloo(torch.tensor([[3.0, 5.0]])), [[-2.0, 2.0]])


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.floats(-100, 100), min_size=5, max_size=5), min_size=1, max_size=4))
def test_rloo_matches_leave_one_out_definition(rows):
    rewards = torch.tensor(rows, dtype=torch.float64)
    adv = compute_advantages(rewards, "rloo")
    for g, row in enumerate(rows):
        for i, r in enumerate(row):
            others = [x for j, x in enumerate(row) if j != i]
            assert float(adv[g, i]) == pytest.approx(r - sum(others) / len(others), abs=1e-3, rel=1e-5)


# ---------------------------------------------------------------------------------------------
# Dr. GRPO: r - mean, no std division
# ---------------------------------------------------------------------------------------------

def test_dr_grpo_hand_values():
    # [1, 2, 3, 6] - 3 = [-2, -1, 0, 3]; [1, 0, 0, 1] - 0.5; [0.5]*4 -> 0;
    # [10, 30] - 20 = [-10, 10] (no std division: the scale is kept)
    adv = compute_advantages(torch.tensor([[1.0, 2.0, 3.0, 6.0], [1.0, 0.0, 0.0, 1.0], [0.5] * 4]), "dr_grpo")
    close(adv, [[-2.0, -1.0, 0.0, 3.0], [0.5, -0.5, -0.5, 0.5], [0.0] * 4])
    close(dr_grpo(torch.tensor([[10.0, 30.0]])), [[-10.0, 10.0]])


# ---------------------------------------------------------------------------------------------
# REINFORCE++ baseline: centre per group, then normalise over the whole batch
# ---------------------------------------------------------------------------------------------

def test_reinforce_pp_hand_values():
    # centred: [0.5, -0.5, -0.5, 0.5 | -2, -1, 0, 3]; batch mean 0;
    # sum of squares 4*0.25 + 4 + 1 + 0 + 9 = 15; unbiased var 15/7; std 1.4638501094227998
    # adv = centred / 1.4638511094227998
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 6.0]]), "reinforce_pp")
    a, b = 0.3415647921988127, 1.3662591687952508
    close(adv, [[a, -a, -a, a], [-b, -0.6831295843976254, 0.0, 2.049388753192876]])


def test_reinforce_pp_zero_variance_group_and_batch_std():
    # centred: [0.5, -0.5, -0.5, 0.5 | 0, 0, 0, 0]; sum sq 1; unbiased var over the 8 entries 1/7,
    # std 0.3779644730092272 -> adv +-0.5 / 0.3779654730092272 = +-1.3228721555415557.
    # (GRPO on the first group alone would give +-0.866; the batch normalisation differs.)
    adv = reinforce_pp(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5] * 4]))
    a = 1.3228721555415557
    close(adv, [[a, -a, -a, a], [0.0] * 4])


def test_reinforce_pp_all_constant_is_zero():
    adv = compute_advantages(torch.full((3, 4), 2.5), "reinforce_pp")
    assert torch.equal(adv, torch.zeros(3, 4))


def test_reinforce_pp_is_batch_normalised():
    torch.manual_seed(0)
    adv = compute_advantages(torch.randn(6, 8) * 5 + 3, "reinforce_pp")
    # each group sums to 0 (group-centred), the whole batch has unbiased std ~1
    torch.testing.assert_close(adv.sum(-1), torch.zeros(6), atol=1e-5, rtol=0)
    assert float(adv.std(unbiased=True)) == pytest.approx(1.0, abs=1e-5)


def test_reinforce_pp_split_over_ranks_equals_whole_batch():
    # what data-parallel training does: each rank holds some groups, the moments are summed
    torch.manual_seed(1)
    rewards = torch.rand(5, 8)
    parts = [rewards[:2], rewards[2:]]
    moments = tuple(sum(m) for m in zip(*(centred_moments(p) for p in parts)))
    split = torch.cat([compute_advantages(p, "reinforce_pp", moments) for p in parts])
    torch.testing.assert_close(split, compute_advantages(rewards, "reinforce_pp"), **TOL)
    # a rank-local normalisation would differ
    local = torch.cat([compute_advantages(p, "reinforce_pp") for p in parts])
    assert not torch.allclose(local, split, atol=1e-3)


# ---------------------------------------------------------------------------------------------
# REINFORCE with a batch baseline: r - the mean reward of the whole batch (no group baseline, no std)
# ---------------------------------------------------------------------------------------------

def test_reinforce_hand_values():
    # batch [1, 0, 0, 1 | 1, 2, 3, 6]: sum 14 over 8 rewards, mean 1.75; adv = r - 1.75
    adv = compute_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 6.0]]), "reinforce")
    close(adv, [[-0.75, -1.75, -1.75, -0.75], [-0.75, 0.25, 1.25, 4.25]])
    # a zero-variance group is not zeroed: [0.5]*4 beside [1, 0, 0, 1] (batch mean 0.5) -> 0, and
    # [0.9]*2 beside [0.1]*2 (batch mean 0.5) -> +0.4 and -0.4: the whole group is pushed up or down
    close(reinforce(torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.5] * 4])), [[0.5, -0.5, -0.5, 0.5], [0.0] * 4])
    close(reinforce(torch.tensor([[0.9, 0.9], [0.1, 0.1]])), [[0.4, 0.4], [-0.4, -0.4]])


def test_a_per_prompt_shift_changes_reinforce_only():
    # what debiasing is: B - A with one A per prompt, i.e. each group's rewards shifted by a constant
    # of its own. Group baselines cancel it; the batch baseline does not.
    torch.manual_seed(2)
    b = torch.rand(4, 8)
    a = torch.tensor([[0.3], [0.0], [0.6], [0.1]])
    for name in ("grpo", "rloo", "dr_grpo", "reinforce_pp"):
        torch.testing.assert_close(compute_advantages(b - a, name), compute_advantages(b, name), atol=1e-5, rtol=0)
    shifted, plain = compute_advantages(b - a, "reinforce"), compute_advantages(b, "reinforce")
    # the change is exactly -(A - mean A) for every member of a group (mean A = 0.25 here: groups of
    # equal size): the group with A = 0.6 loses 0.35, the one with A = 0 gains 0.25
    close(shifted - plain, [[-0.05] * 8, [0.25] * 8, [-0.35] * 8, [0.15] * 8], atol=1e-5, rtol=0)
    # ...while one shift for the whole batch changes nothing, as for the others
    torch.testing.assert_close(compute_advantages(b - 0.4, "reinforce"), plain, atol=1e-6, rtol=0)


def test_reinforce_split_over_ranks_equals_whole_batch():
    # what data-parallel training does (as for REINFORCE++): each rank holds some groups, the
    # moments of its rewards are summed over ranks
    torch.manual_seed(3)
    rewards = torch.rand(5, 8)
    parts = [rewards[:2], rewards[2:]]
    moments = tuple(sum(m) for m in zip(*(ADVANTAGES["reinforce"].moments(p) for p in parts)))
    assert moments == pytest.approx(reward_moments(rewards))
    split = torch.cat([compute_advantages(p, "reinforce", moments) for p in parts])
    torch.testing.assert_close(split, compute_advantages(rewards, "reinforce"), **TOL)
    # a rank-local mean would differ
    local = torch.cat([compute_advantages(p, "reinforce") for p in parts])
    assert not torch.allclose(local, split, atol=1e-3)


@pytest.mark.parametrize("name", ["reinforce", "reinforce_pp"])
def test_the_trainer_sums_the_estimators_moments_over_ranks(monkeypatch, name):
    # Trainer.make_samples on "rank 0" of 2: the other rank's groups enter through the summed moments
    # (dist.sum_values, faked here), and rank 0's advantages are the rows of the whole batch's
    from types import SimpleNamespace

    from rlpr.train import trainer as trainer_module

    torch.manual_seed(4)
    mine, other = torch.rand(2, 4), torch.rand(3, 4) + 0.5
    estimator = ADVANTAGES[name]
    monkeypatch.setattr(trainer_module.dist, "world_size", lambda: 2)
    monkeypatch.setattr(trainer_module.dist, "sum_values",
                        lambda local: [a + b for a, b in zip(local, estimator.moments(other))])
    monkeypatch.setattr(trainer_module, "training_sample", lambda prompt, r, out, a, cfg, reward: a)
    groups = [SimpleNamespace(scalar_rewards=row.tolist(), prompt=None, rewards=[None] * 4,
                              rollouts=[SimpleNamespace(token_ids=[1])] * 4) for row in mine]
    fake = SimpleNamespace(cfg=SimpleNamespace(algorithm=SimpleNamespace(advantage=name)), reward=None)
    got = torch.tensor(trainer_module.Trainer.make_samples(fake, groups))
    whole = compute_advantages(torch.cat([mine, other]), name)[:2]
    torch.testing.assert_close(got, whole, atol=1e-5, rtol=0)
    assert not torch.allclose(got, compute_advantages(mine, name), atol=1e-3)  # not rank-local


def test_reinforce_empty_moments_give_zeros():
    # moments of a batch with no rewards (every rank without groups): nothing to subtract
    assert torch.equal(reinforce(torch.ones(1, 2), (0.0, 0.0, 0.0)), torch.zeros(1, 2))


# ---------------------------------------------------------------------------------------------
# shapes, registry, errors
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce"])
@pytest.mark.parametrize("shape", [(1, 2), (1, 8), (5, 8), (3, 4)])
def test_shapes_and_dtype(name, shape):
    torch.manual_seed(1)
    adv = compute_advantages(torch.rand(shape), name)
    assert adv.shape == shape and adv.dtype == torch.float32
    assert torch.isfinite(adv).all()


@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce"])
def test_integer_rewards_are_accepted(name):
    adv = compute_advantages(torch.tensor([[1, 0, 0, 1]]), name)
    assert adv.dtype == torch.float32 and adv.shape == (1, 4)


def test_registry_names():
    assert set(ADVANTAGES) == {"grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce"}


@pytest.mark.parametrize("bad", [torch.tensor([1.0, 0.0, 1.0]), torch.zeros(2, 3, 4), torch.zeros(3, 1),
                                 torch.tensor(1.0)])
@pytest.mark.parametrize("name", ["grpo", "rloo", "dr_grpo", "reinforce_pp", "reinforce"])
def test_bad_shapes_raise(bad, name):
    with pytest.raises(ValueError, match="rewards must be"):
        compute_advantages(bad, name)


@pytest.mark.parametrize("name", ["ppo", "GRPO", "", "gae"])
def test_unknown_name_raises(name):
    with pytest.raises(ValueError, match="unknown advantage") as err:
        compute_advantages(torch.tensor([[1.0, 0.0]]), name)
    assert "grpo" in str(err.value) and "reinforce_pp" in str(err.value)
