"""What every benchmark suite shares (issue 62), so that no suite keeps its own copy:

    record.py  the machine (CPU and its instruction set or GPU), the commit, the date, the versions:
               the header of every canonical result file
    files.py   a result saved as OUTPUT.json + OUTPUT.md (+ .png), the earlier runs kept as history
               rows inside the same file, and the header line that states machine, commit and date
    baton.py   two processes taking turns step by step, so that both meet the same load
    index.py   benchmarks/results/README.md read as data: question -> command -> canonical file ->
               the doc lines that quote it (tests/test_results_index.py checks every quoted number)

Standard library only at import time (a suite's child processes import it before torch).
"""
