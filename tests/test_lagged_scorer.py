"""reward.scorer=ema (NOVER's lagged scorer, issue 19): the EMA of the trainable weights against a
hand computation, the swap, what scores with it, full fine-tuning, and exact resume."""

from __future__ import annotations

import copy

import pytest
import torch

from rlpr.config import RewardConfig, load_config
from rlpr.errors import ConfigError
from rlpr.model.loading import tiny_llama
from rlpr.reward.lagged import LaggedWeights, NoLagged, ema_step
from rlpr.reward.probability_reward import ProbabilityReward
from rlpr.train.checkpoint import latest_checkpoint, load_state
from rlpr.train.tracking import read_metrics

from helpers import adapter_tensors, tiny_cfg

pytestmark = pytest.mark.integration  # its trainer runs; the module takes its heaviest tier (docs/testing.md)


def trainable(model) -> dict:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def hand_ema(snapshots: list[dict], decay: float, every: int = 1) -> dict:
    """w_0 = theta_0; w <- d * w + (1 - d) * theta_k at every `every`-th step k, in float64."""
    w = {n: t.double() for n, t in snapshots[0].items()}
    for k, theta in enumerate(snapshots[1:], start=1):
        if k % every == 0:
            w = {n: decay * w[n] + (1 - decay) * theta[n].double() for n in w}
    return w


def assert_weights_close(got: dict, want: dict, atol=1e-6):
    assert got.keys() == want.keys()
    for n in got:
        assert torch.allclose(got[n].double(), want[n], atol=atol, rtol=0), (n, (got[n].double() - want[n]).abs().max())


def test_ema_step_by_hand():
    w, theta = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([3.0, 0.0, 0.5])
    ema_step(w, theta, 0.75)
    assert torch.allclose(w, torch.tensor([0.75 * 1 + 0.25 * 3, 0.75 * -2 + 0.25 * 0, 0.5]))


@pytest.mark.parametrize("decay, every", [(0.9, 1), (0.5, 2), (1.0, 1), (0.0, 1)])
def test_lagged_weights_after_k_steps_equal_the_hand_ema(tokenizer, decay, every):
    model = tiny_llama(tokenizer, layers=1, hidden=32, seed=0)
    model.model.embed_tokens.requires_grad_(False)  # only some weights train, as under LoRA
    lagged = LaggedWeights(model, decay, every)
    assert all(not n.startswith("model.embed_tokens") for n in lagged.weights)
    snapshots = [trainable(model)]
    g = torch.Generator().manual_seed(0)
    for _ in range(5):  # five "optimizer steps": arbitrary new weights
        with torch.no_grad():
            for p in model.parameters():
                if p.requires_grad:
                    p.add_(0.1 * torch.randn(p.shape, generator=g))
        lagged.update()
        snapshots.append(trainable(model))
    assert lagged.steps == 5
    assert_weights_close(lagged.weights, hand_ema(snapshots, decay, every))
    if decay == 1.0:
        assert_weights_close(lagged.weights, {n: t.double() for n, t in snapshots[0].items()}, atol=0)
    if decay == 0.0:
        assert_weights_close(lagged.weights, {n: t.double() for n, t in snapshots[-1].items()}, atol=0)


def test_swap_puts_the_lagged_weights_in_and_takes_them_out(tokenizer):
    model = tiny_llama(tokenizer, layers=1, hidden=32, seed=0)
    lagged = LaggedWeights(model, 0.5)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    lagged.update()
    own, averaged = trainable(model), {n: t.clone() for n, t in lagged.weights.items()}
    with lagged.swapped():
        assert all(torch.equal(p, averaged[n]) for n, p in model.named_parameters())
    assert all(torch.equal(p, own[n]) for n, p in model.named_parameters())
    assert all(torch.equal(lagged.weights[n], averaged[n]) for n in averaged)
    with pytest.raises(RuntimeError), lagged.swapped():  # an error inside still swaps back
        raise RuntimeError("boom")
    assert all(torch.equal(p, own[n]) for n, p in model.named_parameters())
    state = lagged.state_dict()
    fresh = LaggedWeights(tiny_llama(tokenizer, layers=1, hidden=32, seed=1), 0.5)
    fresh.load_state_dict(state)
    assert fresh.steps == 1 and all(torch.equal(fresh.weights[n], averaged[n]) for n in averaged)
    assert not NoLagged() and NoLagged().state_dict() is None


