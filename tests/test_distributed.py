"""Data-parallel training with torchrun on 2 CPU processes (gloo), on a tiny model."""

import json
import shutil

import pytest
from safetensors.torch import load_file

from rlpr.train.checkpoint import latest_checkpoint, list_checkpoints, load_state
from rlpr.config import load_config, validate_world
from rlpr.errors import ConfigError
from rlpr.train.tracking import read_metrics

from helpers import assert_close, common, torchrun

pytestmark = pytest.mark.distributed


def adapter(checkpoint):
    return load_file(str(checkpoint / "adapter" / "adapter_model.safetensors"))


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_processes_equal_one_process_and_resume_exactly(one_process_run, tiny_dir, tmp_path, strategy):
    two_procs = [f"trainer.strategy={strategy}"]
    one = one_process_run(2)
    # 4 steps, checkpointed after steps 2 and 4
    torchrun(common(tiny_dir, tmp_path, "two", 4) + two_procs + ["trainer.save_every=2"])
    at_2, at_4 = list_checkpoints(tmp_path / "two")
    two = adapter(at_2)
    assert any(v.abs().max() > 0 for k, v in two.items() if "lora_B" in k)
    assert_close(adapter(list_checkpoints(one)[1]), two, atol=1e-5)
    m1, m2 = read_metrics(one), read_metrics(tmp_path / "two")
    assert [m["step"] for m in m1] == [1, 2] and [m["step"] for m in m2] == [1, 2, 3, 4]  # only rank 0 writes
    for a, b in zip(m1, m2):
        assert a["filter/generated_groups"] == b["filter/generated_groups"]
        assert a["policy/tokens"] == b["policy/tokens"] and a["policy/updates"] == b["policy/updates"]
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["policy/grad_norm"] == pytest.approx(b["policy/grad_norm"], rel=1e-4)
    state = load_state(at_2)
    assert state["strategy"] == strategy and state["world_size"] == 2 and len(state["ranks"]) == 2

    # resume from step 2 under 2 processes: steps 3 and 4 are the uninterrupted run's, exactly
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / at_4.name)
    torchrun(["trainer.max_steps=4"], resume=str(tmp_path / "resumed"))
    resumed = latest_checkpoint(tmp_path / "resumed")
    assert_close(adapter(resumed), adapter(at_4), atol=0)
    s_resumed, s_straight = load_state(resumed), load_state(at_4)
    assert s_resumed["step"] == s_straight["step"] == 4
    assert s_resumed["filter"] == s_straight["filter"]
    assert [r["stream"] for r in s_resumed["ranks"]] == [r["stream"] for r in s_straight["ranks"]]


def test_accelerate_launch_equals_one_process(one_process_run, tiny_dir, tmp_path):
    torchrun(common(tiny_dir, tmp_path, "two", 1), launcher="accelerate")
    one_step = list_checkpoints(one_process_run(2))[0]  # the shared one-process run, after its first step
    assert_close(adapter(one_step), adapter(latest_checkpoint(tmp_path / "two")), atol=1e-5)
    assert load_state(latest_checkpoint(tmp_path / "two"))["world_size"] == 2


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_rank_with_every_group_filtered_does_not_hang(tiny_dir, tmp_path, strategy):
    """Rank 1 gets only prompts whose reference has no scorable token: every group it rolls has
    zero reward variance and is filtered out, while rank 0 keeps groups (under fsdp rank 1 runs
    zero-weight micro-batches in lock-step with rank 0's). The single held-out question leaves
    rank 1 nothing to evaluate: it must still join the evaluation's collectives."""
    data = tmp_path / "train.jsonl"
    rows = [{"question": f"Question {i}?", "answer": "Paris" if i % 2 == 0 else "\x16"} for i in range(16)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    val = tmp_path / "val.jsonl"
    val.write_text(json.dumps({"question": "Capital of France?", "answer": "Paris"}) + "\n")
    args = common(tiny_dir, tmp_path, "filtered", 3) + [
        f"data.train={data}", f"data.val={val}", "data.shuffle=false", "algorithm.filter_warmup_steps=1",
        "algorithm.filter_init_steps=1", "algorithm.filter_beta=1e-6", "algorithm.max_sampling_tries=2",
        "algorithm.on_insufficient=train", "reward.invalid_fallback=free", "reward.repetition_penalty=false",
        "reward.debias=false",  # B alone: every "Paris" group varies (B - A clipped at 0 can be all zeros)
        f"trainer.strategy={strategy}"]
    torchrun(args)
    metrics = read_metrics(tmp_path / "filtered")
    evals = [m for m in metrics if "eval/questions" in m]
    assert [(m["step"], m["eval/questions"]) for m in evals] == [(0, 1), (3, 1)]
    metrics = [m for m in metrics if "reward/mean" in m]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    later = metrics[1:]
    assert all(m["filter/kept_frac"] == pytest.approx(0.5) for m in later)
    assert all(m["policy/updates"] >= 1 for m in later)


def test_impossible_world_sizes():
    cfg = load_config("demo", ["trainer.prompts_per_step=6", "trainer.mini_batch_prompts=3"])
    with pytest.raises(ConfigError, match=r"trainer.mini_batch_prompts \(3\) must be divisible by the number of processes \(2\)"):
        validate_world(cfg, 2)
    validate_world(cfg, 3)
