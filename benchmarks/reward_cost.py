"""What each reward kind costs per training step, side by side on the same responses (issue 33).

Samples one training step's responses with the `small` preset (4 prompts x 8 responses; the embedded
model, or Gemma 3 270M with --model gemma) and times each reward kind scoring them, alternating the
kinds over `--repeats` rounds (this machine is noisy): RLPR (score B and a fresh score A, as on a
prompt's first visit; and B alone, A cached), the label-free kinds and the controls, and OPSD's
passes (issue 41): the teacher pass for the sampled-token signal, with the full-vocabulary rows of
the JSD loss and with the top-50 rows, the student's old log-probs (a pass OPSD adds when a step has a
single update) and the identity check (score B and A with the teacher, no cache). Reports the median
seconds and the ratio to RLPR's.

    python benchmarks/reward_cost.py [--model smollm2|gemma] [--repeats 5]

Writes benchmarks/results/reward_cost[_gemma].json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
KINDS = {  # name -> reward overrides
    "rlpr (B + fresh A)": [],
    "rlpr (B, A cached)": [],
    "shuffled_reference (B + fresh A)": [],  # the same computation as rlpr against other references
    "random": ["reward.kind=random"],
    "entropy": ["reward.kind=entropy"],
    "self_certainty": ["reward.kind=self_certainty"],
    "majority": ["reward.kind=majority"],
    "rlvr (oracle verifier)": ["reward.kind=verifier"],
}


OPSD = {  # name -> opsd overrides (reward.kind=opsd, the teacher as the policy is: no LoRA base here)
    "opsd teacher pass (sampled_token)": ["opsd.loss=sampled_token"],
    "opsd teacher pass + full-vocabulary rows (jsd)": ["opsd.loss=jsd", "opsd.top_k=0"],
    "opsd teacher pass + top-50 rows (jsd, top_k=50)": ["opsd.loss=jsd", "opsd.top_k=50"],
}


def opsd_seconds(model_overrides: list[str], model, tokenizer, prompts, rollouts, repeats: int
                 ) -> dict[str, list[float]]:
    """OPSD's passes over the same responses (rlpr/train/opsd.py), alternating over `repeats` rounds."""
    from rlpr.config import load_config
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.opsd import Distiller
    from rlpr.train.update import Sample, fill_logprobs

    def samples():
        out = []
        for r in rollouts:
            p = prompts[r.prompt_index]
            out.append(Sample(p.token_ids + r.token_ids, len(p.token_ids), 0.0, prompt_index=p.index,
                              response=p.response_text(r.text)))
        return out

    def distiller(extra):
        cfg = load_config("small", [*model_overrides, "reward.kind=opsd", "opsd.teacher=current",
                                    "model.lora=false", "opsd.identity_every=0", *extra])
        reward = ProbabilityReward(cfg.reward, tokenizer, 1.0, getattr(model.config, "max_position_embeddings", None))
        return Distiller(cfg, model, tokenizer, reward, prompts, [p.example for p in prompts])

    distillers = {name: distiller(extra) for name, extra in OPSD.items()}
    t = distillers["opsd teacher pass (sampled_token)"].cfg.trainer
    seconds: dict[str, list[float]] = {name: [] for name in [*OPSD, "opsd student old log-probs", "opsd identity"]}
    for _ in range(repeats):
        batch = samples()
        start = time.perf_counter()
        fill_logprobs(model, batch, "old_logp", t.micro_batch_sequences, tokenizer.pad_token_id, 1.0)
        seconds["opsd student old log-probs"].append(time.perf_counter() - start)
        for name, d in distillers.items():
            for s in batch:
                s.token_advantages = s.distill = None
            start = time.perf_counter()
            d.prepare(batch, 1)
            seconds[name].append(time.perf_counter() - start)
        d = distillers["opsd teacher pass (sampled_token)"]
        probes = [Sample(d.teacher_prompt_ids(s.prompt_index) + s.input_ids[s.prompt_len:],
                         len(d.teacher_prompt_ids(s.prompt_index)), 0.0) for s in batch]
        teacher = [u for u, *_ in d._passes(model, probes, rows=False)]
        start = time.perf_counter()
        d.identity(batch, teacher, 1)
        seconds["opsd identity"].append(time.perf_counter() - start)
    return seconds


def main() -> int:
    sys.path.insert(0, str(ROOT))
    from learning import MODELS

    from rlpr.config import load_config
    from rlpr.data.prompts import prepare_prompts
    from rlpr.grading import grade_example
    from rlpr.model.forward import causal_lm
    from rlpr.model.loading import load_model
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.rollout.engines import build_engine
    from rlpr.train.setup import load_examples_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=list(MODELS), default="smollm2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = load_config("small", MODELS[args.model])
    model, tokenizer = load_model(base.model.path)
    examples = load_examples_for(base, "train")[:4]
    prompts, _ = prepare_prompts(examples, tokenizer, base.data.max_prompt_tokens, base.data.prefill)
    engine = build_engine(model, tokenizer, base.rollout, torch.float32)
    n = base.rollout.responses_per_prompt
    rollouts = engine.generate([p.token_ids for p in prompts], n, max_new_tokens=base.rollout.max_new_tokens,
                               temperature=1.0, seeds=[11, 12, 13, 14])
    by = [prompts[r.prompt_index] for r in rollouts]
    texts, responses = [p.text for p in by], [p.response_text(r.text) for p, r in zip(by, rollouts)]
    references = [p.example.reference for p in by]
    shuffled = references[n:] + references[:n]  # every prompt against another prompt's reference
    correct = [grade_example(p.example, t).correct for p, t in zip(by, responses)]
    groups = [r.prompt_index for r in rollouts]
    max_length = getattr(causal_lm(model).config, "max_position_embeddings", None)
    rewards = {name: ProbabilityReward(load_config("small", MODELS[args.model] + extra).reward, tokenizer, 1.0,
                                       max_length) for name, extra in KINDS.items()}
    seconds: dict[str, list[float]] = {name: [] for name in KINDS}
    for _ in range(args.repeats):
        for name, reward in rewards.items():
            if "fresh A" in name:
                reward.score_a.reset()
            refs = shuffled if name.startswith("shuffled") else references
            start = time.perf_counter()
            with torch.no_grad():
                reward(model, texts, responses, refs, correct=correct, groups=groups)
            seconds[name].append(time.perf_counter() - start)
    seconds.update(opsd_seconds(MODELS[args.model], model, tokenizer, prompts, rollouts, args.repeats))
    rlpr = statistics.median(seconds["rlpr (B + fresh A)"])
    table = {name: {"median_s": statistics.median(v), "ratio_to_rlpr": statistics.median(v) / rlpr, "runs_s": v}
             for name, v in seconds.items()}
    out = args.output or str(RESULTS / ("reward_cost" if args.model == "smollm2" else f"reward_cost_{args.model}"))
    lines = [f"Reward cost per step, {args.model}: {len(responses)} responses (4 prompts x {n}, `small` preset), "
             f"median of {args.repeats} rounds, kinds alternating, {args.threads} thread(s).", "",
             "| reward | median s | / RLPR (B + fresh A) |", "|---|---|---|"]
    lines += [f"| {k} | {v['median_s']:.3f} | {v['ratio_to_rlpr']:.2f} |" for k, v in table.items()]
    Path(out + ".md").write_text("\n".join(lines) + "\n")
    Path(out + ".json").write_text(json.dumps({"model": args.model, "responses": len(responses), "kinds": table},
                                              indent=1))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
