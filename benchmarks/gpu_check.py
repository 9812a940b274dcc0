"""The CUDA path in one command (issue 36): everything rlpr promises on a GPU, checked in at most 8
minutes on one H100, nothing downloaded, the figures written to gpu_check.json and gpu_check.md.

    python benchmarks/gpu_check.py --out DIR                  # on a GPU machine (docs/distributed.md)
    python benchmarks/gpu_check.py --device cpu --out DIR     # the CPU dry run (tests/test_gpu_check.py)

What it runs, each part timed against a deadline (`--budget-s`; a part that would not fit is
recorded as skipped, and the JSON is rewritten after every part, so a run cut short keeps what it
measured); the short parts (1, 4, 3) run before the shapes (2), which took 430 s on one H100:

1. the suite's CUDA tests (tests/test_cuda.py, in a pytest subprocess; they skip on a CPU);
2. per model shape (`--models`; on CUDA the Qwen2.5-0.5B and Qwen2.5-1.5B shapes: their published
   config.json numbers, random weights, a tokenizer made here), `rlpr train --preset paper`
   in-process on one device for 3 steps (full fine-tuning, gradient checkpointing, the 16384-token
   micro-batch budget, responses forced to `--response-tokens` with rollout.min_new_tokens): step
   time, rollout and update tokens/s, and per phase of a step (sync, rollout, scoring, update, step)
   the peak of torch.cuda.max_memory_allocated and max_memory_reserved beside `rlpr plan`'s total
   for the same configuration (`measured_over_plan`; the plan should hold within 25%);
3. score B of the same random model and texts on the device (fp32, and under bf16 autocast) against
   the CPU in fp32: the largest difference of a reference token's log-prob and of score B;
4. resume on the device: 3 steps with a checkpoint at step 2, then a resume from it; step 3's weights
   and metrics against the uninterrupted run's (bitwise, or within RESUME_TOLERANCE of step 3's own
   weight change, which CUDA's non-deterministic kernels may need);
5. the device's name, torch / CUDA / transformers versions;
6. `decode` (gpu_decode.py): the CUDA-graph decode loop's tokens/s against the eager loop's, 32/128/256
   rows of the Qwen2.5-0.5B shape, as a fraction of the HBM floor (issue 40);
7. `learning_cuda` (gpu_learning.py; only with --parts, it needs the embedded model carried over by
   gpu_transfer.py): the learning benchmark's RLPR and shuffled-reference runs on the GPU beside the CPU rows.

`--parts` selects parts; `--merge` keeps an earlier call's report (a plan over several calls or loans).

Scaled from the paper preset so that it fits the time (each change is in `paper_overrides`): 4 prompts
x 8 responses per step, 2 prompts per mini-batch (2 updates per step), no held-out evaluation, the std
filter off (a random model's rewards barely vary, and dynamic sampling would re-roll), the spec-1b
fallback for responses without the r1 tags (reward.invalid_fallback=free), no checkpoint writes in the
timed runs, and data.max_prompt_tokens set to the longest training prompt (the plan counts every
prompt at that length). Everything else is the preset's: fsdp (one process: ddp), fp32 update, bf16
rollout copy, 128 rows decoded at once, lr 1e-6.

The tokenizer is a byte-level BPE trained here on the demo questions and padded with tokens no text
encodes to, to the model's vocabulary size (151,936 for Qwen2.5): every id a random model samples
decodes. With ChatML's special tokens and template, as Qwen2.5's own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its parts in files of their own (gpu_decode, gpu_learning)
PLAN_TOLERANCE = 0.25  # |measured / planned - 1| of each phase's peak
# resume: max |w3(resumed) - w3| / max |w3 - w2| (step 3's own change), where not bitwise
RESUME_TOLERANCE = 1e-2

# The published config.json numbers of Qwen2.5-0.5B and -1.5B (tied embeddings, GQA, q/k/v biases)
SHAPES: dict[str, dict] = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                         max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # the resume check on a GPU: Qwen2.5's vocabulary and layout, 4 small layers
    "qwen-small": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True,
                       max_position_embeddings=4096, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # the CPU dry run
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True, max_position_embeddings=2048,
                 rope_theta=1000000.0, rms_norm_eps=1e-6),
}
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] "
          "+ '<|im_end|>\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{%- endif %}")
PHASES = ("sync", "rollout", "scoring", "update", "step")
HARD_EXTRA_S = 90
GiB = 1024 ** 3


# -- the model: a tokenizer made here, random weights from a config ------------------------------
def _corpus() -> list[str]:
    from rlpr.data.demo_tasks import demo_examples

    texts = []
    for ex in demo_examples("train", 600):
        texts.extend(m["content"] for m in ex.prompt)
        texts.append(ex.reference)
    texts.append("<think> reasoning </think> <answer> 42 </answer> The answer is 0123456789.")
    return texts


def synthetic_tokenizer(vocab_size: int, bpe_size: int = 2048):
    """A fast byte-level BPE tokenizer of exactly `vocab_size` ids: `bpe_size` trained on the demo
    questions (deterministic), the rest tokens that no merge produces (never encoded, but decoded),
    so any id a random model samples has text. ChatML special tokens and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    trainer = trainers.BpeTrainer(vocab_size=min(bpe_size, vocab_size), special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    n = len(alphabet)
    i = 0
    while len(vocab) < vocab_size:
        word = alphabet[i % n] + alphabet[(i // n) % n] + alphabet[(i // n // n) % n] + "\u0120"
        i += 1
        if word not in vocab:
            vocab[word] = len(vocab)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(data)),
                                        eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    assert len(tokenizer) == vocab_size, (len(tokenizer), vocab_size)
    return tokenizer


def random_model_dir(path: Path, shape: str, device: str, seed: int = 0) -> Path:
    """A HF model directory (config.json, random fp32 weights, the tokenizer) of `shape`, built on
    `device` (a GPU initialises 1.5B parameters in a second)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tokenizer = synthetic_tokenizer(SHAPES[shape]["vocab_size"])
    config = Qwen2Config(**SHAPES[shape], eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=None)
    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return path


# -- the configuration -------------------------------------------------------------------------
def paper_overrides(model_dir, out, name: str, *, device: str, response_tokens: int, prompt_tokens: int,
                    steps: int = 3, save_every: int = 0, prompts: int = 4) -> list[str]:
    """The paper preset scaled to a few minutes (module docstring); `prompt_tokens`: the longest prompt."""
    return [f"model.path={model_dir}", f"model.device={device}", f"trainer.output_dir={out}", f"trainer.name={name}",
            f"trainer.prompts_per_step={prompts}", f"trainer.mini_batch_prompts={max(1, prompts // 2)}",
            "rollout.responses_per_prompt=8", f"rollout.max_new_tokens={response_tokens}",
            f"rollout.min_new_tokens={response_tokens}", f"data.max_prompt_tokens={prompt_tokens}",
            f"data.demo_train_size={prompts * steps}", "data.val=", f"trainer.max_steps={steps}",
            f"trainer.save_every={save_every}", "trainer.eval_every=0", "trainer.eval_before=false",
            "reward.invalid_fallback=free", "algorithm.std_filter=false", "trainer.tensorboard=false",
            "trainer.sample_every=0", "trainer.progress=false", "trainer.report=false"]


def longest_prompt(model_dir, out, device: str, response_tokens: int) -> int:
    """The longest demo training prompt of the scaled run, in the model's tokens."""
    from rlpr.config import load_config
    from rlpr.model.loading import load_tokenizer
    from rlpr.train.setup import load_data, training_prompts

    cfg = load_config("paper", paper_overrides(model_dir, out, "probe", device=device,
                                               response_tokens=response_tokens, prompt_tokens=4096))
    train, _, _, _ = training_prompts(cfg, load_tokenizer(model_dir), load_data(cfg))
    return max(len(p.token_ids) for p in train)


def planned(cfg, gpu_gb: float | None) -> dict:
    """`rlpr plan`'s phase totals for `cfg` on one process (the command's own code path)."""
    from rlpr.cli.plan import checked_setup
    from rlpr.model.architecture import architecture
    from rlpr.parallel import memory_plan as mp

    setup = checked_setup(cfg, 1, gpu_gb)
    arch = architecture(cfg.model)
    p = mp.plan(arch, setup)
    runtime = sum(t.bytes for t in p.terms if "runtime" in t.name)
    return {"params": arch.params, "peak_gib": p.peak / GiB, "peak_phase": p.peak_phase, "verdict": p.verdict(),
            "phases_gib": {ph: p.total(ph) / GiB for ph in mp.PHASES}, "runtime_term_gib": runtime / GiB,
            "terms": [{"name": t.name, "gib": t.bytes / GiB, "phases": list(t.phases)} for t in p.terms]}


# -- the instrumented run ----------------------------------------------------------------------
class PhaseMeter:
    """Per phase of each step: seconds, and on CUDA the peak allocated and reserved bytes (the
    allocator's peak is reset before each call of the phase, so it is that phase's own peak,
    including everything held across it)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.records: list[dict] = []
        self.step = 0
        self.update_tokens = 0

    def wrap(self, phase: str, fn):
        import torch

        @functools.wraps(fn)
        def inner(*args, **kwargs):
            if self.cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            tick = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.cuda:
                torch.cuda.synchronize()
            rec = {"step": self.step, "phase": phase, "seconds": time.perf_counter() - tick}
            if self.cuda:
                rec.update(allocated=torch.cuda.max_memory_allocated(), reserved=torch.cuda.max_memory_reserved())
            if phase == "update":
                rec["tokens"] = sum(len(s.input_ids) for s in args[1])
            self.records.append(rec)
            return out
        return inner

    def summary(self, steps: int) -> dict:
        """Per phase: the peaks over steps 2.. (AdamW's states exist from the first step on), seconds summed."""
        out = {}
        for ph in PHASES:
            recs = [r for r in self.records if r["phase"] == ph]
            late = [r for r in recs if r["step"] >= 2] or recs
            by_step = {s: [r for r in recs if r["step"] == s] for s in sorted({r["step"] for r in recs})}
            entry = {"calls": len(recs), "seconds": sum(r["seconds"] for r in recs),
                     "seconds_per_step": {str(s): sum(r["seconds"] for r in rs) for s, rs in by_step.items()}}
            if self.cuda and late:
                entry["allocated_gib"] = max(r["allocated"] for r in late) / GiB
                entry["reserved_gib"] = max(r["reserved"] for r in late) / GiB
                entry["allocated_gib_per_step"] = {str(s): max(r["allocated"] for r in rs) / GiB
                                                   for s, rs in by_step.items()}
            out[ph] = entry
        return out


@contextlib.contextmanager
def instrumented(meter: PhaseMeter, save: bool = True):
    """Wrap the trainer's phases (rlpr/train/trainer.py) without changing them: the engine's sync and
    generate, the reward (score), the old log-probs, the micro-batch backward and the optimizer step."""
    from rlpr.train import trainer as tr

    orig = {"_setup": tr.Trainer._setup, "train_step": tr.Trainer.train_step, "score": tr.Trainer.score,
            "save": tr.Trainer.save, "fill": tr.fill_step_logprobs, "acc": tr.accumulate_gradients}

    def _setup(self):
        orig["_setup"](self)
        self.engine.sync = meter.wrap("sync", self.engine.sync)
        self.engine.generate = meter.wrap("rollout", self.engine.generate)
        self.strategy.step = meter.wrap("step", self.strategy.step)

    def train_step(self, step):
        meter.step = step
        return orig["train_step"](self, step)

    tr.Trainer._setup = _setup
    tr.Trainer.train_step = train_step
    tr.Trainer.score = meter.wrap("scoring", orig["score"])
    tr.fill_step_logprobs = meter.wrap("scoring", orig["fill"])
    tr.accumulate_gradients = meter.wrap("update", orig["acc"])
    if not save:
        tr.Trainer.save = lambda self: None  # a 1.5B model's checkpoint is 18 GB of writes: not what is timed
    try:
        yield meter
    finally:
        tr.Trainer._setup, tr.Trainer.train_step, tr.Trainer.score = orig["_setup"], orig["train_step"], orig["score"]
        tr.Trainer.save, tr.fill_step_logprobs, tr.accumulate_gradients = orig["save"], orig["fill"], orig["acc"]


def free_device_memory() -> int:
    """Collect what earlier parts left (a trainer in a reference cycle holds its GPU tensors until the
    collector runs) and return the bytes still allocated, with the allocator's peak reset."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def cuda_context_gib() -> float | None:
    """What the process holds on the GPU outside torch's allocator (the CUDA context, cuBLAS' own
    handles): device memory in use minus the allocator's reserved bytes (no other process runs)."""
    import torch

    if not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info()
    return (total - free - torch.cuda.memory_reserved()) / GiB


def train_shape(shape: str, work: Path, device: str, response_tokens: int, steps: int, gpu_gb: float | None) -> dict:
    import torch

    from rlpr.config import load_config
    from rlpr.train.tracking import read_metrics
    from rlpr.train.trainer import train

    cuda = device.startswith("cuda")
    tick = time.perf_counter()
    model_dir = random_model_dir(work / f"model-{shape}", shape, device)
    built_s = time.perf_counter() - tick
    prompt_tokens = longest_prompt(model_dir, work, device, response_tokens)
    cfg = load_config("paper", paper_overrides(model_dir, work, shape, device=device, response_tokens=response_tokens,
                                               prompt_tokens=prompt_tokens, steps=steps))
    plan = planned(cfg, gpu_gb)
    meter = PhaseMeter(cuda)
    baseline = free_device_memory() if cuda else 0.0  # what an earlier part still holds (should be 0)
    tick = time.perf_counter()
    with instrumented(meter, save=False):
        train(cfg)
    wall = time.perf_counter() - tick
    metrics = [m for m in read_metrics(work / shape) if "perf/step_s" in m]
    phases = meter.summary(steps)
    update_tokens = sum(r["tokens"] for r in meter.records if r["phase"] == "update")
    update_s = phases["update"]["seconds"] + phases["step"]["seconds"]
    result = {"shape": SHAPES[shape], "params": plan["params"], "model_built_s": built_s, "train_wall_s": wall,
              "allocated_before_gib": baseline / GiB,
              "prompt_tokens": prompt_tokens, "response_tokens": response_tokens,
              "overrides": paper_overrides("MODEL", "OUT", shape, device=device, response_tokens=response_tokens,
                                           prompt_tokens=prompt_tokens, steps=steps),
              "steps": len(metrics), "step_s": [m["perf/step_s"] for m in metrics],
              "rollout_tok_s": [m["perf/rollout_tok_s"] for m in metrics],
              "update_tok_s": update_tokens / update_s if update_s else None, "update_tokens": update_tokens,
              "micro_batches": [m.get("perf/micro_batches") for m in metrics],
              "response_len": [m.get("rollout/response_len_mean") for m in metrics],
              "grad_norm": [m.get("policy/grad_norm") for m in metrics],
              "phases": phases, "plan": plan}
    if cuda:
        context = cuda_context_gib()
        result["cuda_context_gib"] = context
        ratio, reserved_ratio = {}, {}
        for ph in PHASES:
            if "allocated_gib" not in phases[ph]:
                continue
            model = plan["phases_gib"][ph] - plan["runtime_term_gib"]  # what the allocator should see
            ratio[ph] = (phases[ph]["allocated_gib"] - baseline / GiB) / model if model > 0 else None
            reserved_ratio[ph] = ((phases[ph]["reserved_gib"] + (context or 0)) / plan["phases_gib"][ph]
                                  if plan["phases_gib"][ph] > 0 else None)
        result["measured_over_plan"] = ratio  # allocated peak / the plan's phase total without its runtime estimate
        result["reserved_with_context_over_plan"] = reserved_ratio  # reserved + context / the plan's phase total
        result["plan_holds"] = all(r is not None and abs(r - 1) <= PLAN_TOLERANCE for r in ratio.values())
        result["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / GiB
    shutil.rmtree(model_dir, ignore_errors=True)
    if cuda:
        free_device_memory()
    return result


# -- score B on the device against the CPU in fp32 ----------------------------------------------
def score_b_comparison(shape: str, work: Path, device: str, response_tokens: int) -> dict:
    import copy

    import torch

    from rlpr.config import load_config
    from rlpr.data.demo_tasks import demo_examples
    from rlpr.model.loading import load_model
    from rlpr.model.precision import fast_bf16, update_autocast
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.setup import scoring_budget

    model_dir = work / f"model-{shape}"
    if not (model_dir / "config.json").exists():
        random_model_dir(model_dir, shape, "cuda" if device.startswith("cuda") else "cpu")
    cfg = load_config("paper", paper_overrides(model_dir, work, "score-b", device=device,
                                               response_tokens=response_tokens, prompt_tokens=512))
    cpu_model, tokenizer = load_model(model_dir)
    reward = ProbabilityReward(scoring_budget(cfg), tokenizer, cfg.rollout.temperature,
                               cpu_model.config.max_position_embeddings)
    examples = demo_examples("train", 4)
    body = " ".join(ex.prompt[-1]["content"] for ex in demo_examples("train", 12))[:1200]
    prompts = [tokenizer.apply_chat_template(ex.prompt, tokenize=False, add_generation_prompt=True) for ex in examples]
    responses = [f"<think>{body[k * 50:]}</think> <answer>{ex.reference}</answer>" for k, ex in enumerate(examples)]
    items = [reward.score_b_text(p, r, ex.reference) for p, r, ex in zip(prompts, responses, examples)]
    torch.manual_seed(0)
    tick = time.perf_counter()
    with torch.no_grad():
        ref = reward.reference_logprobs(cpu_model, items)
    cpu_s = time.perf_counter() - tick
    dev_model = copy.deepcopy(cpu_model).to(device)
    runs = {"fp32": contextlib.nullcontext}
    if fast_bf16(torch.device(device)):
        runs["bf16_autocast"] = lambda: update_autocast("bf16", torch.device(device))
    result = {"shape": shape, "texts": len(items), "scored_tokens": [len(lp) for lp in ref if lp is not None],
              "cpu_fp32_s": cpu_s, "device": device}
    from rlpr.reward.scoring import aggregate

    for name, ctx in runs.items():
        with torch.no_grad(), ctx():
            got = reward.reference_logprobs(dev_model, items)
        token_diff = max(float((torch.as_tensor(g, dtype=torch.float64).cpu()
                                - torch.as_tensor(r, dtype=torch.float64)).abs().max())
                         for g, r in zip(got, ref) if r is not None)
        score_diff = max(abs(aggregate(g, cfg.reward.aggregation) - aggregate(r, cfg.reward.aggregation))
                         for g, r in zip(got, ref) if r is not None)
        result[name] = {"max_abs_logprob_diff": token_diff, "max_abs_score_b_diff": score_diff}
    result["score_b_cpu"] = [aggregate(r, cfg.reward.aggregation) for r in ref if r is not None]
    del dev_model
    return result


# -- resume on the device ------------------------------------------------------------------------
def resume_check(shape: str, work: Path, device: str, response_tokens: int) -> dict:
    import torch
    from safetensors.torch import load_file

    from rlpr.config import load_config
    from rlpr.train.checkpoint import latest_checkpoint, list_checkpoints
    from rlpr.train.tracking import read_metrics
    from rlpr.train.trainer import train

    model_dir = random_model_dir(work / f"model-{shape}-resume", shape, device)
    prompt_tokens = longest_prompt(model_dir, work, device, response_tokens)
    args = paper_overrides(model_dir, work, "resume", device=device, response_tokens=response_tokens,
                           prompt_tokens=prompt_tokens, steps=3, save_every=2)
    args += ["trainer.lr=1e-4"]  # a visible step 3 (the preset's 1e-6 moves random weights by ~1e-6)
    tick = time.perf_counter()
    train(load_config("paper", args))
    run = work / "resume"
    at_2, at_3 = list_checkpoints(run)
    resumed = work / "resumed"
    shutil.copytree(run, resumed)
    shutil.rmtree(resumed / "checkpoints" / at_3.name)
    train(load_config("paper", args), resume=str(resumed))  # the same overrides, as --resume takes them
    wall = time.perf_counter() - tick

    def weights(ckpt):
        return load_file(str(ckpt / "model" / "model.safetensors"))

    w2, w3, r3 = weights(at_2), weights(at_3), weights(latest_checkpoint(resumed))
    diff = max(float((r3[k].double() - w3[k].double()).abs().max()) for k in w3)
    change = max(float((w3[k].double() - w2[k].double()).abs().max()) for k in w3)
    m3 = [m for m in read_metrics(run) if m.get("step") == 3 and "perf/step_s" in m]
    r3m = [m for m in read_metrics(resumed) if m.get("step") == 3 and "perf/step_s" in m]
    metric_diff = None
    if m3 and r3m:
        keys = [k for k in m3[-1] if not k.startswith("perf/") and isinstance(m3[-1][k], (int, float))
                and isinstance(r3m[-1].get(k), (int, float))]
        metric_diff = {k: abs(m3[-1][k] - r3m[-1][k]) for k in keys if m3[-1][k] != r3m[-1][k]}
    bitwise = diff == 0.0
    relative = diff / change if change else float("inf")
    shutil.rmtree(model_dir, ignore_errors=True)
    return {"shape": shape, "response_tokens": response_tokens, "wall_s": wall, "bitwise": bitwise,
            "max_abs_weight_diff": diff, "step3_max_abs_change": change, "relative_to_step3_change": relative,
            "tolerance": RESUME_TOLERANCE, "passed": bitwise or relative <= RESUME_TOLERANCE,
            "step3_metrics_that_differ": metric_diff}


# -- the CUDA tests, the environment ---------------------------------------------------------------
def cuda_tests(out: Path, timeout: float) -> dict:
    import xml.etree.ElementTree as ET

    junit = out / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_cuda.py"), "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-rs"]
    tick = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "seconds": time.perf_counter() - tick}
    result = {"returncode": proc.returncode, "seconds": time.perf_counter() - tick,
              "output_tail": (proc.stdout + proc.stderr)[-3000:]}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        result.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        result["failed"] = [f"{case.get('name')}: {(case.find('failure') if case.find('failure') is not None else case.find('error')).get('message', '')[:300]}"
                            for case in suite.iter("testcase")
                            if case.find("failure") is not None or case.find("error") is not None]
    return result


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": transformers.__version__, "device": device, "hostname": platform.node(),
           "cpu_count": os.cpu_count(), "rlpr_source": rlpr_source()}
    for name in ("peft", "accelerate", "safetensors", "tokenizers", "gguf", "math_verify"):
        try:
            env[name] = __import__(name).__version__
        except Exception as e:  # noqa: BLE001 - a missing or broken package is a finding, not a crash
            env[name] = f"unavailable ({type(e).__name__})"
    env["requirements"] = requirements_met()
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=props.total_memory / GiB,
                   multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   bf16_supported=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version())
    return env


