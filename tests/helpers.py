"""Helpers that several test modules use: the tiny-run config, the torchrun launchers, and the
shared public data sets (a test that needs them skips with one line when they are absent)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlpr.config import load_config
from rlpr.train.checkpoint import latest_checkpoint

# ../shared/data beside the repository (never copied into it); RLPR_SHARED_DATA points elsewhere
SHARED_DATA = Path(os.environ.get("RLPR_SHARED_DATA") or Path(__file__).resolve().parents[2] / "shared" / "data")


def shared_data(rel: str = "") -> Path:
    """`rel` under the shared data folder; skips the calling test when that folder is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs the shared data sets in {SHARED_DATA} (absent)")
    return SHARED_DATA / rel


# -- single-process training runs on the tiny model ------------------------------------------------

def tiny_cfg(tiny_dir, out, name, *extra):
    return load_config("demo", [
        f"model.path={tiny_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
        "rollout.max_new_tokens=8", "rollout.responses_per_prompt=4", "trainer.prompts_per_step=4",
        "trainer.mini_batch_prompts=2", "trainer.micro_batch_sequences=3", "data.demo_train_size=40",
        "data.demo_val_size=4", "trainer.progress=false", "trainer.tensorboard=false",
        "algorithm.filter_warmup_steps=2", "algorithm.filter_init_steps=1", "trainer.lr=1e-3", *extra])


def adapter_tensors(run_dir):
    from safetensors.torch import load_file

    return load_file(str(latest_checkpoint(run_dir) / "adapter" / "adapter_model.safetensors"))


# -- multi-process runs (torchrun, accelerate) ----------------------------------------------------

TIMEOUT = 300


def common(tiny_dir, out, name, steps):
    return [f"model.path={tiny_dir}", f"trainer.output_dir={out}", f"trainer.name={name}",
            f"trainer.max_steps={steps}", "rollout.max_new_tokens=8", "rollout.responses_per_prompt=4",
            "trainer.prompts_per_step=4", "trainer.mini_batch_prompts=2", "trainer.micro_batch_sequences=3",
            "data.demo_train_size=40", "data.val=", "model.rollout_dtype=float32", "trainer.lr=1e-3",
            "trainer.tensorboard=false", "trainer.mixed_precision=none", "trainer.sample_every=0"]


LAUNCHERS = {
    "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"],
    # accelerate's multi-process launcher (torch elastic underneath); with no GPU, rlpr picks gloo
    "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes=2",
                   "--num_machines=1", "--mixed_precision=no", "--dynamo_backend=no", "--main_process_port=0"],
}


def torchrun(args, resume=None, launcher="torchrun"):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [*LAUNCHERS[launcher], "-m", "rlpr", "train", *args]
    if resume:
        cmd[cmd.index("train") + 1:cmd.index("train") + 1] = ["--resume", resume]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def assert_close(a, b, atol):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def write_eval_data(tmp_path):
    """A verl-layout parquet (math) and a flat multiple-choice jsonl with an _Avg2 suffix."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlpr.data.templates import build_messages

    rows = [{"data_source": "math500", "prompt": build_messages(f"What is {i} + {i}?", "r1"),
             "ability": "math", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
             "extra_info": {"index": f"m{i}"}} for i in range(3)]
    math_file = tmp_path / "math500.parquet"
    pq.write_table(pa.Table.from_pylist(rows), math_file)
    mc_file = tmp_path / "gpqa_tiny_Avg2.jsonl"
    with open(mc_file, "w") as f:
        for i in range(2):
            f.write(json.dumps({"question": f"Pick {i}", "answer": "B", "choices": ["x", "y", "z"]}) + "\n")
    return math_file, mc_file


class ScriptedEngine:
    """Returns fixed responses (cycled), so grading outcomes are known."""

    def __init__(self, tokenizer, responses):
        self.tokenizer, self.responses, self.i = tokenizer, responses, 0

    def generate(self, prompts, n, **kw):
        from rlpr.rollout.hf import Rollout

        out = []
        for p in range(len(prompts)):
            for _ in range(n):
                text = self.responses[self.i % len(self.responses)]
                self.i += 1
                out.append(Rollout(p, self.tokenizer(text)["input_ids"], text, True))
        return out
