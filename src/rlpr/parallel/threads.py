"""Torch threads for a CPU process that may share its machine (issue 42, item 5).

Several rlpr processes on one machine (a sweep, the learning benchmark's workers, tests beside a
run) used to take torch's default each: one thread per core. With 2 cores, two such runs beside a
third took 665 s for a step that takes 35 s with one thread each: idle OpenMP threads spin for
milliseconds after every parallel region (libgomp's default), so the processes burn each other's
time slices. Two things prevent it:

- OpenMP's idle threads spin briefly, then sleep (`GOMP_SPINCOUNT=30000`, set by `import rlpr`
  before torch loads OpenMP, unless the user set it or OMP_WAIT_POLICY): libgomp's default spins
  ten times longer (300,000) and burns the time slices of other processes' threads, while sleeping
  at once (`OMP_WAIT_POLICY=PASSIVE`, rlpr's earlier choice) made a lone demo step 1.4x slower on
  an AMD EPYC whose cores other tenants were using, each of the thousands of small parallel
  regions of a step paying a wake-up (benchmarks/results/archive/shared_cpu_amd.md; no difference in a
  quiet hour).
- The number of threads is chosen from the CPUs this process may use (`os.sched_getaffinity`),
  shared among the ranks of this machine, less what other processes are using now (sampled from
  /proc/stat, or the load average where there is none); a run that starts on a busy machine says
  so in one line. `model.threads` (> 0) is the explicit choice and is taken as given.
"""

from __future__ import annotations

import logging
import math
import os
import time

log = logging.getLogger(__name__)

SPIN_COUNT = 30000  # libgomp's spins before an idle thread sleeps (its default: 300,000)


def bounded_openmp_wait(environ=os.environ, torch_loaded: bool = False) -> bool:
    """Make OpenMP's idle threads spin `SPIN_COUNT` times, then sleep, unless the user chose
    (OMP_WAIT_POLICY or GOMP_SPINCOUNT set) or torch has loaded OpenMP already (it reads the
    variables once, at load)."""
    if torch_loaded or "OMP_WAIT_POLICY" in environ or "GOMP_SPINCOUNT" in environ:
        return False
    environ["GOMP_SPINCOUNT"] = str(SPIN_COUNT)
    return True


def allowed_cpus() -> set[int] | None:
    """The CPUs this process may run on (its affinity mask: taskset, cgroup cpusets); None where
    the platform does not say."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _snapshot(cpus: set[int]) -> tuple[float, float, float, float] | None:
    """(wall s, busy jiffies, all jiffies, this process's CPU s): the jiffies from /proc/stat,
    summed over `cpus`; None where /proc/stat cannot be read."""
    try:
        with open("/proc/stat") as f:
            lines = f.readlines()
    except OSError:
        return None
    busy = total = 0.0
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit() or int(name[3:]) not in cpus:
            continue
        values = [float(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        total += sum(values)
        busy += sum(values) - values[3] - values[4]
    return (time.monotonic(), busy, total, time.process_time()) if total else None


_mark: tuple[float, float, float, float] | None = None
MAX_AGE = 30.0  # seconds: an older mark says too little about now


def mark() -> None:
    """Start the window over which busy_elsewhere() measures the others (`import rlpr` calls it,
    so that the imports before a run's first step are the window and nobody waits for it)."""
    global _mark
    cpus = allowed_cpus()
    _mark = _snapshot(cpus) if cpus else None


def others_between(start, end, cpus: int, hz: float) -> float:
    """CPUs' worth of work between two snapshots that was not this process's: all busy time on the
    `cpus` CPUs less this process's own CPU time, over the time that passed."""
    others = (end[1] - start[1]) / hz - (end[3] - start[3])  # CPU seconds
    return max(0.0, min(1.0, others / ((end[2] - start[2]) / hz))) * cpus


def busy_elsewhere(min_window: float = 0.1) -> float:
    """How many of this process's CPUs other processes kept busy since mark() (or over the last
    `min_window` seconds, slept here, when the mark is missing, older than MAX_AGE or too recent):
    all CPU time on those CPUs less this process's own. Where /proc/stat is missing, the 1-minute
    load average; 0.0 where neither can be read."""
    global _mark
    cpus = allowed_cpus()
    start = _mark
    if cpus and (start is None or time.monotonic() - start[0] > MAX_AGE):
        start = _snapshot(cpus)
    if cpus and start is not None:
        wait = min_window - (time.monotonic() - start[0])
        if wait > 0:
            time.sleep(wait)
        end = _mark = _snapshot(cpus)
        if end is not None and end[2] > start[2]:
            return others_between(start, end, len(cpus), os.sysconf("SC_CLK_TCK"))
    try:
        return max(0.0, os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def choose_threads(cpus: int, local_ranks: int, busy: float, cap: int | None = None) -> tuple[int, str | None]:
    """Threads for one of `local_ranks` processes on `cpus` CPUs, `busy` of which other processes
    use (the other ranks of this machine, still starting, may count in `busy`: up to one CPU each is
    forgiven), at most `cap`. Returns the number and a one-line warning when the machine is
    oversubscribed (this process gets less than its share, or not even one free CPU)."""
    local_ranks = max(1, local_ranks)
    share = max(1, min(cap or cpus, cpus // local_ranks))
    others = min(float(cpus), max(0.0, busy - (local_ranks - 1)))
    free = cpus - others
    threads = max(1, min(share, math.floor(free / local_ranks + 0.5)))
    if threads < share or free < 0.5 * local_ranks:
        return threads, (f"{others:.1f} of {cpus} CPUs are busy with other processes: {threads} torch "
                         f"thread{'s' if threads > 1 else ''} per process (model.threads sets them)")
    return threads, None


_torch_default: int | None = None


def use_threads(requested: int = 0, *, local_ranks: int | None = None, device: str = "cpu") -> int:
    """Set torch's threads: `requested` (model.threads) when > 0, else this process's share of the
    CPUs it may use, less those other processes keep busy (on CUDA torch's default: the CPU only
    feeds the GPU). Warns in one line when the machine is oversubscribed. Returns the number set,
    0 for none."""
    import torch

    global _torch_default
    if _torch_default is None:  # torch's own choice (OMP_NUM_THREADS, physical cores), before ours
        _torch_default = torch.get_num_threads()
    if requested > 0:
        torch.set_num_threads(requested)
        return requested
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        return 0
    if local_ranks is None:
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cpus = allowed_cpus()
    # one process: at most torch's default (OMP_NUM_THREADS, or one per physical core); torchrun
    # sets OMP_NUM_THREADS=1 for its ranks, whose share is the CPUs divided among them
    cap = _torch_default if local_ranks <= 1 else None
    threads, warning = choose_threads(len(cpus) if cpus else (os.cpu_count() or 1), local_ranks,
                                      busy_elsewhere(), cap)
    if warning and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        log.warning(warning)
    torch.set_num_threads(threads)
    return threads
