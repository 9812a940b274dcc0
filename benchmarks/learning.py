"""Does RLPR teach the embedded model? Held-out accuracy before and after, against RLVR and ablations.

Every variant of learnbench/variants.py (`--list-variants`) trains the `small` preset's model over
several seeds and is evaluated, with one fixed scorer, on the same held-out and transfer questions;
the method, the settings, the workers and what the results mean are docs/learning.md's ("The learning
benchmark"). Finished runs are rows of <output>.jsonl (a re-run skips them, a killed run is taken over),
their responses in <output>_responses/, the summary <output>.{json,md,png}; the code: learnbench/.

    python benchmarks/learning.py [--quick] [--regrade] [--list-variants] [--variants a,b] [--reverse]
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
