"""rlpr.integrations.trl: the RLPR reward inside TRL's GRPOTrainer, on a tiny in-process model (CPU).

The rewards TRL receives (its completions table, `log_completions`) are compared with `rlpr score`
(`score_file`) of the same responses under the policy as it was when TRL scored them; a 2-step
run with TRL's own generation trains.
"""

from __future__ import annotations

import copy
import json
import math
import sys

import pytest
import torch

pytest.importorskip("trl", minversion="1.16", reason="needs TRL >= 1.16 (pip install 'rlpr[trl]')")
pytest.importorskip("datasets", reason="needs datasets (installed with TRL)")

from rlpr.config import Config, RewardConfig  # noqa: E402
from rlpr.data.templates import build_messages  # noqa: E402
from rlpr.errors import ConfigError  # noqa: E402
from rlpr.evaluation.score_file import score_file  # noqa: E402
from rlpr.integrations.trl import RLPRReward  # noqa: E402
from rlpr.model.loading import load_tokenizer, tiny_llama  # noqa: E402

pytestmark = pytest.mark.unit

QUESTIONS = [("What is 2 + 2?", "4"), ("Name the capital of France.", "Paris"),
             ("What colour is the sky on a clear day?", "blue"), ("What is 3 * 5?", "15")]
# scripted completions: format-valid (right and wrong answers), tagless (scored through the
# fallback cue), and one that trips the repetition penalty
SCRIPT = ["<think>two and two make four</think> <answer>4</answer>",
          "I believe the answer is Paris, the largest city.",
          "<think>hmm</think>\n<answer>\ngreen</answer>",
          "one two three four five six seven eight nine ten " * 10]
TEMPERATURE = 0.8
# log-domain scores of the order of -10 (a random tiny model gives probabilities near 1 / vocabulary,
# so mean_prob rewards would all be ~1e-5 and a 1e-6 comparison would prove nothing)
REWARD = dict(aggregation="mean_logprob", shaping="identity", invalid_fallback="free")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("default")  # its own copy: TRL may set padding options on it


def dataset(n=4):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": build_messages(q, "r1"), "reference": y} for q, y in QUESTIONS[:n]])


def grpo_args(out, **kw):
    from trl import GRPOConfig

    base = dict(output_dir=str(out), use_cpu=True, bf16=False, per_device_train_batch_size=4, num_generations=4,
                max_completion_length=8, max_steps=2, learning_rate=1e-2, logging_steps=1, report_to=[],
                save_strategy="no", log_completions=True, num_completions_to_print=0, seed=0,
                temperature=TEMPERATURE, dataloader_num_workers=0)
    return GRPOConfig(**{**base, **kw})


class Recorded(RLPRReward):
    """The reward, keeping a copy of the policy's weights at each scoring call."""

    snapshots: list

    def __call__(self, *args, **kwargs):
        self.snapshots.append(copy.deepcopy(self.policy().state_dict()))
        return super().__call__(*args, **kwargs)


