"""Torch threads on a shared machine (issue 42, item 5): the choice from the free CPUs, the one-line
warning, model.threads as the override, and OpenMP's passive wait set before torch loads it."""

import os
import subprocess
import sys
import time

import pytest
import torch

from rlpr.parallel import threads

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("cpus,ranks,busy,cap,expected,warns", [
    (2, 1, 0.0, None, 2, False),   # idle: every CPU
    (2, 1, 0.3, None, 2, False),   # a little background work: still both
    (2, 1, 1.0, None, 1, True),    # another run on one core: one thread, and a warning
    (2, 1, 2.0, None, 1, True),    # everything busy: never fewer than one
    (8, 1, 0.0, 4, 4, False),      # at most torch's default (physical cores)
    (8, 1, 3.0, None, 5, True),
    (2, 2, 1.0, None, 1, False),   # torchrun ranks: the sibling starting up is forgiven
    (8, 2, 1.0, None, 4, False),
    (8, 2, 5.0, None, 2, True),
])
def test_threads_follow_the_free_cpus(cpus, ranks, busy, cap, expected, warns):
    n, warning = threads.choose_threads(cpus, ranks, busy, cap)
    assert n == expected
    assert (warning is not None) == warns
    if warning:
        assert "\n" not in warning and "model.threads" in warning and f"of {cpus} CPUs" in warning


def test_model_threads_is_taken_as_given():
    before = torch.get_num_threads()
    try:
        assert threads.use_threads(3) == 3 and torch.get_num_threads() == 3
        assert threads.use_threads(0, device="cuda") == 0 and torch.get_num_threads() == 3  # the GPU run: untouched
        assert 1 <= threads.use_threads(0) <= len(os.sched_getaffinity(0))
    finally:
        torch.set_num_threads(before)


def test_busy_elsewhere_sees_another_process():
    """A spinning child keeps (nearly) a CPU busy, measured from /proc/stat since the mark."""
    cpus = len(os.sched_getaffinity(0))
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.1)  # the child is spinning
        threads.mark()
        time.sleep(0.3)
        busy = threads.busy_elsewhere()
    finally:
        child.kill()
        child.wait()
    assert 0.5 <= busy <= cpus


def test_this_process_own_work_is_not_counted():
    # snapshots: (wall s, busy jiffies, all jiffies, own CPU s) at 100 jiffies per second, 2 CPUs, 1 s
    start = (0.0, 1000.0, 5000.0, 10.0)
    assert threads.others_between(start, (1.0, 1150.0, 5200.0, 11.5), 2, 100) == 0.0  # 1.5 CPU s: all ours
    assert threads.others_between(start, (1.0, 1150.0, 5200.0, 10.5), 2, 100) == pytest.approx(1.0)
    assert threads.others_between(start, (1.0, 1200.0, 5200.0, 10.0), 2, 100) == pytest.approx(2.0)


def test_importing_rlpr_bounds_openmp_spinning_unless_the_user_chose():
    code = "import os, rlpr, torch; print(os.environ.get('GOMP_SPINCOUNT'), os.environ.get('OMP_WAIT_POLICY'))"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          check=True).stdout.strip() == f"{threads.SPIN_COUNT} None"
    for chosen in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "1000"}):  # the user's choice stands
        environ = dict(chosen)
        assert not threads.bounded_openmp_wait(environ) and environ == chosen
    environ = {}
    assert not threads.bounded_openmp_wait(environ, torch_loaded=True) and environ == {}  # too late to matter
    assert threads.bounded_openmp_wait(environ) and environ == {"GOMP_SPINCOUNT": str(threads.SPIN_COUNT)}
