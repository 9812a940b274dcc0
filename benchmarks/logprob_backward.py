"""The update's output-layer backward: written out (model/forward._LogprobEntropy) against autograd
through the log-softmax and entropy ops.

In one process, the demo trainer on the embedded SmolLM2-135M-Instruct (one rollout round per
step and 64 new tokens, as benchmarks/speed.py runs it): at each of `--steps` steps after a warm-up, inside the
trainer's own update (its autocast and threads), the step's gradient accumulation runs `--reps`
times each way, alternating, on the same samples; then once more as the step trains. Reports
the medians, their ratio and how far the two ways' gradients lie apart.

    python benchmarks/logprob_backward.py --output benchmarks/results/logprob_backward_amd
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/logprob_backward.py --output benchmarks/results/logprob_backward_amd_avx2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
from speedbench.report import machine, save

WAYS = ("autograd", "written_out")


def measure(steps: int, reps: int, max_new_tokens: int, workdir: Path) -> dict:
    import rlpr.model.forward as forward
    import rlpr.train.trainer as trainer_module
    from rlpr.config import load_config
    from rlpr.train.trainer import Trainer

    cfg = load_config("demo", [f"trainer.output_dir={workdir}", "trainer.tensorboard=false", "trainer.progress=false",
                               "trainer.sample_every=0", "algorithm.std_filter=false", "algorithm.max_sampling_tries=1",
                               f"trainer.max_steps={steps + 1}", f"rollout.max_new_tokens={max_new_tokens}"])
    trainer = Trainer(cfg, workdir / "run")
    model = trainer.policy
    accumulate = trainer_module.accumulate_gradients
    seconds: dict = {w: [] for w in WAYS}
    gaps: list[float] = []

    def way(name: str) -> None:
        forward.FUSED_BACKWARD = name == "written_out"

    def timed_update(*args, **kwargs):
        grads = {}
        for rep in range(reps):
            for name in (WAYS if rep % 2 == 0 else WAYS[::-1]):
                way(name)
                model.zero_grad(set_to_none=True)
                tick = time.perf_counter()
                accumulate(*args, **kwargs)
                seconds[name].append(time.perf_counter() - tick)
                grads[name] = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
        gaps.append(((grads["autograd"] - grads["written_out"]).abs().max() / grads["autograd"].abs().max()).item())
        way("written_out")
        model.zero_grad(set_to_none=True)
        return accumulate(*args, **kwargs)

    trainer.train_step(1)
    trainer.step = 1
    trainer_module.accumulate_gradients = timed_update
    try:
        for step in range(2, steps + 2):
            trainer.train_step(step)
            trainer.step = step
    finally:
        trainer_module.accumulate_gradients = accumulate
        way("written_out")
    return {"steps": steps, "reps": reps, "max_new_tokens": max_new_tokens, "mixed_precision": trainer.mixed_precision,
            "median_s": {w: statistics.median(v) for w, v in seconds.items()}, "raw_s": seconds,
            "max_relative_gradient_gap": max(gaps)}


def report(res: dict) -> str:
    r, caps = res["row"], res["machine"]["isa_caps"]
    plain, ours = r["median_s"]["autograd"], r["median_s"]["written_out"]
    return "\n".join([
        f"# The update's output-layer backward: written out vs autograd ({res['date']})", "",
        f"The demo trainer on SmolLM2-135M-Instruct (4 prompts x 8 responses x {r['max_new_tokens']} new tokens, LoRA r16, "
        f"trainer.mixed_precision resolved: {r['mixed_precision']}); {res['machine']['cpu']}, "
        f"{res['machine']['cpu_count']} CPUs"
        + (f" (capped: {', '.join(f'{k}={v}' for k, v in caps.items())})" if caps else "")
        + f"; each of {r['steps']} steps' gradient accumulation run {r['reps']} times each way, alternating, "
        "in the trainer's own update; medians.", "",
        "| | autograd | written out | written out / autograd |", "|---|---|---|---|",
        f"| update (forward + backward) s | {plain:.2f} | {ours:.2f} | {ours / plain:.2f} |", "",
        f"**{plain - ours:.2f} s less per step.** Largest gradient difference between the two ways: "
        f"{r['max_relative_gradient_gap']:.1e} of the largest gradient (tests/test_logprob_backward.py: "
        "both as close to fp64; under bf16 autocast the difference is bf16 rounding of the logits' gradient).", ""])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results" / "logprob_backward"))
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine(), "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="rlpr-logprob-backward-") as tmp:
        res["row"] = measure(args.steps, args.reps, args.max_new_tokens, Path(tmp))
    print(save(res, args.output, report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
