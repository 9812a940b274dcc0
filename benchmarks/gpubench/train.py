"""gpu_check's training parts, rlpr's own trainer in-process on the device: the paper preset scaled to a
few minutes (`paper_overrides`), `rlpr plan`'s phase totals, a meter of each phase's seconds and
allocator peak (`PhaseMeter`), and the parts: `train_shape`, `score_b_comparison`, `resume_check`."""

from __future__ import annotations

import contextlib
import functools
import shutil
import time
from pathlib import Path

from gpubench.models import SHAPES, random_model_dir

PLAN_TOLERANCE = 0.25  # |measured / planned - 1| of each phase's peak
# resume: max |w3(resumed) - w3| / max |w3 - w2| (step 3's own change), where not bitwise
RESUME_TOLERANCE = 1e-2
PHASES = ("sync", "rollout", "scoring", "update", "step")
GiB = 1024 ** 3


# -- the configuration -------------------------------------------------------------------------
def paper_overrides(model_dir, out, name: str, *, device: str, response_tokens: int, prompt_tokens: int,
                    steps: int = 3, save_every: int = 0, prompts: int = 4) -> list[str]:
    """The paper preset scaled to a few minutes (docs/distributed.md); `prompt_tokens`: the longest prompt."""
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
        self.cuda, self.records, self.step = cuda, [], 0

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
    from unittest import mock

    from rlpr.train import trainer as tr

    setup, train_step = tr.Trainer._setup, tr.Trainer.train_step

    def wrapped_setup(self):
        setup(self)
        self.engine.sync = meter.wrap("sync", self.engine.sync)
        self.engine.generate = meter.wrap("rollout", self.engine.generate)
        self.strategy.step = meter.wrap("step", self.strategy.step)

    def counted_step(self, step):
        meter.step = step
        return train_step(self, step)

    patches = [(tr.Trainer, "_setup", wrapped_setup), (tr.Trainer, "train_step", counted_step),
               (tr.Trainer, "score", meter.wrap("scoring", tr.Trainer.score)),
               (tr, "fill_step_logprobs", meter.wrap("scoring", tr.fill_step_logprobs)),
               (tr, "accumulate_gradients", meter.wrap("update", tr.accumulate_gradients))]
    if not save:  # a 1.5B model's checkpoint is 18 GB of writes: not what is timed
        patches.append((tr.Trainer, "save", lambda self: None))
    with contextlib.ExitStack() as stack:  # every patch undone on the way out, as an error leaves too
        for owner, name, new in patches:
            stack.enter_context(mock.patch.object(owner, name, new))
        yield meter


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