def chat(tokenizer, q):
    return tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)


R1 = ["<think> The capital of France is Paris. </think>\n<answer> Paris </answer>",
      "<think> hmm </think>\n<answer> Lyon </answer>"]


@pytest.mark.parametrize("kind", ["probability", "nover"])
def test_score_b_and_a_come_from_the_lagged_weights(tokenizer, kind):
    """B (and A with score_a=ema) equal what a model holding the EMA weights gives; the policy's
    own weights are back afterwards."""
    policy = tiny_llama(tokenizer, seed=0)
    lagged = LaggedWeights(policy, 0.5)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.05 * torch.randn_like(p))
    lagged.update()
    holder = copy.deepcopy(policy)
    with torch.no_grad():
        for n, p in holder.named_parameters():
            p.copy_(lagged.weights[n])
    extra = dict(kind="nover", debias=False) if kind == "nover" else dict(score_a="ema")
    q = chat(tokenizer, "Capital of France?")
    cfg = RewardConfig(scorer="ema", repetition_penalty=False, **extra)
    reward = ProbabilityReward(cfg, tokenizer)
    reward.score_a.bind(policy, lora=False, lagged=lagged)
    before = trainable(policy)
    got = reward(policy, [q] * 2, R1, ["Paris"] * 2)
    want = ProbabilityReward(RewardConfig(repetition_penalty=False, **{**extra, "score_a": "current"}),
                             tokenizer)(holder, [q] * 2, R1, ["Paris"] * 2)
    assert [o.score_b for o in got] == pytest.approx([o.score_b for o in want], rel=1e-6)
    assert [o.score_a for o in got] == pytest.approx([o.score_a for o in want], rel=1e-6)
    assert [o.reward for o in got] == pytest.approx([o.reward for o in want], rel=1e-6)
    own = ProbabilityReward(RewardConfig(repetition_penalty=False, **{**extra, "score_a": "current"}),
                            tokenizer)(policy, [q] * 2, R1, ["Paris"] * 2)
    assert [o.score_b for o in got] != pytest.approx([o.score_b for o in own], rel=1e-4)  # not the policy's
    assert all(torch.equal(p, before[n]) for n, p in policy.named_parameters())


def test_config_keys_and_checks():
    r = load_config("nover", ["reward.scorer=ema", "reward.scorer_ema=0.9", "reward.scorer_ema_every=100"]).reward
    assert (r.scorer, r.scorer_ema, r.scorer_ema_every) == ("ema", 0.9, 100)
    assert load_config("demo", ["reward.score_a=ema"]).reward.score_a == "ema"
    with pytest.raises(ConfigError, match=r"reward.scorer_ema"):
        load_config("nover", ["reward.scorer=ema", "reward.scorer_ema=1.5"])
    with pytest.raises(ConfigError, match=r"reward.scorer_ema_every"):
        load_config("nover", ["reward.scorer=ema", "reward.scorer_ema_every=0"])
    with pytest.raises(ConfigError, match=r"trainer.strategy=fsdp shards: use trainer.strategy=ddp"):
        load_config("nover", ["reward.scorer=ema", "trainer.strategy=fsdp"])


# -- in the trainer ---------------------------------------------------------------------------

