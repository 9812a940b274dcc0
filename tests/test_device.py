"""model.device: the choice of device (CUDA faked with monkeypatch: this machine has none), its
errors, and training with model.device=cpu and =auto on the CPU."""

import pytest
import torch
from safetensors.torch import load_file

from rlpr.parallel import distributed as dist
from rlpr.train.checkpoint import latest_checkpoint
from rlpr.config import load_config
from rlpr.errors import ConfigError
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import train

pytestmark = pytest.mark.integration


def fake_cuda(monkeypatch, available: bool, count: int = 2, local_rank: str | None = None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count if available else 0)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)


def test_device_choice(monkeypatch):
    fake_cuda(monkeypatch, available=False)
    assert dist.resolve_device("auto") == torch.device("cpu")
    assert dist.resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ConfigError, match="model.device=cuda, but CUDA is not available"):
        dist.resolve_device("cuda")
    fake_cuda(monkeypatch, available=True)
    assert dist.resolve_device("auto") == torch.device("cuda", 0)
    assert dist.resolve_device("cuda") == torch.device("cuda", 0)
    assert dist.resolve_device("cpu") == torch.device("cpu")  # cpu even with a GPU
    fake_cuda(monkeypatch, available=True, local_rank="1")  # the second process of torchrun
    assert dist.resolve_device("auto") == torch.device("cuda", 1)
    assert dist.resolve_device("cuda") == torch.device("cuda", 1)
    fake_cuda(monkeypatch, available=True, count=2, local_rank="2")
    with pytest.raises(ConfigError, match="LOCAL_RANK=2 but only 2 GPU"):
        dist.resolve_device("auto")
    with pytest.raises(ConfigError, match="model.device: 'gpu' is not one of auto, cpu, cuda"):
        dist.resolve_device("gpu")


def test_collectives_use_the_cpu_without_a_process_group():
    assert dist.collective_device() == torch.device("cpu")
    assert dist.sum_values([1.0, 2.0]) == [1.0, 2.0] and dist.max_value(3.0) == 3.0


def test_backend_and_collective_device_follow_the_model_device(monkeypatch):
    calls = []
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setattr(dist, "initialized", lambda: False)
    monkeypatch.setattr(dist.dist, "init_process_group", lambda backend, timeout: calls.append(backend))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(torch.device(d)))
    dist.init_from_env(torch.device("cpu"))
    dist.init_from_env(torch.device("cuda", 1))
    assert calls == ["gloo", torch.device("cuda", 1), "nccl"]  # the GPU is chosen before NCCL starts
    monkeypatch.setattr(dist, "initialized", lambda: True)
    monkeypatch.setattr(dist.dist, "get_backend", lambda: "nccl")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert dist.collective_device() == torch.device("cuda", 1)  # NCCL takes CUDA tensors only
    monkeypatch.setattr(dist.dist, "get_backend", lambda: "gloo")
    assert dist.collective_device() == torch.device("cpu")


@pytest.mark.parametrize("override,message", [
    ("model.device=cuda", "model.device=cuda, but CUDA is not available"),
    ("model.device=gpu", "model.device: 'gpu' is not one of auto, cpu, cuda"),
])
def test_device_errors_are_one_line(override, message, capsys, monkeypatch):
    from rlpr.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["train", override]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_cpu_and_auto_train_identically_on_the_cpu(tiny_dir, tmp_path):
    runs = {}
    for device in ("cpu", "auto"):
        cfg = load_config("demo", [
            f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}", f"trainer.name={device}",
            f"model.device={device}", "trainer.max_steps=2", "rollout.max_new_tokens=8",
            "rollout.responses_per_prompt=4", "trainer.prompts_per_step=4", "trainer.mini_batch_prompts=2",
            "trainer.micro_batch_sequences=3", "data.demo_train_size=40", "data.val=",
            "trainer.progress=false", "trainer.tensorboard=false", "algorithm.filter_warmup_steps=2",
            "algorithm.filter_init_steps=1", "trainer.lr=1e-3", "algorithm.kl_coef=0.05"])
        train(cfg)
        runs[device] = tmp_path / device
    a = load_file(str(latest_checkpoint(runs["cpu"]) / "adapter" / "adapter_model.safetensors"))
    b = load_file(str(latest_checkpoint(runs["auto"]) / "adapter" / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = lambda ms: [{k: v for k, v in m.items() if not k.startswith("perf/")} for m in ms]  # noqa: E731
    assert drop(read_metrics(runs["cpu"])) == drop(read_metrics(runs["auto"]))


def test_loading_and_the_rollout_copy_honour_the_device(tiny_dir, tiny_model):
    """`meta` stands in for a GPU: every weight and buffer must land on the device asked for."""
    from rlpr.model.loading import load_policy
    from rlpr.rollout.hf import plain_copy

    copy = plain_copy(tiny_model, torch.bfloat16, "meta")
    model, _ = load_policy(tiny_dir, device="meta")
    for m in (copy, model):
        assert {t.device.type for t in [*m.parameters(), *m.buffers()]} == {"meta"}
