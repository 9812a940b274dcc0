"""Can Gemma 3 270M (base) answer the demo questions, and in which prompt format? (issue 33)

Its GGUF file carries no chat template. This greedy-decodes the first `--questions` held-out questions of
the `small` preset under (a) Gemma 3's own turn format (`<start_of_turn>user ... <start_of_turn>model`,
the official chat template, text only) and (b) rlpr's Question/Answer text format for tokenizers without
a template (`rlpr.model.loading.QA_CHAT_TEMPLATE`), each response ending at a new line
(rollout.stop=["\\n"]) or at <eos> / <end_of_turn>, and grades them with the eval grader.

    python benchmarks/gemma_templates.py [--questions 60]

Writes benchmarks/results/gemma_templates.json and .md (with a few responses of each format).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"
# Gemma 3's chat template (text only; the official one also handles images and a system turn)
GEMMA_TURNS = ("{{ bos_token }}{%- for message in messages -%}"
               "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
               "{{ '<start_of_turn>' + role + '\\n' + (message['content'] | trim) + '<end_of_turn>\\n' }}"
               "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}")


def main() -> int:
    from rlpr.config import load_config
    from rlpr.grading import grade_example
    from rlpr.model.loading import QA_CHAT_TEMPLATE, load_model
    from rlpr.rollout.engines import build_engine
    from rlpr.train.setup import load_examples_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=60)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--output", default=str(RESULTS / "gemma_templates"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # a response ends at a new line, or at Gemma's turn end (a special token: decoding ends there)
    cfg = load_config("small", ["model.path=gemma3-270m", 'rollout.stop=["\\n", "<end_of_turn>"]',
                                "model.rollout_dtype=float32"])
    examples = load_examples_for(cfg, "val")[:args.questions]
    model, tokenizer = load_model(cfg.model.path)
    results = {}
    for name, template in (("gemma turns", GEMMA_TURNS), ("question/answer text", QA_CHAT_TEMPLATE)):
        tokenizer.chat_template = template
        engine = build_engine(model, tokenizer, cfg.rollout, torch.float32)
        prompts = [tokenizer(tokenizer.apply_chat_template(e.prompt, tokenize=False, add_generation_prompt=True),
                             add_special_tokens=False)["input_ids"] for e in examples]
        start = time.time()
        rollouts = engine.generate(prompts, 1, max_new_tokens=16, temperature=0.0)
        right = [grade_example(e, r.text).correct for e, r in zip(examples, rollouts)]
        results[name] = {"correct": sum(right), "questions": len(examples), "accuracy": sum(right) / len(examples),
                         "seconds": time.time() - start,
                         "examples": [{"question": e.prompt[-1]["content"], "reference": e.reference,
                                       "response": r.text, "correct": c}
                                      for e, r, c in list(zip(examples, rollouts, right))[:6]]}
        print(f"{name}: {sum(right)}/{len(examples)} greedy", flush=True)
    lines = [f"Gemma 3 270M (base), greedy, the first {len(examples)} held-out questions of the `small` preset's "
             "demo tasks (eval grader), by prompt format:", "", "| format | correct | accuracy |", "|---|---|---|"]
    lines += [f"| {k} | {v['correct']}/{v['questions']} | {100 * v['accuracy']:.1f}% |" for k, v in results.items()]
    for k, v in results.items():
        lines += ["", f"{k}, first responses:", ""] + [
            f"- {x['question']!r} (reference {x['reference']!r}): {x['response']!r} -> "
            f"{'right' if x['correct'] else 'wrong'}" for x in v["examples"]]
    Path(args.output + ".md").write_text("\n".join(lines) + "\n")
    Path(args.output + ".json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
