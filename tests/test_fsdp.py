"""Fully sharded training (trainer.strategy=fsdp, FSDP2) on 2 CPU processes (gloo), tiny model:
the same parameters as one process for full fine-tuning, and exact resume (the LoRA case is
parametrized with ddp in test_distributed.py)."""

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rlpr.train.checkpoint import latest_checkpoint, list_checkpoints
from rlpr.config import load_config
from rlpr.errors import ConfigError
from rlpr.parallel.sharding import Replicated, make_strategy

from helpers import assert_close, common, rank_reports, torchrun

pytestmark = pytest.mark.distributed


def fsdp(tiny_dir, out, name, steps, *extra):
    return common(tiny_dir, out, name, steps) + ["trainer.strategy=fsdp", *extra]


def full_model(checkpoint):
    return load_file(str(checkpoint / "model" / "model.safetensors"))


def test_fsdp_full_fine_tuning_equals_one_process(one_process_run, tiny_dir, tmp_path):
    extra = ["model.lora=false", "trainer.lr=1e-4"]
    one = one_process_run(2, *extra)
    # 3 steps, checkpointed after steps 2 and 3
    torchrun(fsdp(tiny_dir, tmp_path, "two", 3, *extra, "trainer.save_every=2"))
    at_2, at_3 = list_checkpoints(tmp_path / "two")
    one, two = full_model(latest_checkpoint(one)), full_model(at_2)
    initial = load_file(str(Path(tiny_dir) / "model.safetensors"))
    assert any((two[k] - initial[k]).abs().max() > 0 for k in initial)
    assert_close(one, two, atol=1e-5)

    # resume from step 2: full weights and Adam states are loaded back into the shards, and step 3
    # is the uninterrupted run's, exactly
    shutil.copytree(tmp_path / "two", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / at_3.name)
    torchrun(["trainer.max_steps=3"], resume=str(tmp_path / "resumed"))
    assert_close(full_model(latest_checkpoint(tmp_path / "resumed")), full_model(at_3), atol=0)


def test_fsdp_config_errors_and_one_process():
    with pytest.raises(ConfigError, match="trainer.strategy"):
        load_config("demo", ["trainer.strategy=horovod"])
    # the paper's setting: sharded full fine-tuning with activation checkpointing (issue 27)
    cfg = load_config("paper", ["trainer.strategy=fsdp", "trainer.cpu_offload=true"])
    assert cfg.model.gradient_checkpointing and not cfg.model.lora
    load_config("paper", ["trainer.strategy=deepspeed"])
    with pytest.raises(ConfigError, match="trainer.cpu_offload .* needs trainer.strategy=fsdp or deepspeed"):
        load_config("demo", ["trainer.cpu_offload=true"])
    assert isinstance(make_strategy("fsdp", policy=None), Replicated)  # one process: nothing to shard


