"""What every benchmark suite shares (issue 62): record.py (machine, commit, date, versions), files.py (a
result as OUTPUT.json + .md + .png with its header and history rows), memory.py (RSS readers), baton.py
(two processes taking turns) and index.py (benchmarks/results/README.md as data). Standard library only
at import time (a suite's child processes import it before torch)."""
