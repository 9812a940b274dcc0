"""The speed benchmark (`python benchmarks/speed.py`) as a package: settings.py (the demo settings
both trainers run at), baton.py (the turns the two trainers' processes take), memory.py (RSS
sampling), rlpr_side.py (part 1, rlpr's timed steps and evaluation), trl_side.py (part 2, TRL's
GRPOTrainer on the same work), micro.py (part 3, the micro-benchmarks the child process runs) and
report.py (versions, notes, speed.json and speed.md). speed.py, the entry point, keeps the command
line, the sides' processes and their turns; a package named `speed` would shadow it."""
