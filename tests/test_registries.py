"""Registries are the whole truth: every named choice is looked up in its registry, and an unknown
name fails with one line that lists the known ones (issue 15)."""

from __future__ import annotations

import pytest
import torch

from rlpr.algorithms.advantages import ADVANTAGES, compute_advantages, get_advantage
from rlpr.data.templates import TEMPLATES, build_messages
from rlpr.grading import GRADERS, grade
from rlpr.model.precision import (MIXED_PRECISION, ROLLOUT_DTYPES, autocast_dtype, resolve_mixed_precision,
                                  resolve_rollout_dtype, update_autocast)
from rlpr.parallel.sharding import STRATEGIES, make_strategy
from rlpr.reward.parsing import FORMAT_MODES, format_reward, parse_response
from rlpr.rollout.hf import DECODE_LOOPS, HFRollout, decode_loop

pytestmark = pytest.mark.unit

CPU = torch.device("cpu")


def one_line_error(call, exception=ValueError) -> str:
    with pytest.raises(exception) as err:
        call()
    message = str(err.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("call,message", [
    (lambda: parse_response("x", "xml"), "unknown format mode 'xml'; choose one of r1, r1_nothink, boxed"),
    (lambda: format_reward("x", "xml"), "unknown format mode 'xml'; choose one of r1, r1_nothink, boxed"),
    (lambda: decode_loop("beam"), "unknown rollout.decode_loop 'beam'; choose one of auto, rlpr, generate, graph"),
    (lambda: resolve_rollout_dtype("float16", CPU),
     "unknown model.rollout_dtype 'float16'; choose one of bfloat16, float32, auto"),
    (lambda: resolve_mixed_precision("fp16", CPU),
     "unknown trainer.mixed_precision 'fp16'; choose one of none, bf16, auto"),
    (lambda: autocast_dtype("auto"),
     "unknown trainer.mixed_precision (resolved) 'auto'; choose one of none, bf16"),
    (lambda: get_advantage("ppo"),
     "unknown advantage 'ppo'; choose one of grpo, rloo, dr_grpo, reinforce_pp, reinforce"),
    (lambda: compute_advantages(torch.zeros(2, 4), "ppo"),
     "unknown advantage 'ppo'; choose one of grpo, rloo, dr_grpo, reinforce_pp, reinforce"),
    (lambda: grade("essay", "x", "y"), "unknown grader 'essay'; choose one of multiple_choice, math, short_answer"),
    (lambda: make_strategy("zero", None), "unknown trainer.strategy 'zero'; choose one of ddp, fsdp, deepspeed"),
    (lambda: build_messages("Q", "chatml"), "unknown template 'chatml'; choose one of r1, r1_nothink, r1_user, plain, steps"),
], ids=["parse", "format", "decode_loop", "rollout_dtype", "mixed_precision", "autocast", "advantage",
        "compute_advantages", "grader", "strategy", "template"])
def test_unknown_names_fail_with_the_known_ones(call, message):
    assert one_line_error(call) == message


def test_an_unknown_decode_loop_fails_before_the_rollout_copy_is_made(tiny_model, tokenizer):
    message = one_line_error(lambda: HFRollout(tiny_model, tokenizer, torch.float32, loop="beam"))
    assert message == "unknown rollout.decode_loop 'beam'; choose one of auto, rlpr, generate, graph"


def test_every_registered_name_resolves():
    for mode in FORMAT_MODES:
        assert format_reward("<think> r </think> <answer> x </answer> \\boxed{x}", mode) in (0.0, 1.0)
    assert format_reward("<think> r </think> <answer> x </answer>", "r1") == 1.0
    assert format_reward("<answer> x </answer>", "r1_nothink") == 1.0
    assert format_reward("so \\boxed{4}", "boxed") == 1.0
    assert set(DECODE_LOOPS) == {"rlpr", "generate", "graph"}
    assert DECODE_LOOPS["rlpr"].preallocated and not DECODE_LOOPS["generate"].preallocated
    assert {name: resolve_rollout_dtype(name, CPU) for name in ROLLOUT_DTYPES} == {
        "bfloat16": torch.bfloat16, "float32": torch.float32}
    assert {name: autocast_dtype(resolve_mixed_precision(name, CPU)) for name in MIXED_PRECISION} == {
        "none": None, "bf16": torch.bfloat16}
    with update_autocast("bf16", CPU):
        assert torch.is_autocast_enabled("cpu")
    with update_autocast("none", CPU):
        assert not torch.is_autocast_enabled("cpu")
    # only the batch estimators take the batch's moments; the trainer sums them over ranks for them
    assert [name for name, e in ADVANTAGES.items() if e.batch] == ["reinforce_pp", "reinforce"]
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 2.0, 3.0, 6.0]])
    for name, estimator in ADVANTAGES.items():
        torch.testing.assert_close(estimator(rewards), compute_advantages(rewards, name), rtol=0, atol=0)
    for name in GRADERS:
        assert not grade(name, "no answer here", "42").correct
    assert set(STRATEGIES) == {"ddp", "fsdp", "deepspeed"}
    for name in TEMPLATES:
        messages = build_messages("Q?", name, multiple_choice=True)
        assert messages[-1]["role"] == "user" and messages[-1]["content"].startswith("Q?")
