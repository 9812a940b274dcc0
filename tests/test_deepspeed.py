"""DeepSpeed ZeRO (trainer.strategy=deepspeed) on 2 CPU processes (gloo), tiny model: the same
parameters and gradient norms as one process, and exact resume."""

import importlib.util
import shutil
import sys

import pytest
from safetensors.torch import load_file

from rlpr.train.checkpoint import latest_checkpoint, list_checkpoints, load_state
from rlpr.config import load_config
from rlpr.errors import ConfigError
from rlpr.train.tracking import read_metrics

from helpers import assert_close, common, torchrun

pytestmark = pytest.mark.distributed


def trained(checkpoint):
    """The checkpoint's trained weights: the LoRA adapter, or the full model."""
    adapter = checkpoint / "adapter" / "adapter_model.safetensors"
    return load_file(str(adapter if adapter.exists() else checkpoint / "model" / "model.safetensors"))


# grad_clip=1e-6 (gradient norms here are about 4e-6): DeepSpeed's clipping is what is compared
# (unclipped, the weights differ by 2e-3 after 2 steps)
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="pip install deepspeed")
# ckpt-offload: activation checkpointing and ZeRO-Offload on the DeepSpeed side only (the paper's
# setting, issue 27): the same weights as one process without either
@pytest.mark.parametrize("stage,extra,resume,sharded", [
    (2, ["model.lora=false", "trainer.lr=1e-3", "trainer.grad_clip=1e-6"], True, []), (1, [], False, []),
    (2, ["model.lora=false", "trainer.lr=1e-3", "trainer.grad_clip=1e-6"], False,
     ["model.gradient_checkpointing=true", "trainer.cpu_offload=true"])],
    ids=["zero2-full-resume", "zero1-lora", "zero2-full-ckpt-offload"])
def test_deepspeed_equals_one_process_and_resumes_exactly(one_process_run, tiny_dir, tmp_path, stage, extra, resume,
                                                         sharded):
    one = one_process_run(2, *extra)  # shared with the other cases of the same `extra` (and test_distributed.py)
    zero = [*extra, *sharded, "trainer.strategy=deepspeed", f"trainer.zero_stage={stage}"]
    # with resume: 3 steps, checkpointed after steps 2 and 3
    torchrun(common(tiny_dir, tmp_path, "two", 3 if resume else 2) + zero + ["trainer.save_every=2"])
    at_2 = list_checkpoints(tmp_path / "two")[0]
    assert_close(trained(latest_checkpoint(one)), trained(at_2), atol=1e-5)
    m1, m2 = read_metrics(one), read_metrics(tmp_path / "two")
    for a, b in zip(m1, m2[:2]):
        assert a["policy/tokens"] == b["policy/tokens"] and a["policy/updates"] == b["policy/updates"]
        # step 2's rollouts and rewards on both processes come from the weights after step 1
        assert a["reward/mean"] == pytest.approx(b["reward/mean"], abs=1e-6)
        assert a["policy/grad_norm"] == pytest.approx(b["policy/grad_norm"], rel=1e-4)  # before clipping
    state = load_state(at_2)
    assert state["strategy"] == "deepspeed" and len(state["optimizer"]) == 2  # each process's ZeRO shard
    if not resume:
        return

    # resume from the step-2 checkpoint: step 3 is the uninterrupted run's, exactly
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    at_3 = latest_checkpoint(tmp_path / "two")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / at_3.name)
    torchrun(["trainer.max_steps=3"], resume=str(tmp_path / "resumed"))
    assert_close(trained(latest_checkpoint(tmp_path / "resumed")), trained(at_3), atol=0)


def test_deepspeed_config_errors(monkeypatch):
    with pytest.raises(ConfigError, match=r"trainer.zero_stage=3 is not offered: use trainer.strategy=fsdp"):
        load_config("demo", ["trainer.strategy=deepspeed", "trainer.zero_stage=3"])
    with pytest.raises(ConfigError, match=r"trainer.zero_stage: 4 is not one of 1, 2"):
        load_config("demo", ["trainer.strategy=deepspeed", "trainer.zero_stage=4"])
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if not installed
    with pytest.raises(ConfigError, match=r"DeepSpeed is not installed \(pip install deepspeed\)"):
        load_config("demo", ["trainer.strategy=deepspeed"])
