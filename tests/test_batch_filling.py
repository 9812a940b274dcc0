"""Filling the batch (algorithm.refill, algorithm.max_sampling_tries), the rollout count in the
metrics, and the mini-batch early stop (algorithm.early_stop_ratio): issue 61, items 1, 2 and 5."""

import math

import pytest
import torch

from rlpr.algorithms.refill import round_prompts
from rlpr.config import AlgorithmConfig, load_config
from rlpr.errors import ConfigError
from rlpr.train.checkpoint import latest_checkpoint, load_state, resume_config
from rlpr.reward.probability_reward import RewardOutput
from rlpr.rollout.hf import Rollout
from rlpr.train.metrics import Group, rollout_metrics
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import Trainer, train
from rlpr.train.update import accumulate_gradients, early_stop, fill_logprobs, mini_batch_ratio

from helpers import adapter_tensors, tiny_cfg
from test_trainer import comparable, fake_groups, grouped_samples

pytestmark = pytest.mark.integration


def test_round_sizes_of_each_refill_mode():
    assert [round_prompts(m, 8, 0, 0, 0) for m in ("estimate", "missing", "full")] == [8, 8, 8]  # round 1: the batch
    # 2 of 8 kept: 6 missing; the estimate divides by the keep rate (floor 0.25), capped at the batch
    assert round_prompts("estimate", 8, 2, 8, 1) == 8
    assert round_prompts("estimate", 8, 6, 8, 1) == 3  # 2 missing / 0.75
    assert round_prompts("missing", 8, 2, 8, 1) == 6
    assert round_prompts("missing", 8, 7, 14, 2) == 1
    assert round_prompts("full", 8, 7, 14, 2) == 8


@pytest.mark.parametrize("mode", ["missing", "estimate", "full"])
def test_refill_rounds_respect_the_bound_and_every_rollout_is_counted(tiny_dir, tmp_path, mode):
    cfg = tiny_cfg(tiny_dir, tmp_path, mode, "algorithm.filter_warmup_steps=0", "algorithm.filter_init_steps=0",
                   "algorithm.max_sampling_tries=3", f"algorithm.refill={mode}", "data.val=")
    trainer = Trainer(cfg, tmp_path / mode)
    trainer.filter.ema = 0.2  # threshold 0.1: only odd prompt indices pass
    rolled = []

    def rollout_groups(indices, seed):
        rolled.append(list(indices))
        return fake_groups(trainer, indices, lambda i: 0.3 if i % 2 else 0.0)

    trainer.rollout_groups = rollout_groups
    generated = []
    for step in (1, 2, 3):
        rolled.clear()
        kept, stats = trainer.collect(step)
        generated = stats["generated"]
        assert 1 <= stats["filter/tries"] == len(rolled) <= 3  # the bound
        assert stats["filter/generated_groups"] == sum(map(len, rolled)) == len(generated)
        passed = sum(i % 2 for batch in rolled for i in batch)
        assert stats["filter/passed_groups"] == passed and stats["filter/kept_groups"] == min(passed, 4) == len(kept)
        assert rollout_metrics(generated)["rollout/responses"] == 4 * len(generated)  # every round's responses
        if mode == "missing":  # each extra round rolls exactly the missing groups: no surplus to give back
            kept_before = 0
            for batch in rolled:
                assert len(batch) == 4 - kept_before
                kept_before += sum(i % 2 for i in batch)
            assert trainer.stream.cache == []


def test_with_filling_on_a_resumed_run_equals_a_straight_one(tiny_dir, tmp_path):
    """refill=missing with 3 rounds, a filter strict enough (beta 1.2) that steps refill: the resumed
    run's weights, optimizer, stream and metrics (the rollout count included) equal the straight run's."""
    fill = ("data.val=", "algorithm.refill=missing", "algorithm.max_sampling_tries=3", "algorithm.filter_beta=1.2")
    train(tiny_cfg(tiny_dir, tmp_path, "straight", "trainer.max_steps=4", *fill))
    train(tiny_cfg(tiny_dir, tmp_path, "resumed", "trainer.max_steps=2", *fill))
    train(resume_config(tmp_path / "resumed", ["trainer.max_steps=4"]), resume=str(tmp_path / "resumed"))

    a, b = adapter_tensors(tmp_path / "straight"), adapter_tensors(tmp_path / "resumed")
    assert all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = (load_state(latest_checkpoint(tmp_path / name)) for name in ("straight", "resumed"))
    assert sa["ranks"][0]["stream"] == sb["ranks"][0]["stream"] and sa["filter"] == sb["filter"]
    ma, mb = read_metrics(tmp_path / "straight"), read_metrics(tmp_path / "resumed")
    assert comparable(ma) == comparable(mb)
    assert any(m["filter/tries"] > 1 for m in ma[2:]), "no step after the resume refilled: the test tests nothing"
    totals = [m["rollout/responses_total"] for m in ma]
    assert totals == [sum(m["rollout/responses"] for m in ma[:i + 1]) for i in range(len(ma))]
    assert all(m["rollout/responses"] == 4 * m["filter/generated_groups"] for m in ma)
    assert sa["responses_total"] == sb["responses_total"] == totals[-1]


