"""Does RLPR teach the embedded model? Held-out accuracy before and after, against RLVR and ablations.

Every variant of learnbench/variants.py (`--list-variants`) trains the `small` preset's model over
several seeds and is evaluated, with one fixed scorer, on the same held-out and transfer questions;
the method, the settings and what the results mean are docs/learning.md's ("The learning benchmark").

    python benchmarks/learning.py              # the full benchmark (see --help for its size)
    python benchmarks/learning.py --variants rlpr,rlvr,rlvr_exact   # the three main variants only
    python benchmarks/learning.py --quick      # a smaller smoke setting (1 seed, rlpr + base)
    python benchmarks/learning.py --regrade    # re-grade the saved responses with the current grader
    python benchmarks/learning.py --threads 1 & python benchmarks/learning.py --threads 1 --reverse  # two workers

Finished runs are rows of <output>.jsonl (a re-run skips them; a killed run is taken over from its
start), their responses in <output>_responses/; the summary is <output>.{json,md,png}. The benchmark
is the package beside this entry point, learnbench/ (a package named `learning` would shadow it).
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


def main(argv: list[str] | None = None) -> int:
    from learnbench.cli import main as run

    return run(__doc__.splitlines()[0], argv)


if __name__ == "__main__":
    raise SystemExit(main())
