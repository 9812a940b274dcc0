"""Which model continues score B's kept caches (reward.score_b_on_copy): the rollout copy against the policy.

Runs `--steps` demo training steps (one rollout round each, B from the cache) and, every time the
step's responses are scored, scores B three ways on the same responses, in rotating order: recomputed
by the fp32 policy over the whole o', continued from the kept caches by the fp32 policy (`never`),
and continued by the rollout copy that computed them (`always`: its merged weights, in its dtype).
Reports seconds per step of each and |B - B recomputed| (max, mean) against B's spread within a
group. The first step is a warm-up, left out of the seconds. The copy's dtype is what
model.rollout_dtype=auto picks here: bf16 on CPUs with fast bf16, fp32 capped to AVX2
(benchmarks/demo_time.py's caps).

    python benchmarks/score_b_on_copy.py --output benchmarks/results/score_b_on_copy_amd
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        python benchmarks/score_b_on_copy.py --output benchmarks/results/score_b_on_copy_amd_avx2
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from score_b_cache import group_std
from speedbench.report import machine, save


PATHS = {"recomputed": None, "policy": "never", "copy": "always"}  # path -> reward.score_b_on_copy (None: no cache)


def measure(steps: int, workdir: Path) -> dict:
    from rlpr.config import load_config
    from rlpr.train.trainer import Trainer

    cfg = load_config("demo", ["algorithm.std_filter=false", "algorithm.max_sampling_tries=1",
                               "trainer.tensorboard=false", "trainer.progress=false", "trainer.sample_every=0",
                               f"trainer.output_dir={workdir}", f"trainer.max_steps={steps}",
                               "rollout.max_new_tokens=64", "reward.score_b_from_cache=always"])
    trainer = Trainer(cfg, workdir / "run")
    reward, score_b = trainer.reward, trainer.reward.score_b
    calls: list[dict] = []

    def three_ways(model, items, groups, too_long=None, caches=None):
        names = list(PATHS)
        k = len(calls) % len(names)
        out, seconds = {}, {}
        for name in names[k:] + names[:k]:
            if PATHS[name] is not None:
                reward.cfg.score_b_on_copy = PATHS[name]
            tick = time.perf_counter()
            out[name] = score_b(model, items, groups, too_long if name == "copy" else [],
                                caches if PATHS[name] is not None else None)
            seconds[name] = time.perf_counter() - tick
        reward.cfg.score_b_on_copy = "always"
        calls.append({"step": trainer.step + 1, "b": out, "s": seconds, "groups": list(groups)})
        return out["copy"]

    reward.score_b = three_ways
    for step in range(1, steps + 1):
        trainer.train_step(step)
        trainer.step = step
    timed = [c for c in calls if c["step"] > 1]
    row = {"rollout_dtype": str(trainer.engine.model.dtype).replace("torch.", ""), "steps": steps,
           "responses": sum(len(c["b"]["recomputed"]) for c in calls)}
    for name in PATHS:
        row[f"{name}_s_per_step"] = sum(c["s"][name] for c in timed) / max(steps - 1, 1)
    for name in ("policy", "copy"):
        diffs = [abs(x - y) for c in calls for x, y in zip(c["b"][name], c["b"]["recomputed"])]
        row[f"{name}_max_abs_db"], row[f"{name}_mean_abs_db"] = max(diffs), statistics.mean(diffs)
    row["group_std_b"] = statistics.mean(group_std(c["b"]["recomputed"], c["groups"]) for c in calls)
    return row


def report(res: dict) -> str:
    r = res["row"]
    caps = res["machine"]["isa_caps"]
    lines = [f"# Score B's kept caches continued by the rollout copy vs the policy ({res['date']})", "",
             f"Demo preset, 4 prompts x 8 responses x 64 new tokens, {r['steps']} steps (the first a warm-up for "
             f"the seconds), {r['responses']} responses; {res['machine']['cpu']}, {res['machine']['cpu_count']} CPUs"
             + (f" (capped: {', '.join(f'{k}={v}' for k, v in caps.items())})" if caps else "")
             + f"; rollout copy {r['rollout_dtype']}.", "",
             "| score B path | s per step | max abs dB | mean abs dB |", "|---|---|---|---|",
             f"| recomputed (fp32 policy, whole o') | {r['recomputed_s_per_step']:.2f} | - | - |",
             f"| cache continued by the policy (score_b_on_copy=never) | {r['policy_s_per_step']:.2f} | "
             f"{r['policy_max_abs_db']:.1e} | {r['policy_mean_abs_db']:.1e} |",
             f"| cache continued by the copy (score_b_on_copy=always) | {r['copy_s_per_step']:.2f} | "
             f"{r['copy_max_abs_db']:.1e} | {r['copy_mean_abs_db']:.1e} |", "",
             f"**copy / policy: {r['copy_s_per_step'] / r['policy_s_per_step']:.2f}** (same process, same responses, "
             "rotating order). dB against recomputed B; B's mean spread within a group "
             f"{r['group_std_b']:.3f}.", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent / "results" / "score_b_on_copy"))
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "machine": machine()}
    with tempfile.TemporaryDirectory(prefix="rlpr-sbcopy-") as tmp:
        res["row"] = measure(args.steps, Path(tmp))
    print(save(res, args.output, report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
