"""The speed benchmark (`python benchmarks/speed.py`) as a package: settings.py (the demo settings
both trainers run at), memory.py (RSS sampling), tokens.py (the tokens each phase runs through
the model), score_b_paths.py (score B from the cache and recomputed, on the same responses), rlpr_side.py (part 1, rlpr's timed steps and evaluation), trl_side.py (part 2, TRL's
GRPOTrainer on the same work), micro.py (part 3, the micro-benchmarks the child process runs) and
report.py (notes, speed.json and speed.md, with the earlier runs as history rows). speed.py, the
entry point, keeps the command line, the sides' processes and their turns (harness/baton.py); a package named `speed` would shadow it."""