def scripted_rollout(tok):
    """TRL's rollout_func: the prompts as TRL's chat template renders them, scripted completions."""
    state = {"i": 0}

    def rollout(prompts, trainer):
        prompt_ids, completion_ids = [], []
        for p in prompts:
            text = tok.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
            prompt_ids.append(tok(text, add_special_tokens=False)["input_ids"])
            completion = SCRIPT[state["i"] % len(SCRIPT)]
            state["i"] += 1
            completion_ids.append(tok(completion, add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout


def trl_rewards(out, step):
    """What TRL recorded for a step: (prompt messages, response, reward) per completion."""
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "completions" / f"completions_{step:05d}.parquet").to_pylist()
    return [(r["prompt"], r["completion"][0]["content"], r["rlpr"]) for r in rows]


def rlpr_score(tmp_path, tok, weights, reward_cfg, rows, name):
    """`rlpr score` (score_file) of (prompt messages, response) rows under a tiny model with `weights`."""
    model = tiny_llama(tok, layers=2, hidden=64, seed=0)
    model.load_state_dict(weights)
    refs = {q: y for q, y in QUESTIONS}
    src, dst = tmp_path / f"{name}.jsonl", tmp_path / f"{name}.out.jsonl"
    src.write_text("".join(json.dumps({"prompt": p, "response": r, "reference": refs[p[-1]["content"]]}) + "\n"
                           for p, r, _ in rows))
    cfg = Config(reward=reward_cfg)
    cfg.rollout.temperature = TEMPERATURE
    score_file(cfg, str(src), str(dst), model=model, tokenizer=tok)
    return [json.loads(line)["reward"] for line in dst.read_text().splitlines()]


def test_the_rewards_trl_receives_equal_rlpr_score_under_the_current_policy(tmp_path, tok):
    """Two steps with scripted completions and score A from the current policy: each step's
    rewards equal `rlpr score` under the policy of that step (the second after one update)."""
    from trl import GRPOTrainer

    torch.manual_seed(0)
    reward_cfg = RewardConfig(**REWARD, score_a="current")
    reward = Recorded(reward_cfg)
    reward.snapshots = []
    out = tmp_path / "run"
    trainer = GRPOTrainer(model=tiny_llama(tok, layers=2, hidden=64, seed=0), args=grpo_args(out),
                          reward_funcs=reward, train_dataset=dataset(), processing_class=tok,
                          rollout_func=scripted_rollout(tok))
    reward.bind(trainer)
    trainer.train()

    assert len(reward.snapshots) == 2
    moved = max((reward.snapshots[1][k] - reward.snapshots[0][k]).abs().max().item() for k in reward.snapshots[0])
    assert moved > 1e-4  # the second step is scored by an updated policy
    for step in (1, 2):
        rows = trl_rewards(out, step)
        assert len(rows) == 4 and {r for _, r, _ in rows} <= set(SCRIPT)
        ours = rlpr_score(tmp_path, tok, reward.snapshots[step - 1], reward_cfg, rows, f"step{step}")
        theirs = [x for _, _, x in rows]
        assert all(abs(x) > 1e-3 for x in theirs)  # log-domain rewards, far from 0
        assert max(abs(a - b) for a, b in zip(ours, theirs)) < 1e-6, (ours, theirs)
    # a stale policy would be caught: the step-2 responses under the initial weights score differently
    stale = rlpr_score(tmp_path, tok, reward.snapshots[0], reward_cfg, trl_rewards(out, 2), "stale")
    assert max(abs(a - x) for a, (_, _, x) in zip(stale, trl_rewards(out, 2))) > 1e-4


def test_a_two_step_grpo_run_with_trl_generation_trains(tmp_path, tok):
    """TRL's own sampling, full fine-tuning, beta=0, score A from the initial policy (computed for
    every prompt when bound): the parameters change, the logged rewards and rlpr scores are finite,
    and the first step's rewards equal `rlpr score` under the initial weights."""
    from trl import GRPOTrainer

    torch.manual_seed(0)
    reward_cfg = RewardConfig(**REWARD)  # score_a=initial (the default)
    reward = Recorded(reward_cfg)
    reward.snapshots = []
    model = tiny_llama(tok, layers=2, hidden=64, seed=0)
    initial = copy.deepcopy(model.state_dict())
    out = tmp_path / "run"
    trainer = GRPOTrainer(model=model, args=grpo_args(out), reward_funcs=reward, train_dataset=dataset(),
                          processing_class=tok)
    reward.bind(trainer)
    assert len(reward.reward.cache) == 2 * len(QUESTIONS)  # A per prompt: plain and fallback-cue forms
    trainer.train()

    changed = [k for k, v in model.state_dict().items() if not torch.equal(v, initial[k])]
    assert changed and max((model.state_dict()[k] - initial[k]).abs().max().item() for k in changed) > 1e-3
    logs = [entry for entry in trainer.state.log_history if "reward" in entry]
    assert len(logs) == 2
    for entry in logs:
        for key in ("reward", "rewards/rlpr/mean", "rlpr/score_b_mean", "rlpr/score_a_mean"):
            assert math.isfinite(entry[key]), (key, entry)
        assert entry["rlpr/score_b_mean"] < -1 and entry["rlpr/fallback_frac"] == 1.0  # tagless samples
    rows = trl_rewards(out, 1)
    ours = rlpr_score(tmp_path, tok, initial, reward_cfg, rows, "step1")
    assert max(abs(a - x) for a, (_, _, x) in zip(ours, rows)) < 1e-6


def test_under_lora_score_a_is_the_adapter_off_base(tmp_path, tok):
    """TRL's peft_config: nothing is precomputed at bind (A comes from the base with the adapter
    off, when asked); the first step (a fresh adapter changes nothing yet) equals `rlpr score`
    under the base weights, and the step moves the adapter."""
    from peft import LoraConfig
    from trl import GRPOTrainer

    reward_cfg = RewardConfig(**REWARD)  # score_a=initial
    model = tiny_llama(tok, layers=2, hidden=64, seed=0)
    base = copy.deepcopy(model.state_dict())
    out, reward = tmp_path / "run", RLPRReward(reward_cfg)
    trainer = GRPOTrainer(model=model, args=grpo_args(out, max_steps=1), reward_funcs=reward, train_dataset=dataset(),
                          processing_class=tok, rollout_func=scripted_rollout(tok),
                          peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    reward.bind(trainer)
    assert reward.reward.score_a.lora and len(reward.reward.cache) == 0
    trainer.train()
    rows = trl_rewards(out, 1)
    ours = rlpr_score(tmp_path, tok, base, reward_cfg, rows, "lora")
    assert max(abs(a - x) for a, (_, _, x) in zip(ours, rows)) < 1e-6
    lora = {k: v for k, v in reward.policy().state_dict().items() if "lora_B" in k}
    assert lora and any(v.abs().max() > 0 for v in lora.values())  # the adapter moved


def test_the_verifier_kind_grades_with_rlprs_graders(tmp_path, tok):
    """reward.kind=verifier: (1 - alpha) * the rule grader's verdict + alpha * format, from a
    bound reward called as TRL calls it (no forward pass)."""
    from trl import GRPOTrainer

    reward = RLPRReward(RewardConfig(kind="verifier"))
    trainer = GRPOTrainer(model=tiny_llama(tok, layers=2, hidden=64, seed=0), args=grpo_args(tmp_path),
                          reward_funcs=reward, train_dataset=dataset(), processing_class=tok)
    reward.bind(trainer)
    logged = {}
    responses = ["<think>2 and 2</think> <answer>4</answer>", "<think>guess</think> <answer>5</answer>",
                 "It is 4.", "<think>x</think> <answer>four</answer>"]
    rewards = reward(prompts=[build_messages("What is 2 + 2?", "r1")] * 4,
                     completions=[[{"role": "assistant", "content": r}] for r in responses],
                     reference=["4"] * 4, trainer_state=None, log_metric=logged.__setitem__)
    graded = reward.score([build_messages("What is 2 + 2?", "r1")] * 4, responses, reference=["4"] * 4)
    assert [o.correct for o in graded][:3] == [1.0, 0.0, 1.0]  # the short-answer grader reads "It is 4."
    assert rewards[:3] == pytest.approx([1.0, 0.1, 0.9])  # alpha = 0.1 on the format term
    assert logged["rlpr/format_rate"] == pytest.approx(0.75) and "rlpr/accuracy" in logged


def test_unbound_or_misconfigured_rewards_fail_in_one_line(tok):
    reward = RLPRReward()
    with pytest.raises(ConfigError, match="not bound to a trainer"):
        reward(prompts=["Q"], completions=["A"], reference=["x"])
    with pytest.raises(ConfigError, match="reward.aggregation"):
        RLPRReward(RewardConfig(aggregation="mean_logprob"))  # log domain needs the fallback
    with pytest.raises(ConfigError, match="expected a trl.GRPOTrainer"):
        reward.bind(object())


def test_a_missing_reference_column_names_the_columns(tmp_path, tok):
    from trl import GRPOTrainer

    reward = RLPRReward(RewardConfig(**REWARD, score_a="current"), reference_column="answer")
    trainer = GRPOTrainer(model=tiny_llama(tok, layers=2, hidden=64, seed=0), args=grpo_args(tmp_path),
                          reward_funcs=reward, train_dataset=dataset(), processing_class=tok)
    reward.bind(trainer)
    with pytest.raises(ConfigError, match=r"no column 'answer' \(its columns: reference\)"):
        reward(prompts=[build_messages("Q", "r1")], completions=[[{"role": "assistant", "content": "A"}]],
               reference=["x"], trainer_state=None)
    # score A from the initial policy, full fine-tuning, beta=0: bind reads every row, and says so first
    upfront = RLPRReward(RewardConfig(**REWARD), reference_column="answer")
    trainer = GRPOTrainer(model=tiny_llama(tok, layers=2, hidden=64, seed=0), args=grpo_args(tmp_path),
                          reward_funcs=upfront, train_dataset=dataset(), processing_class=tok)
    with pytest.raises(ConfigError, match=r"no column 'answer' \(its columns: prompt, reference\)"):
        upfront.bind(trainer)


def test_without_trl_the_module_imports_and_bind_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "trl", None)  # `import trl` now raises ImportError
    with pytest.raises(ConfigError, match=r"pip install 'rlpr\[trl\]'"):
        RLPRReward().bind(object())
