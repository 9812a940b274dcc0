"""How close the update's gradient is to exact, in fp32 and under CPU bf16 autocast, on real demo samples.

Runs `--steps` demo training steps (the model and samples as the trainer makes them), then takes the
samples of the last step's update and computes the gradient of the policy's summed log-probability of
the sampled response tokens (the score-function part of every policy-gradient loss; no advantages, so
the number does not hinge on the batch's rewards) three ways on the same LoRA policy: fp64 (a double
copy: the reference), fp32, and fp32 weights under torch.autocast(bf16) (what `trainer.mixed_precision=
auto` picks on CPUs with AVX512-BF16 or AMX). The same three on a fixed English text (not sampled from
the model) as a control. Reports cosine and norm ratio to fp64, overall and per layer and projection.

    python benchmarks/update_precision.py [--steps 1] [--max-new-tokens 64] [--output benchmarks/results/update_precision]

Needs a CPU with fast bf16 only to be quick (autocast runs anywhere). Writes .json and .md.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import re
import sys
import tempfile
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
FIXED_TEXT = ["The capital of France is Paris, a city known for art and food. " * 3,
              "Water boils at 100 degrees Celsius at sea level, which is a useful fact. " * 3]


def demo_samples(steps: int, workdir: Path, max_new_tokens: int):
    """The trainer after `steps` demo steps and the samples its last update trained on."""
    import rlpr.train.trainer as trainer_module
    from rlpr.config import load_config

    cfg = load_config("demo", ["algorithm.std_filter=false", "algorithm.max_sampling_tries=1", "trainer.tensorboard=false",
                               "trainer.progress=false", "trainer.sample_every=0", f"trainer.output_dir={workdir}",
                               f"trainer.max_steps={steps}", "model.threads=0",
                               f"rollout.max_new_tokens={max_new_tokens}"])
    seen = {}
    accumulate = trainer_module.accumulate_gradients

    def keep(model, samples, *args, **kwargs):
        seen["samples"] = samples
        return accumulate(model, samples, *args, **kwargs)

    trainer_module.accumulate_gradients = keep
    try:
        trainer = trainer_module.Trainer(cfg, workdir / "run")
        for step in range(1, steps + 1):
            trainer.train_step(step)
            trainer.step = step
    finally:
        trainer_module.accumulate_gradients = accumulate
    return trainer, seen["samples"]


def padded(samples):
    """(ids, attention mask, target mask) [B, T] of update samples, right-padded; the response tokens are the targets."""
    from rlpr.reward.sequence import pad_batch

    return pad_batch([s.input_ids for s in samples],
                     [[False] * s.prompt_len + [True] * s.response_len for s in samples], 0)


def flat(grads: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.flatten() for t in grads.values()])


def gradients(model, ids, att, tgt, mode: str) -> dict[str, torch.Tensor]:
    """d(sum of target tokens' log-probs)/d(trainable parameters), by name (float64 copies)."""
    model.zero_grad(set_to_none=True)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if mode == "bf16 autocast" else contextlib.nullcontext()
    with context:
        logits = model(input_ids=ids, attention_mask=att).logits
    logits = logits.double() if mode == "fp64" else logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)[tgt[:, 1:]]
    logp.sum().backward()
    return {n: p.grad.detach().double().clone() for n, p in model.named_parameters() if p.grad is not None}


def compare(ref: dict, other: dict) -> dict:
    a, b = flat(ref), flat(other)
    out = {"cos": torch.nn.functional.cosine_similarity(a, b, dim=0).item(), "norm_ratio": (b.norm() / a.norm()).item()}
    parts: dict[str, list] = {}
    for name in ref:
        m = re.search(r"layers\.(\d+)\.\w+\.(\w+)\.lora_", name)
        if m:
            parts.setdefault(f"{m.group(2)} layers {int(m.group(1)) // 10 * 10}-{int(m.group(1)) // 10 * 10 + 9}",
                             []).append(name)
    out["parts"] = {}
    for key, names in sorted(parts.items()):
        x, y = torch.cat([ref[n].flatten() for n in names]), torch.cat([other[n].flatten() for n in names])
        out["parts"][key] = {"cos": torch.nn.functional.cosine_similarity(x, y, dim=0).item(),
                             "norm_ratio": (y.norm() / x.norm()).item(), "ref_norm": x.norm().item()}
    return out