# Every 2-process check below runs in ONE torchrun launch (two fresh interpreters importing torch,
# transformers and peft cost more than the checks): the worker runs each case in turn and reports
# a JSON object case -> values; each test reads its case's values.
WORKER = '''
import copy, json, sys, torch
from torch.distributed.tensor import DTensor
from rlpr.parallel import distributed as dist, sharding
from rlpr.config import load_config
from rlpr.model.forward import causal_lm, checkpointing_on
from rlpr.model.loading import load_model
from rlpr.model.weights import merged_weights
from rlpr.rollout.hf import HFRollout
from rlpr.train.setup import build_policy
from rlpr.train.update import Sample, accumulate_gradients, fill_logprobs

dist.init_from_env()


def gradients(model_dir, lora, precision_name, *options):
    cfg = load_config("demo", [f"model.path={model_dir}", f"model.lora={lora}"])
    checkpointing, offload = "ckpt" in options, "offload" in options

    def precision(strategy):  # as Trainer._precision
        return torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision_name == "bf16",
                              cache_enabled=strategy.autocast_cache)
    torch.manual_seed(0)  # the same LoRA initialisation on every rank, as the trainer does
    model, _ = load_model(cfg.model.path)
    single = build_policy(cfg, copy.deepcopy(model)).train()  # never checkpointed: the reference gradient
    torch.manual_seed(0)
    cfg.model.gradient_checkpointing = checkpointing
    policy = build_policy(cfg, model).train()
    assert checkpointing_on(causal_lm(policy)) == checkpointing
    g = torch.Generator().manual_seed(1)

    def groups(n, plen):
        out = []
        for i in range(n):
            prompt = torch.randint(0, 1000, (plen,), generator=g).tolist()
            out += [Sample(prompt + torch.randint(0, 1000, (2 + (i + j) % 4,), generator=g).tolist(), plen, j - 1.0)
                    for j in range(3)]
        return out

    shares = [groups(3, 5), groups(1, 7)]  # rank 0: 6 micro-batches of 2 sequences, rank 1: 2
    strategy = sharding.make_strategy("fsdp", policy, cpu_offload=offload)
    with strategy.gathered():
        for _ in range(dist.rank() + 1):  # unequal numbers of no-grad forwards
            fill_logprobs(policy, shares[dist.rank()], "old_logp", 2, 0, 1.0)
    with precision(strategy), strategy.training():
        # as the trainer does: with checkpointing each micro-batch runs its prompt
        accumulate_gradients(policy, shares[dist.rank()], cfg.algorithm, 2, 0, 1.0, share_prefix=not checkpointing,
                             lockstep=True)
    grads = {n: p.grad.full_tensor() for n, p in policy.named_parameters() if p.requires_grad}

    everything = shares[0] + shares[1]  # the same mini-batch in one process
    fill_logprobs(single, everything, "old_logp", 2, 0, 1.0)
    sum_values, dist.sum_values = dist.sum_values, lambda v: list(v)  # this process's counts are the global ones
    try:
        with precision(sharding.Replicated()):
            accumulate_gradients(single, everything, cfg.algorithm, 2, 0, 1.0)
    finally:
        dist.sum_values = sum_values
    expected = {n: p.grad for n, p in single.named_parameters() if p.requires_grad}
    assert grads.keys() == expected.keys()
    diff = sum((grads[k] - expected[k]).norm() ** 2 for k in grads) ** 0.5
    return [(diff / sum(expected[k].norm() ** 2 for k in grads) ** 0.5).item()]  # of the whole gradient


def sync(model_dir, lora):
    cfg = load_config("demo", [f"model.path={model_dir}", f"model.lora={lora}"])
    torch.manual_seed(0)
    model, tokenizer = load_model(cfg.model.path)
    policy = build_policy(cfg, model)
    with torch.no_grad():  # non-zero LoRA deltas (lora_B starts at 0) and moved weights
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    expected = {k: v.clone() for k, v in merged_weights(policy).items()}
    engine = HFRollout(policy, tokenizer, dtype=torch.float32)  # built before sharding, as the trainer does
    with torch.no_grad():
        for p in engine.model.parameters():
            p.zero_()
    strategy = sharding.make_strategy("fsdp", policy)
    layers = strategy.layers
    most = 0

    def watched(pairs):  # how many decoder layers are gathered (plain tensors, not DTensor shards) at once
        nonlocal most
        for pair in pairs:
            most = max(most, sum(not any(isinstance(p, DTensor) for p in l.parameters()) for l in layers))
            yield pair

    engine.sync(policy, watched(strategy.full_weights(policy)))
    got = engine.model.state_dict()
    assert set(got) == set(expected), set(got) ^ set(expected)
    diff = max((got[k] - expected[k]).abs().max().item() for k in expected)
    after = sum(not any(isinstance(p, DTensor) for p in l.parameters()) for l in layers)
    return [most, diff, after]


CHECKS = {"gradients": gradients, "sync": sync}
results = {}
for case, (check, *args) in json.loads(sys.argv[2]).items():
    results[case] = CHECKS[check](sys.argv[1], *args)
report(json.dumps(results, separators=(",", ":")))
'''

GRADIENT_CASES = [("true", "fp32", ""), ("false", "fp32", ""), ("true", "bf16", ""), ("false", "bf16", ""),
                  ("false", "fp32", "ckpt"), ("true", "fp32", "ckpt"), ("false", "bf16", "ckpt,offload")]
CASES = {**{f"gradients-{'-'.join(c for c in case if c)}": ["gradients", case[0], case[1], *case[2].split(",")]
            for case in GRADIENT_CASES},
         **{f"sync-{lora}": ["sync", lora] for lora in ("true", "false")}}


@pytest.fixture(scope="module")
def worker_reports(tiny_dir, tmp_path_factory):
    # case -> [rank 0's values, rank 1's]
    rows = rank_reports(WORKER, tmp_path_factory.mktemp("fsdp-workers"), tiny_dir, json.dumps(CASES))
    ranks = [json.loads(row[0]) for row in rows]
    return {case: [rank[case] for rank in ranks] for case in CASES}


@pytest.mark.parametrize("lora,precision,options", GRADIENT_CASES)
def test_fsdp_gradients_with_unequal_work_equal_one_process(worker_reports, lora, precision, options):
    """Ranks with different numbers of forwards and micro-batches: the summed sharded gradient is
    the single-process gradient of the whole mini-batch, in fp32 and under bf16 autocast (where
    autocast's weight cache lost gradients under FSDP: 32% off); with activation checkpointing
    (`ckpt`: model.gradient_checkpointing on the sharded side only) and FSDP2's CPU offload."""
    diffs = [row[0] for row in worker_reports[f"gradients-{'-'.join(c for c in (lora, precision, options) if c)}"]]
    # bf16: rounding of different matmul shapes (one process shares the prompt's forward)
    assert len(diffs) == 2 and max(diffs) < (1e-5 if precision == "fp32" else 0.02), diffs


@pytest.mark.parametrize("lora", ["true", "false"])
def test_fsdp_sync_gathers_one_layer_at_a_time(worker_reports, lora):
    """The rollout copy's weights come from the shards one decoder layer at a time (never the whole
    model gathered beside the copy): they equal the unsharded policy's (LoRA merged), and every
    layer is sharded again afterwards."""
    rows = worker_reports[f"sync-{lora}"]
    assert len(rows) == 2
    for most, diff, after in rows:
        assert most == 1 and diff == 0.0 and after == 0


def test_vllm_lora_is_refused_under_fsdp():
    with pytest.raises(ConfigError, match="rollout.vllm_lora .* use trainer.strategy=ddp"):
        load_config("demo", ["rollout.engine=vllm", "rollout.vllm_lora=true", "trainer.strategy=fsdp"])
