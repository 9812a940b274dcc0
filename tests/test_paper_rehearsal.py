"""The paper's setting, rehearsed on 2 CPU processes (issue 27): `torchrun -m rlpr train --preset
paper` with a tiny Qwen2.5-shaped model and scaled-down sizes, under the preset's own sharding
(trainer.strategy=fsdp), activation checkpointing, full fine-tuning and token-budget micro-batches.
It runs 2 steps, checkpoints after each, and a resume from step 1 reproduces step 2 exactly (the std
filter is on from step 2: filter_warmup_steps=1); with rollout.engine=vllm too where vLLM is installed (its own environment, docs/vllm.md; skipped elsewhere)."""

import importlib.util
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from rlpr.config import load_config
from rlpr.train.checkpoint import latest_checkpoint, list_checkpoints
from rlpr.train.tracking import read_metrics

from helpers import assert_close, torchrun

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def tiny_qwen_dir(tmp_path_factory, tokenizer):
    """A random 2-layer model of Qwen2.5's shape (GQA, q/k/v biases, tied embeddings), SmolLM2's vocabulary;
    head size 64, which vLLM's CPU attention takes."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    path = tmp_path_factory.mktemp("tiny-qwen2.5")
    Qwen2ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def scaled_down(model_dir, out, name):
    """The paper preset's keys at laptop size; everything else (fsdp, checkpointing, full fine-tuning,
    r1 format, threshold shaping, the std filter, clip-higher) stays the preset's. The random model never
    writes the r1 tags, so responses are scored without them (spec 1b fallback)."""
    return [f"model.path={model_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
            "trainer.prompts_per_step=4", "trainer.mini_batch_prompts=2", "rollout.responses_per_prompt=4",
            "rollout.max_new_tokens=24", "rollout.batch_sequences=16", "data.max_prompt_tokens=256",
            "trainer.micro_batch_tokens=192", "data.demo_train_size=16", "data.demo_val_size=4",
            "trainer.max_steps=2", "trainer.save_every=1", "trainer.eval_every=0", "trainer.lr=1e-4",
            "reward.invalid_fallback=free", "model.rollout_dtype=float32", "algorithm.filter_warmup_steps=1",
            "algorithm.filter_init_steps=1", "trainer.tensorboard=false", "trainer.sample_every=0",
            "trainer.report=false"]  # the report's own tests draw it (test_report*.py): ~6 s of matplotlib


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_paper_preset_rehearsal_runs_checkpoints_and_resumes_exactly(tiny_qwen_dir, tmp_path, engine):
    extra = []
    if engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            pytest.skip("vLLM is not installed (docs/vllm.md: its own environment)")
        if len(os.sched_getaffinity(0)) < 2:
            pytest.skip("two engines need two cores (spinning OpenMP threads)")
        extra = ["rollout.engine=vllm", "rollout.vllm_kv_cache_gb=1"]
    args = ["--preset", "paper", *scaled_down(tiny_qwen_dir, tmp_path, "paper"), *extra]
    cfg = load_config("paper", args[2:])
    assert cfg.trainer.strategy == "fsdp" and cfg.model.gradient_checkpointing and not cfg.model.lora
    torchrun(args, launcher="torchrun")  # the command a user types, its launcher included
    run = tmp_path / "paper"
    metrics = [m for m in read_metrics(run) if "policy/updates" in m]
    assert len(metrics) == 2 and sum(m["policy/updates"] for m in metrics) > 0
    # the budget (192 tokens, padding included) splits each update into several forwards
    trained = [m for m in metrics if m["policy/updates"]]
    assert all(m["perf/micro_batches"] > m["policy/updates"] for m in trained)
    initial = load_file(f"{tiny_qwen_dir}/model.safetensors")
    final = load_file(str(latest_checkpoint(run) / "model" / "model.safetensors"))
    assert any((final[k] - initial[k]).abs().max() > 0 for k in initial)

    # resume from the step-1 checkpoint: step 2 is the uninterrupted run's, exactly
    at_1, at_2 = list_checkpoints(run)
    shutil.copytree(run, tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / at_2.name)
    # forked ranks (helpers.launch), or torchrun where the ranks start vLLM engines (the server never imported vLLM)
    torchrun(["trainer.max_steps=2"], resume=str(tmp_path / "resumed"), launcher="torchrun" if extra else None)
    assert_close(load_file(str(latest_checkpoint(tmp_path / "resumed") / "model" / "model.safetensors")), final,
                 atol=0)
