"""The speed benchmark's parts (benchmarks/speed.py is the entry point): settings.py (the demo settings
both trainers run at), score_b_paths.py, rlpr_side.py, trl_side.py and report.py. A package named
`speed` would shadow the entry script."""
