"""Does RLPR teach the embedded model? Held-out accuracy before and after, against RLVR and ablations.

Trains SmolLM2-135M-Instruct (LoRA) with the `small` preset on the built-in demo tasks, over
several seeds, and evaluates every run on the SAME held-out questions (the demo `val` split of
the preset's task families, drawn by a hash of the question text before any training, never
trained on) with the SAME fixed scorer (learnbench/variants.py SCORER), exactly as RLPR evaluates:

- Avg@8: 8 samples per question at the rollout temperature, accuracy averaged (the paper's metric),
- greedy accuracy, pass@8, mean probability reward and score B of the greedy response, format
  rate, response length; standard errors are binomial over the held-out questions.

Transfer: every run and the base model are also evaluated (Avg@8, greedy, pass@8, same sampling)
on two sets never trained on: examples/family_new_items.jsonl (110 new items of the demo
families, answers outside the demo dictionaries) and examples/general_questions.jsonl (208
general short-answer questions of other kinds, aliases in the answer list). "Before" is the base
model for every run (every run starts from it).

Variants are config overrides on top of the preset, registered in learnbench/variants.py
(`--list-variants` prints them): `rlpr` (the preset), `rlvr` and `rlvr_exact` (verifier rewards),
the ablations (`no_debias`, `no_std_filter`, `seq_likelihood`, `verifree`, `nover`, `reinforce`,
`reinforce_no_debias`, `rlvr_exact_nz`, `rlpr_nz`), RLPR's controls (`random`,
`shuffled_reference`, `entropy`, `self_certainty`, `majority`), on-policy self-distillation
(`opsd`, `opsd_hybrid`) and its controls (`op2sd`, `opsd_context_only`, `opsd_no_teacher`); and
`base`, the untrained model (evaluated once: every run starts from it). Three precision arms run only
when named: `rlpr_exact_b`, `rlpr_fp32_update` and `rlpr_b_by_policy` (the bf16 choices of the
defaults on a fast-bf16 CPU, each changed back to fp32; results/precision_arms.md and
b_on_copy_arms.md, run under earlier names: learnbench/variants.py maps them).

    python benchmarks/learning.py              # the full benchmark (see --help for its size)
    python benchmarks/learning.py --variants rlpr,rlvr,rlvr_exact   # the three main variants only
    python benchmarks/learning.py --quick      # a smaller smoke setting (1 seed, rlpr + base)
    python benchmarks/learning.py --regrade    # re-grade the saved responses with the current grader

Two 1-thread workers share the job list (each job claimed by a file in the work dir; a worker
that needs the base evaluation waits for it):
    python benchmarks/learning.py --threads 1 & python benchmarks/learning.py --threads 1 --reverse

Each finished run is appended to <output>.jsonl; a re-run skips the runs already there, so an
interrupted benchmark loses at most the runs in progress, which the next worker runs again from
their start (a claim whose worker has ended is taken over). Every row records the graders'
version (`rlpr.grading.GRADER_VERSION`, also part of the settings): rows graded by another
version are never mixed with new ones (they are skipped, with a message). Each run's final
responses (held-out, transfer and curve questions: per question the greedy and sampled
responses, the reference and its aliases, and their grades) go to
<output>_responses/<variant>-<seed>-<settings hash>.jsonl.gz, so that `--regrade` recomputes
every graded number (Avg@k, greedy, pass@k, the curves) with the current grader without
retraining; the training-time accuracies (`train[*].reward/accuracy`) and what the `rlvr` runs
were rewarded with stay those of the grader the run trained with (`regraded_from` says which).
The summary goes to <output>.json (`{"runs": [...], "table": [...]}`), <output>.md and
<output>.png (learning curves and transfer).

This file is the entry point; the benchmark is the package beside it, learnbench/ (variants,
runner, rows and claims, re-grading, tables, plots, the command line): a package named
`learning` would shadow this script for `import learning`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# transformers' per-file "Loading weights" bars, read when it is first imported: every run and
# evaluation loads a model, and the bars filled the workers' logs (rlpr's own commands are quiet)
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script, or loaded from its path by a test
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from learnbench.runner import make_trainer  # noqa: E402,F401  (benchmarks/answer_cue.py imports it from here)
from learnbench.variants import MODELS, VARIANTS  # noqa: E402,F401  (benchmarks/reward_cost.py: MODELS)


def main(argv: list[str] | None = None) -> int:
    from learnbench.cli import main as run

    return run(__doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