def recording(trainer) -> list[dict]:
    """The trainable weights before training and after every optimizer step (the trainer's own
    step, observed: the lagged copy is updated right after it)."""
    snapshots = [trainable(trainer.policy)]
    step = trainer.strategy.step

    def observed():
        norm = step()
        snapshots.append(trainable(trainer.policy))
        return norm

    trainer.strategy.step = observed
    return snapshots


@pytest.mark.parametrize("lora", [True, False])
def test_trainer_lagged_weights_equal_the_hand_ema(tiny_dir, tmp_path, lora):
    from rlpr.train.trainer import Trainer

    cfg = tiny_cfg(tiny_dir, tmp_path, "ema", "reward.scorer=ema", "reward.scorer_ema=0.5", "trainer.max_steps=2",
                   "trainer.mini_batch_prompts=2", "data.val=", f"model.lora={str(lora).lower()}",
                   "trainer.mixed_precision=none")
    trainer = Trainer(cfg, tmp_path / "ema")
    snapshots = recording(trainer)
    trainer.run()
    assert len(snapshots) == 5 and trainer.lagged.steps == 4  # 2 steps x 2 mini-batches
    names = set(trainer.lagged.weights)
    assert any("lora_" in n for n in names) == lora and (lora or len(names) == len(list(trainer.policy.parameters())))
    assert_weights_close(trainer.lagged.weights, hand_ema(snapshots, 0.5))
    assert not all(torch.equal(trainer.lagged.weights[n], snapshots[-1][n]) for n in names)  # it lags
    saved = load_state(latest_checkpoint(tmp_path / "ema"))["lagged"]
    assert saved["steps"] == 4 and all(torch.equal(saved["weights"][n], trainer.lagged.weights[n]) for n in names)


def comparable(metrics):
    return [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics]


def test_decay_one_scores_as_the_initial_model(tiny_dir, tmp_path):
    """scorer=ema with d = 1 never moves: its rewards are those of scorer=initial (the adapter-off
    base: the initial adapter adds exactly 0), step for step."""
    from rlpr.train.trainer import train

    runs = {}
    for name, extra in (("ema1", ["reward.scorer=ema", "reward.scorer_ema=1.0"]), ("init", ["reward.scorer=initial"])):
        train(tiny_cfg(tiny_dir, tmp_path, name, "trainer.max_steps=2", "data.val=", *extra))
        runs[name] = read_metrics(tmp_path / name)
    keys = ("reward/mean", "reward/score_b_mean", "reward/delta_mean")
    for a, b in zip(runs["ema1"], runs["init"]):
        for k in keys:
            if k in a:
                assert a[k] == pytest.approx(b[k], rel=1e-6), k


def test_straight_run_equals_resumed_run_with_the_lagged_scorer(tiny_dir, tmp_path):
    from rlpr.train.checkpoint import resume_config
    from rlpr.train.trainer import train

    extra = ("reward.scorer=ema", "reward.score_a=ema", "reward.scorer_ema=0.6", "data.val=")
    train(tiny_cfg(tiny_dir, tmp_path, "straight", "trainer.max_steps=4", *extra))
    train(tiny_cfg(tiny_dir, tmp_path, "resumed", "trainer.max_steps=2", *extra))
    train(resume_config(tmp_path / "resumed", ["trainer.max_steps=4"]), resume=str(tmp_path / "resumed"))
    a, b = adapter_tensors(tmp_path / "straight"), adapter_tensors(tmp_path / "resumed")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    la = load_state(latest_checkpoint(tmp_path / "straight"))["lagged"]
    lb = load_state(latest_checkpoint(tmp_path / "resumed"))["lagged"]
    assert la["steps"] == lb["steps"] == 8  # 4 steps x 2 mini-batches
    assert la["weights"].keys() == lb["weights"].keys()
    assert all(torch.equal(la["weights"][n], lb["weights"][n]) for n in la["weights"])
    assert comparable(read_metrics(tmp_path / "straight")) == comparable(read_metrics(tmp_path / "resumed"))
