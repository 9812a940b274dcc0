"""The training loop's step display: phases, the ETA (evaluation left out), the plain line when
stderr is not a terminal, and the rich bar. A fake clock drives it: no wall-clock assertions."""

import io

import pytest
from rich.console import Console

from rlpr.train.progress import StepDisplay, format_eta

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def plain(total=4, start=0, clock=None):
    return StepDisplay(total, start, console=Console(file=io.StringIO(), force_terminal=False), clock=clock or Clock())


def test_format_eta():
    assert format_eta(0) == "0:00"
    assert format_eta(250) == "4:10"
    assert format_eta(59.6) == "1:00"
    assert format_eta(3600 + 62) == "1:01:02"
    assert format_eta(-3) == "0:00"


def test_eta_is_mean_step_time_without_eval_times_steps_left():
    clock = Clock()
    d = plain(total=4, clock=clock)
    assert d.eta() is None  # no step done yet
    d.phase("eval")  # the evaluation before the first step: 30 s, left out
    clock.t += 30
    d.phase("rollout")
    clock.t += 6
    d.phase("reward")
    clock.t += 2
    d.phase("update")
    clock.t += 2
    d.update(1, {})
    assert d.eta() == pytest.approx(10 * 3)
    d.phase("rollout")
    clock.t += 14
    d.phase("eval")  # an evaluation inside step 2: 100 s, left out
    clock.t += 100
    assert d.eta() == pytest.approx(24 / 1 * 3)  # still one step done; the open eval is not counted
    d.update(2, {})
    assert d.eta() == pytest.approx(24 / 2 * 2)


def test_eta_counts_steps_from_a_resumed_start():
    clock = Clock()
    d = plain(total=10, start=6, clock=clock)
    clock.t += 20
    d.update(7, {})
    assert d.eta() == pytest.approx(20 * 3)


def test_plain_line_appends_the_eta_and_prints_nothing_per_phase(capsys):
    clock = Clock()
    d = plain(total=4, clock=clock)
    with d:
        d.phase("rollout")
        clock.t += 65
        d.phase("update")
        assert capsys.readouterr().err == ""  # no line per phase
        d.update(1, {"reward/mean": 0.5, "reward/score_b_mean": 0.25, "filter/kept_frac": 1.0, "perf/step_s": 65.0})
    line = capsys.readouterr().err
    assert line == "step 1/4  reward 0.500  B 0.250  kept 1.00  65.0s/step  ETA 3:15\n"


def test_disabled_display_does_nothing(capsys):
    clock = Clock()
    d = StepDisplay(4, 0, enabled=False, clock=clock)
    with d:
        d.phase("rollout")
        clock.t += 5
        d.phase("eval")
        d.update(1, {"perf/step_s": 5.0})
    assert capsys.readouterr().err == ""
    assert d.phase_name == "" and d.done == 0 and d._progress is None


def test_label_names_the_step_its_phase_and_the_eta():
    clock = Clock()
    d = plain(total=16, clock=clock)
    d.phase("eval")
    assert d.label() == "step 0/16 · eval"  # before the first step
    d.phase("rollout")
    assert d.label() == "step 1/16 · rollout"
    clock.t += 10
    d.update(1, {})
    d.phase("reward")
    assert d.label() == "step 2/16 · reward · ETA 2:30"
    d.phase("eval")  # evaluation at the end of step 2
    assert d.label().startswith("step 2/16 · eval")
    for step in range(2, 17):
        d.update(step, {})
    d.phase("eval")  # after the last step
    assert d.label() == "step 16/16 · eval · ETA 0:00"


def test_rich_bar_shows_the_phase_and_eta():
    out = io.StringIO()
    clock = Clock()
    d = StepDisplay(16, 0, console=Console(file=out, force_terminal=True, width=120), clock=clock)
    assert d.tty
    with d:
        d.phase("rollout")
        clock.t += 15
        d.update(1, {"reward/mean": 0.5, "perf/step_s": 15.0})
        d.phase("reward")
        d._progress.refresh()
        text = out.getvalue()
    assert "step 2/16 · reward · ETA 3:45" in text
    assert "reward 0.500" in text


def test_batch_progress_off_a_terminal_prints_a_line_with_the_eta_every_interval():
    """issue 35, E1: `rlpr eval` off a terminal (a log file, nohup) printed nothing for 30 minutes;
    now a plain line at most every `interval` seconds with the count, the elapsed time and an ETA."""
    from rlpr.train.progress import progress_bar

    clock, out = Clock(), io.StringIO()
    with progress_bar(138, "evaluating", clock=clock, interval=30.0, stream=out) as advance:
        for _ in range(10):  # 4 questions per 10 s: a line every 30 s
            clock.t += 10
            advance(4)
    lines = out.getvalue().splitlines()
    assert lines == ["evaluating: 12/138 (8%), 0:30 elapsed, ETA 5:15",
                     "evaluating: 24/138 (17%), 1:00 elapsed, ETA 4:45",
                     "evaluating: 36/138 (26%), 1:30 elapsed, ETA 4:15"]
    out = io.StringIO()
    with progress_bar(138, "evaluating", enabled=False, clock=clock, interval=0.0, stream=out) as advance:
        advance(4)
    assert out.getvalue() == ""