def requirements_met() -> dict:
    """rlpr's own requirements (its installed metadata) against what is installed: {name: [spec, version, ok]}."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    out = {}
    for line in requires("rlpr") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        out[req.name] = [str(req.specifier), have, have is not None and req.specifier.contains(have, prereleases=True)]
    return out


def rlpr_source() -> dict:
    """Where rlpr was imported from, and whether its .py files are this tree's (a wheel built from an
    older commit would check old code)."""
    import rlpr

    installed = Path(rlpr.__file__).parent
    tree = ROOT / "src" / "rlpr"

    def digest(folder: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(folder.rglob("*.py")):
            h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()[:16]

    same = installed.resolve() == tree.resolve() or (tree.is_dir() and digest(installed) == digest(tree))
    return {"path": str(installed), "matches_tree": same}


# -- the report ---------------------------------------------------------------------------------------
def fmt(v, spec=".2f") -> str:
    return "-" if v is None else format(v, spec)


def write_report(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    env = report.get("environment", {})
    lines = ["# rlpr GPU check", "",
             f"{report['started']}; device **{env.get('gpu', env.get('device'))}**; torch {env.get('torch')} "
             f"(CUDA {env.get('cuda')}), transformers {env.get('transformers')}, Python {env.get('python')}; "
             f"wall {fmt(report.get('wall_s'), '.0f')} s of a {report['budget_s']:.0f} s budget.", "",
             f"Command: `{report['command']}`", ""]
    lines += report.get("notes", [])  # what a person wrote of the run (kept when the report is rewritten)
    unmet = {k: v for k, v in env.get("requirements", {}).items() if not v[2]}
    if unmet:
        lines += [f"rlpr's requirements not met here: {unmet}", ""]
    if not env.get("rlpr_source", {}).get("matches_tree", True):
        lines += ["**rlpr was imported from files that differ from this tree** "
                  f"({env['rlpr_source']['path']}): rebuild the wheel.", ""]
    t = report.get("cuda_tests")
    if t:
        lines += ["## CUDA tests (tests/test_cuda.py)", "",
                  f"{t.get('tests', '?')} tests: {t.get('failures', '?')} failed, {t.get('errors', '?')} errors, "
                  f"{t.get('skipped', '?')} skipped ({fmt(t.get('seconds'), '.0f')} s)" + (f"; {t['error']}" if "error" in t else ""), ""]
        lines += [f"- FAILED {f}" for f in t.get("failed", [])] + ([""] if t.get("failed") else [])
    for name, r in report.get("models", {}).items():
        lines += [f"## {name}: `--preset paper`, one device", ""]
        if "error" in r or "skipped" in r:
            lines += [f"{r.get('skipped') or r.get('error')}", ""]
            continue
        lines += [f"{r['params']:,} parameters; {r['steps']} steps of 4 prompts x 8 responses, "
                  f"{r['prompt_tokens']}-token prompts (longest), responses forced to {r['response_tokens']} tokens; "
                  f"model built in {r['model_built_s']:.0f} s, training {r['train_wall_s']:.0f} s.", "",
                  f"- step time (s): {', '.join(fmt(v, '.1f') for v in r['step_s'])}",
                  f"- rollout tokens/s: {', '.join(fmt(v, '.0f') for v in r['rollout_tok_s'])}",
                  f"- update tokens/s (forward + backward + step, prompt and response tokens): "
                  f"{fmt(r['update_tok_s'], '.0f')}"]
        per_step = {ph: r["phases"][ph].get("seconds_per_step") for ph in PHASES}
        if all(per_step.values()):  # (the first GPU run predates them)
            lines.append("- seconds per step, by phase: " + "; ".join(
                f"{ph} {', '.join(fmt(v, '.1f') for v in per_step[ph].values())}" for ph in PHASES))
        lines.append("")
        plan = r["plan"]
        lines += ["| phase | seconds | allocated GiB | reserved GiB | plan GiB (runtime term) | allocated / (plan - runtime) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for ph in PHASES:
            p = r["phases"][ph]
            lines.append(f"| {ph} | {p['seconds']:.1f} | {fmt(p.get('allocated_gib'))} | {fmt(p.get('reserved_gib'))} | "
                         f"{plan['phases_gib'][ph]:.2f} ({plan['runtime_term_gib']:.2f}) | "
                         f"{fmt((r.get('measured_over_plan') or {}).get(ph), '.3f')} |")
        lines += ["", f"Plan peak {plan['peak_gib']:.2f} GiB in the {plan['peak_phase']} phase; "
                  f"CUDA context outside the allocator {fmt(r.get('cuda_context_gib'))} GiB; "
                  f"plan within {PLAN_TOLERANCE:.0%} in every phase: **{r.get('plan_holds')}**.", ""]
    s = report.get("score_b")
    if s:
        lines += ["## Score B on the device against the CPU in fp32", ""]
        if "error" in s or "skipped" in s:
            lines += [s.get("skipped") or s.get("error"), ""]
        else:
            lines += [f"{s['shape']}, {s['texts']} texts ({', '.join(map(str, s['scored_tokens']))} reference tokens):"]
            for name in ("fp32", "bf16_autocast"):
                if name in s:
                    lines.append(f"- {name}: max |log-prob diff| {s[name]['max_abs_logprob_diff']:.3g}, "
                                 f"max |score B diff| {s[name]['max_abs_score_b_diff']:.3g}")
            lines.append("")
    r = report.get("resume")
    if r:
        lines += ["## Resume on the device", ""]
        if "error" in r or "skipped" in r:
            lines += [r.get("skipped") or r.get("error"), ""]
        else:
            lines += [f"{r['shape']}: 3 steps, resumed from step 2: step 3's weights "
                      f"{'bitwise equal' if r['bitwise'] else 'differ'} (max |diff| {r['max_abs_weight_diff']:.3g}, "
                      f"{r['relative_to_step3_change']:.3g} of step 3's own change {r['step3_max_abs_change']:.3g}; "
                      f"tolerance {r['tolerance']:g}): **{'passed' if r['passed'] else 'FAILED'}**; "
                      f"step-3 metrics that differ: {r['step3_metrics_that_differ'] or 'none'}.", ""]
    if report.get("decode"):
        from gpu_decode import report_lines as decode_lines

        lines += decode_lines(report["decode"])
    if report.get("learning_cuda"):
        from gpu_learning import report_lines as learning_lines

        lines += learning_lines(report["learning_cuda"])
    if report.get("errors"):
        lines += ["## Errors", ""] + [f"- {e}" for e in report["errors"]] + [""]
    (out / "gpu_check.md").write_text("\n".join(lines))


class PartDeadline(Exception):
    """A part ran past the budget + HARD_EXTRA_S (raised by SIGALRM in the main thread)."""


def _deadline(signum, frame):
    raise PartDeadline(f"stopped: it ran past the budget + {HARD_EXTRA_S} s")


PARTS_ORDER = ("cuda_tests", "resume", "score_b", "decode", "learning_cuda", "models")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json / gpu_check.md")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--parts", nargs="*", default=None, choices=PARTS_ORDER,
                    help="the parts to run, in this order: " + ", ".join(PARTS_ORDER) + " (default: all but "
                         "learning_cuda, which needs the embedded model: benchmarks/gpu_transfer.py)")
    ap.add_argument("--merge", default=None,
                    help="an earlier gpu_check.json: its sections are kept and the parts run now replace theirs "
                         "(a second call or loan resumes where the first stopped)")
    ap.add_argument("--models", nargs="*", default=None,
                    help="shapes to train (default: qwen2.5-0.5b qwen2.5-1.5b on cuda, tiny on cpu)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--response-tokens", type=int, default=None, help="forced response length (cuda 1024, cpu 16)")
    ap.add_argument("--decode-rows", type=int, nargs="*", default=None, help="decode: rows (default 32 128 256)")
    ap.add_argument("--decode-tokens", type=int, default=None, help="decode: new tokens (cuda 1024, cpu 24)")
    ap.add_argument("--learning-steps", type=int, default=20)
    ap.add_argument("--learning-heldout", type=int, default=0,
                    help="learning_cuda: held-out and transfer questions (0: the benchmark's own; the dry run's few)")
    ap.add_argument("--learning-set", nargs="*", default=[], help="learning_cuda: more config overrides (the dry run's model)")
    ap.add_argument("--learning-resume", default=None,
                    help="learning_cuda: an earlier call's learning_cuda.tar.gz; its finished runs are kept")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting parts after this (default 450)")
    ap.add_argument("--gpu-gb", type=float, default=None, help="plan for this GPU size (default: the device's)")
    ap.add_argument("--no-tests", action="store_true", help="skip tests/test_cuda.py")
    ap.add_argument("--skip", nargs="*", default=[], choices=PARTS_ORDER)
    args = ap.parse_args(argv)
    start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else f"main({argv})"
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = {"started": started, "budget_s": args.budget_s, "command": command, "errors": [], "models": {}}
    if args.merge:
        report = json.loads(Path(args.merge).read_text())
        report.setdefault("calls", [{"started": report["started"], "command": report["command"]}])
        report["calls"].append({"started": started, "command": command})
        report.update(budget_s=args.budget_s, command=command)
        report.setdefault("errors", [])
    parts = [p for p in (args.parts if args.parts is not None else [p for p in PARTS_ORDER if p != "learning_cuda"])
             if p not in args.skip and not (p == "cuda_tests" and args.no_tests)]
    parts = [p for p in PARTS_ORDER if p in parts]
    # a part run now replaces the merged report's errors of that part
    report["errors"] = [e for e in report["errors"] if e.split(":", 1)[0].split("/", 1)[0] not in parts]

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    def part(key, fn, need_s, *a):
        """Run one part if `need_s` seconds are left; its error is recorded, not raised."""
        if left() < need_s:
            return {"skipped": f"not started: {left():.0f} s of the budget left, {need_s:.0f} s needed"}
        tick = time.perf_counter()
        # a part still running HARD_EXTRA_S after the budget is stopped, so that the report is written
        # before the caller's own time limit (600 s with a 450 s budget)
        signal.signal(signal.SIGALRM, _deadline)
        signal.alarm(max(1, int(left() + HARD_EXTRA_S)))
        try:
            value = fn(*a)
        except Exception as e:  # noqa: BLE001 - the check reports every failure and goes on
            report["errors"].append(f"{key}: {type(e).__name__}: {e}")
            traceback.print_exc()
            value = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        finally:
            signal.alarm(0)
        value["part_s"] = time.perf_counter() - tick
        return value

    import torch

    if cuda and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device (use --device cpu for the dry run)",
              file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    report["environment"] = environment(device)
    report["import_s"] = time.perf_counter() - start
    gpu_gb = args.gpu_gb if args.gpu_gb is not None else (report["environment"]["gpu_memory_gib"] if cuda else None)
    response = args.response_tokens or (1024 if cuda else 16)
    models = args.models if args.models is not None else (["qwen2.5-0.5b", "qwen2.5-1.5b"] if cuda else ["tiny"])
    write_report(out, report)
    work = Path(tempfile.mkdtemp(prefix="rlpr-gpu-check-"))
    try:
        # the short parts first: a model part running long must not starve them (the first GPU run
        # spent its whole budget on the two shapes)
        for name in parts:
            if name == "cuda_tests":
                report["cuda_tests"] = part("cuda_tests", cuda_tests, 20, out, max(30.0, min(150.0, left() - 60)))
            elif name == "resume":
                small = "qwen-small" if cuda else "tiny"
                report["resume"] = part("resume", resume_check, 30 if cuda else 5, small, work / "resume", device,
                                        128 if cuda else response)
            elif name == "score_b":
                report["score_b"] = part("score_b", score_b_comparison, 25 if cuda else 5,
                                         models[0] if models else "tiny", work / "score-b", device, response)
            elif name == "decode":
                from gpu_decode import decode_part

                report["decode"] = part("decode", decode_part, 60 if cuda else 5, device, None,
                                        tuple(args.decode_rows or (32, 128, 256) if cuda else args.decode_rows or (8,)),
                                        args.decode_tokens)
            elif name == "learning_cuda":
                from gpu_learning import learning_part

                report["learning_cuda"] = part("learning_cuda", learning_part, 120 if cuda else 5, out, device,
                                               args.learning_steps, 0, args.learning_heldout or None,
                                               max(60.0, left() + HARD_EXTRA_S / 2), args.learning_set,
                                               args.learning_resume)
            elif name == "models":
                # seconds each part needs on one H100 (1024 tokens, 3 steps): measured 192 and 243 s
                # (benchmarks/results/gpu_check.md), of which ~55 s each was cuDNN attention planning the
                # first rollout, now left out; a part that starts runs to the budget + HARD_EXTRA_S at most
                need = {"qwen2.5-0.5b": 150, "qwen2.5-1.5b": 180}
                for shape in models:
                    report["models"][shape] = part(f"models/{shape}", train_shape, need.get(shape, 10), shape,
                                                   work / shape, device, response, args.steps, gpu_gb)
                    write_report(out, report)
            write_report(out, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        report["wall_s"] = time.perf_counter() - start
        write_report(out, report)
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} ({report['wall_s']:.0f} s; "
          f"{len(report['errors'])} errors)")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
