"""The learning benchmark (`python benchmarks/learning.py`) as a package: variants.py (the variant
registry, model families, question sets), runner.py (one run: train, evaluate, the base row),
rows.py (the .jsonl of finished runs and the job claims workers share), records.py (saved
responses), regrade.py, tables.py, plots.py and cli.py (flags, job list, summary). Named apart
from learning.py, the entry point, which a package `learning` would shadow."""