def measure(policy, tokenizer, samples) -> dict:
    sets = {"demo samples (on-policy)": padded(samples)}
    enc = tokenizer(FIXED_TEXT, return_tensors="pt", padding=True)
    sets["fixed English text (control)"] = (enc.input_ids, enc.attention_mask, enc.attention_mask.bool())
    reference = copy.deepcopy(policy).double()
    out = {}
    for name, (ids, att, tgt) in sets.items():
        ref = gradients(reference, ids, att, tgt, "fp64")
        out[name] = {"tokens": int(tgt[:, 1:].sum()),
                     **{mode: compare(ref, gradients(policy, ids, att, tgt, mode)) for mode in ("fp32", "bf16 autocast")}}
    out["per sequence"] = per_sequence(policy, reference, samples)
    return out


def per_sequence(policy, reference, samples) -> list[dict]:
    """Each on-policy sample alone: its fp64 gradient norm and bf16 autocast's cosine and norm ratio to it."""
    rows = []
    for i, s in enumerate(samples):
        ids, att, tgt = padded([s])
        ref, b16 = flat(gradients(reference, ids, att, tgt, "fp64")), flat(gradients(policy, ids, att, tgt, "bf16 autocast"))
        rows.append({"sample": i, "tokens": s.response_len, "fp64_norm": ref.norm().item(),
                     "cos": torch.nn.functional.cosine_similarity(ref, b16, dim=0).item(),
                     "norm_ratio": (b16.norm() / ref.norm()).item()})
    return rows


def markdown(res: dict) -> str:
    lines = [f"# The update's gradient against fp64 ({res['date']})", "",
             f"{res['cpu']}; torch {res['torch']}; demo preset ({res['max_new_tokens']} new tokens) after {res['steps']} step(s); gradient of the summed "
             "log-probability of the target tokens with respect to the LoRA parameters; cosine and norm ratio to "
             "the fp64 gradient of the same policy. `python benchmarks/update_precision.py`.", "",
             "| tokens | set | fp32 cos | fp32 norm ratio | bf16 autocast cos | bf16 norm ratio |", "|---|---|---|---|---|---|"]
    for name, row in ((k, v) for k, v in res["sets"].items() if k != "per sequence"):
        f, b = row["fp32"], row["bf16 autocast"]
        lines.append(f"| {row['tokens']} | {name} | {f['cos']:.4f} | {f['norm_ratio']:.3f} | {b['cos']:.4f} | "
                     f"{b['norm_ratio']:.3f} |")
    on = res["sets"]["demo samples (on-policy)"]["bf16 autocast"]["parts"]
    lines += ["", "bf16 autocast on the demo samples, per projection and block of layers (largest fp64 norms first):",
              "", "| LoRA on | fp64 norm | cos | norm ratio |", "|---|---|---|---|"]
    for key, v in sorted(on.items(), key=lambda kv: -kv[1]["ref_norm"])[:12]:
        lines.append(f"| {key} | {v['ref_norm']:.4f} | {v['cos']:.3f} | {v['norm_ratio']:.3f} |")
    rows = res["sets"]["per sequence"]
    norms = sorted(r["fp64_norm"] for r in rows)
    lines += ["", f"Each of the {len(rows)} on-policy samples alone: fp64 gradient norm median {norms[len(norms) // 2]:.1f}; "
              f"bf16 autocast's cosine to fp64 >= 0.98 for {sum(r['cos'] >= 0.98 for r in rows)} of them. The five "
              "with the largest fp64 norms:", "", "| sample | response tokens | fp64 norm | bf16 cos | bf16 norm ratio |",
              "|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: -r["fp64_norm"])[:5]:
        lines.append(f"| {r['sample']} | {r['tokens']} | {r['fp64_norm']:.1f} | {r['cos']:.3f} | {r['norm_ratio']:.3f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64, help="64: benchmarks/speed.py's setting")
    parser.add_argument("--output", default=str(RESULTS / "update_precision"))
    args = parser.parse_args()
    from rlpr.model.forward import causal_lm

    tick = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        trainer, samples = demo_samples(args.steps, Path(work), args.max_new_tokens)
        sets = measure(trainer.policy, trainer.reward.tokenizer, samples)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from score_b_cache import cpu_name

    res = {"date": time.strftime("%Y-%m-%d %H:%M %z"), "cpu": cpu_name(), "torch": torch.__version__,
           "steps": args.steps, "max_new_tokens": args.max_new_tokens, "attention": causal_lm(trainer.policy).config._attn_implementation, "sets": sets,
           "seconds": time.perf_counter() - tick}
    from speedbench.report import save

    print(save(res, args.output, markdown))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
