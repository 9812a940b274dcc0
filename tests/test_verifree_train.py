"""`--preset verifree` (issue 19): the preset loads with VeriFree's choices, and training steps
run with it on the tiny model, through the command line and with scripted r1 responses."""

import math

import pytest
import yaml

from rlpr.cli.main import main
from rlpr.config import load_config
from rlpr.train.tracking import read_metrics

from helpers import ScriptedEngine, common

pytestmark = pytest.mark.integration


def test_preset_loads_with_verifree_choices(capsys):
    cfg = load_config("verifree")
    r, a = cfg.reward, cfg.algorithm
    assert (r.aggregation, r.score_span, r.debias, r.shaping, r.alpha, r.splice) == \
        ("seq_likelihood", "block", False, "identity", 0.0, "ids")
    assert (r.format_mode, cfg.data.template) == ("r1_nothink", "r1_nothink")
    assert (a.advantage, a.std_filter, a.pg_tokens, a.loss_agg, a.ref_sft_coef, a.ref_sft_weight, a.ref_sft_norm) == \
        ("rloo", False, "reasoning", "seq_mean_token_sum", 1.0, "reward", "sum")
    assert cfg.trainer.mini_batch_prompts == cfg.trainer.prompts_per_step  # one on-policy update per step
    assert main(["config", "--preset", "verifree", "algorithm.ref_sft_weight=advantage"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["preset"] == "verifree" and tree["algorithm"]["ref_sft_weight"] == "advantage"


def test_one_step_through_the_command_line(tiny_dir, tmp_path):
    assert main(["train", "--preset", "verifree", *common(tiny_dir, tmp_path, "vf", 1),
                 "trainer.progress=false", "trainer.eval_before=false"]) == 0
    steps = [m for m in read_metrics(tmp_path / "vf") if "policy/tokens" in m]
    assert len(steps) == 1 and math.isfinite(steps[0]["policy/ref_sft_logp"])


def test_step_with_r1_responses_trains_reasoning_and_reference(tiny_dir, tmp_path):
    """Valid responses: only their reasoning tokens enter the policy loss (the invalid one: all of
    its tokens), and every valid response's o' enters the reference-SFT term."""
    from rlpr.train.trainer import Trainer

    cfg = load_config("verifree", [*common(tiny_dir, tmp_path, "vf2", 1), "trainer.progress=false"])
    trainer = Trainer(cfg, tmp_path / "vf2")
    tok = trainer.tokenizer
    valid, invalid = "<think> it is </think>\n<answer> x </answer>", "no idea"
    trainer.engine = ScriptedEngine(tok, [valid, valid, valid, invalid])
    metrics = trainer.train_step(1)
    groups, n = cfg.trainer.prompts_per_step, cfg.rollout.responses_per_prompt
    reasoning = len(tok("<think> it is </think>\n", add_special_tokens=False)["input_ids"])
    per_group = 3 * reasoning + len(tok(invalid, add_special_tokens=False)["input_ids"])
    assert metrics["policy/tokens"] == groups * per_group
    assert metrics["reward/valid_frac"] == pytest.approx(3 / 4) and n == 4
    assert metrics["policy/ref_sft_logp"] < 0 and math.isfinite(metrics["policy/ref_sft_logp"])