# -- the mini-batch early stop (algorithm.early_stop_ratio) ----------------------------------------

def test_the_early_stop_statistic_is_the_mean_token_ratio(tokenizer):
    from rlpr.model.loading import tiny_llama

    model = tiny_llama(tokenizer, seed=3).train()
    samples = grouped_samples(len(tokenizer))
    fill_logprobs(model, samples, "old_logp", 4, tokenizer.pad_token_id, 1.0)
    for s in samples:  # the policy made every sampled token e times likelier than the rollouts' policy
        s.old_logp = s.old_logp - 1.0
    stats = accumulate_gradients(model, samples, AlgorithmConfig(), 4, tokenizer.pad_token_id, 1.0)
    assert mini_batch_ratio(stats) == pytest.approx(math.e, rel=1e-4)
    assert early_stop(stats, 2.5)[0] and not early_stop(stats, 3.0)[0] and not early_stop(stats, 0.0)[0]
    for s in samples:
        s.old_logp = None  # one update per step: old = the current log-probs, ratio 1
    model.zero_grad(set_to_none=True)
    assert mini_batch_ratio(accumulate_gradients(model, samples, AlgorithmConfig(), 4, tokenizer.pad_token_id,
                                                 1.0)) == pytest.approx(1.0)


def spread_groups(trainer, indices):
    """A group per prompt of the same 4 responses (random tokens), rewarded 0, 1, 0, 1: an update on
    some groups moves the others' log-probs too."""
    vocab = len(trainer.tokenizer)
    groups = []
    for i in indices:
        g = torch.Generator().manual_seed(0)
        rollouts = [Rollout(0, torch.randint(3, vocab, (6,), generator=g).tolist(), "x", True) for _ in range(4)]
        groups.append(Group(trainer.train_prompts[i], rollouts,
                            [RewardOutput(True, 1.0, False, r, 0.0, r, 0.0, r) for r in (0.0, 1.0, 0.0, 1.0)]))
    return groups


def test_a_mini_batch_past_the_bound_changes_no_weight_and_no_optimizer_state(tiny_dir, tmp_path):
    """Two mini-batches per step at a large learning rate: the first (ratio 1) is applied, the second's
    ratios grow past the bound and it is dropped; after it the weights, the AdamW moments and step
    counts are those the first update left, and no gradient is left over."""
    cfg = tiny_cfg(tiny_dir, tmp_path, "stop", "data.val=", "trainer.lr=0.3", "algorithm.early_stop_ratio=1.02",
                   "trainer.warmup_steps=0")
    trainer = Trainer(cfg, tmp_path / "stop")
    kept = spread_groups(trainer, [0, 1, 2, 3])
    after_applied = {}
    step = trainer.strategy.step

    def spying_step():  # the real step; what it leaves is what the dropped mini-batch must not change
        norm = step()
        after_applied["weights"] = [p.detach().clone() for p in trainer.trainable]
        after_applied["optimizer"] = {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in st.items()}
                                      for k, st in trainer.optimizer.state_dict()["state"].items()}
        return norm

    trainer.strategy.step = spying_step
    metrics = trainer.update(kept, 1)
    assert metrics["policy/updates"] == 1 and metrics["policy/dropped_updates"] == 1
    assert metrics["policy/ratio_max"] > 1.02
    assert all(torch.equal(p, q) for p, q in zip(trainer.trainable, after_applied["weights"]))
    state = trainer.optimizer.state_dict()["state"]
    assert state.keys() == after_applied["optimizer"].keys()
    for k, saved in after_applied["optimizer"].items():
        for name, value in saved.items():
            assert torch.equal(state[k][name], value) if torch.is_tensor(value) else state[k][name] == value
    assert all(p.grad is None for p in trainer.trainable)


def test_the_early_stop_bound_is_checked():
    with pytest.raises(ConfigError, match="algorithm.early_stop_ratio .* above 1"):
        load_config("demo", ["algorithm.early_stop_ratio=0.9"])
    with pytest.raises(ConfigError, match="DeepSpeed"):
        load_config("demo", ["algorithm.early_stop_ratio=5", "trainer.strategy=deepspeed"])
    assert load_config("demo", ["algorithm.early_stop_ratio=5"]).algorithm.early_stop_ratio == 5
