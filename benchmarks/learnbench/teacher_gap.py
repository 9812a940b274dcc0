"""The reasoning track's families, chosen by measurement (issue 58): per family, the untrained model's
greedy accuracy, Avg@k and pass@k at the track's settings (its prompt, length and temperature), and the
self-teacher gap: the same model's Avg@k when shown the family's worked solution in OPSD's teacher
context (the matched template, opsd.context=solution) minus its Avg@k without it. OPSD's gain has been
reported to grow with that gap; RL has room where pass@k clearly exceeds Avg@k.

Questions come from the training split (the held-out questions are never looked at to choose), the
same for both prompts, graded by the rule graders as the learning benchmark grades.

    python benchmarks/learning.py --teacher-gap --preset reasoning [--gap-questions 24] [--samples 8] [--threads 1]
"""

from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from harness import files, record

from .records import graded_numbers
from .runner import evaluation, make_trainer
from .variants import RESULTS


def _family(prompt) -> str:
    return prompt.example.data_source.split("/", 1)[1]


def _numbers(kept: list[dict]) -> dict:
    """Greedy accuracy, Avg@k and pass@k (records.graded_numbers, as the learning rows compute them) and
    the sampled responses' mean length in words."""
    graded = graded_numbers(kept)
    return {"greedy": graded["greedy"], "avg": graded["acc"], "pass": graded["pass8"],
            "len": statistics.fmean(len(s.split()) for q in kept for s in q["samples"])}


def measure(preset: str, questions: int, samples: int, threads: int, workdir: Path) -> dict:
    """Every family of the preset's data.demo_families: the student's and the teacher's numbers."""
    from rlpr.config import load_config
    from rlpr.data.demo_tasks import demo_examples, pool_size
    from rlpr.data.prompts import prepare_prompts
    from rlpr.data.templates import teacher_messages

    cfg = load_config(preset)
    d = cfg.data
    examples = [e for f in d.demo_families for e in demo_examples(
        "train", n=min(questions, pool_size("train", d.demo_seed, [f], d.demo_val_every)), seed=d.demo_seed,
        template=d.template, families=[f], val_every=d.demo_val_every)]
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        trainer = make_trainer(preset, [f"model.threads={threads}", f"trainer.eval_samples={samples}"], Path(tmp))
        tok = trainer.tokenizer
        student = prepare_prompts(examples, tok, d.max_prompt_tokens, d.prefill)[0]
        shown = [dataclasses.replace(e, prompt=teacher_messages(e.prompt, cfg.opsd.template, e.extra_info["solution"],
                                                                context="solution", transition=cfg.opsd.transition))
                 for e in examples]
        teacher = prepare_prompts(shown, tok, d.max_prompt_tokens, d.prefill)[0]
        out = {}
        for name, prompts in (("student", student), ("teacher", teacher)):
            kept: list[dict] = []
            tick = time.time()
            evaluation(trainer, prompts=prompts, keep=kept, score=False)
            print(f"{name}: {len(kept)} questions in {time.time() - tick:.0f} s", flush=True)
            out[name] = kept
    families = {}
    for f in d.demo_families:
        s = _numbers([q for q in out["student"] if _family(q["prompt"]) == f])
        t = _numbers([q for q in out["teacher"] if _family(q["prompt"]) == f])
        families[f] = {"questions": sum(_family(q["prompt"]) == f for q in out["student"]),
                       "greedy": s["greedy"], "avg": s["avg"], "pass": s["pass"], "len_words": s["len"],
                       "teacher_greedy": t["greedy"], "teacher_avg": t["avg"], "teacher_pass": t["pass"],
                       "gap": t["avg"] - s["avg"], "room": s["pass"] - s["avg"]}
    example = next(q for q in out["teacher"])
    return {"preset": preset, "samples": samples, "max_new_tokens": cfg.trainer.eval_max_new_tokens
            or cfg.rollout.max_new_tokens, "temperature": cfg.rollout.temperature, "template": d.template,
            "teacher_template": cfg.opsd.template, "families": families,
            "teacher_prompt_example": example["prompt"].text, "student_example": out["student"][0]["samples"][:2],
            **record.stamp()}


def write(result: dict, prefix: Path) -> str:
    k = result["samples"]
    lines = [f"# Self-teacher gap per reasoning family (preset `{result['preset']}`)", "",
             f"The untrained embedded model on training-split questions: template `{result['template']}`, "
             f"{result['max_new_tokens']} new tokens, temperature {result['temperature']}, {k} samples + greedy. "
             f"Teacher: the same model shown the family's worked solution (opsd.template="
             f"{result['teacher_template']}, context solution). Gap = teacher Avg@{k} - student Avg@{k}; "
             f"room = pass@{k} - Avg@{k} (%).", "",
             *files.table(["family", "questions", "greedy", f"Avg@{k}", f"pass@{k}", "room", f"teacher Avg@{k}",
                           "teacher greedy", "gap", "words per response"], (
                 [f, r["questions"], *(f"{100 * r[c]:.1f}" for c in ("greedy", "avg", "pass")), f"{100 * r['room']:+.1f}",
                  f"{100 * r['teacher_avg']:.1f}", f"{100 * r['teacher_greedy']:.1f}", f"{100 * r['gap']:+.1f}",
                  f"{r['len_words']:.0f}"] for f, r in result["families"].items()))]
    lines += ["", "A teacher prompt (the first question):", "", "```", result["teacher_prompt_example"], "```", ""]
    lines[1:1] = ["", files.header(result)] if result.get("machine") else []
    return files.save(result, prefix, lambda _: "\n".join(lines))


def main(args) -> int:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = measure(args.preset, args.gap_questions, args.samples, args.threads, workdir)
    print(write(result, RESULTS / "self_teacher_gap"))
    return 0
