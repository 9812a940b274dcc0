"""`rlpr report`: one self-contained HTML page per run or comparing runs, and the report.html that
`rlpr train` leaves in the run directory."""

import base64
import re

import pytest

from rlpr.cli.main import main
from rlpr.report import load_run, write_report
from rlpr.report.data import config_differences, pick_samples

from helpers import fake_run, tiny_cfg

pytestmark = pytest.mark.integration  # the CLI in-process and a tiny training run

PNG = re.compile(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def images(page):
    return [base64.b64decode(b) for b in PNG.findall(page)]


def test_one_run_report_is_self_contained_and_plots_only_present_keys(tmp_path, capsys):
    run = fake_run(tmp_path / "run-a")
    assert main(["report", str(run), "--png-dir", str(tmp_path / "png")]) == 0
    assert f"wrote {run / 'report.html'}" in capsys.readouterr().out
    page = (run / "report.html").read_text()
    pngs = images(page)
    assert pngs and all(p.startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert "http://" not in page and "https://" not in page and "<script" not in page  # nothing fetched
    for title in ("Reward (mean)", "Score B", "Score A", "Entropy", "Gradient norm",
                  "Response length", "Peak memory", "Step time", "Held-out: accuracy", "Held-out: pass@2"):
        assert title in page, title
    for absent in ("Clip fraction", "KL to the initial policy", "Format rate", "Accuracy (graded"):
        assert absent not in page, absent  # not logged by this run, not plotted
    # constant over the run: listed with its value, not drawn
    assert "Std filter: kept fraction" not in page and "<code>filter/kept_frac</code> 1" in page
    # held-out before -> after with standard errors, and the change in points
    assert "accuracy (Avg@2)" in page and "25.0% &plusmn; 10.0%" in page and "50.0% &plusmn; 10.0%" in page
    assert "+25.0 pp" in page
    # config differences from the defaults; sample responses escaped
    assert "trainer.lr" not in page  # the default lr: no difference
    assert "&lt;b&gt;x&lt;/b&gt;" in page and "<b>x</b>" not in page
    assert len(list((tmp_path / "png").glob("*.png"))) == len(pngs)


def test_comparing_runs_lists_config_differences(tmp_path):
    a = fake_run(tmp_path / "a", lr=1e-6)
    b = fake_run(tmp_path / "b", steps=5, lr=3e-6, with_samples=False)
    out = write_report([a, b], tmp_path / "cmp.html")
    page = out.read_text()
    what, diffs = config_differences([load_run(a), load_run(b)])
    assert what == "between runs" and list(diffs) == ["trainer.lr"] and diffs["trainer.lr"] == [1e-6, 3e-6]
    assert "<code>trainer.lr</code>" in page and ">a<" in page and ">b<" in page
    assert "b: no samples" in page
    assert len(images(page)) >= 10


def test_one_run_config_table_shows_keys_changed_from_defaults(tmp_path):
    run = load_run(fake_run(tmp_path / "r", config={"rollout.max_new_tokens": 7}))
    what, diffs = config_differences([run])
    assert what == "from the defaults" and diffs == {"rollout.max_new_tokens": [7, 256]}


def test_samples_pick_best_and_worst_per_prompt():
    rows = [{"prompt": p, "reward": r} for p in ("x", "y") for r in (0.3, 0.9, 0.1)]
    assert [(r["prompt"], r["reward"]) for r in pick_samples(rows)] == [("x", 0.9), ("x", 0.1), ("y", 0.9), ("y", 0.1)]


def test_not_a_run_directory_is_one_line(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"rlpr: error: {tmp_path}: not a run directory (no metrics.jsonl)"


def test_a_crashed_line_and_missing_files_still_report(tmp_path):
    run = tmp_path / "partial"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 1, "reward/mean": 0.2}\n{"step": 2, "rew')
    page = write_report([run]).read_text()
    assert "Reward (mean)" in page and "running or crashed" in page
    assert "No held-out evaluation" in page


def test_a_failed_report_is_a_warning_not_a_failed_run(tmp_path, caplog, monkeypatch):
    import rlpr.report as report
    from rlpr.train.run_dir import write_run_report

    monkeypatch.setattr(report, "write_report", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full")))
    assert write_run_report(tmp_path) is None
    assert "could not write the run report: disk full" in caplog.text


def test_train_writes_the_report_and_prints_its_path(tiny_dir, tmp_path, capsys):
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "rep", "trainer.max_steps=2", "trainer.report=true"))
    run = tmp_path / "rep"
    err = capsys.readouterr().err
    assert f"run directory: {run}" in err and f"report: {run / 'report.html'}" in err
    assert f"last checkpoint: {run / 'checkpoints'}" in err  # the end of a run names its last checkpoint
    page = (run / "report.html").read_text()
    assert "Reward (mean)" in page and "Held-out evaluation" in page and "Sample responses" in page
    folded = re.findall(r'<p class="muted constant">Not drawn, constant over the run: (.*?)</p>', page)
    assert "Step time" in page and len(images(page)) + sum(line.count("<code>") for line in folded) >= 10


def test_panels_constant_over_the_run_are_listed_not_drawn(tmp_path):
    """Format rate with no format term, KL at kl_coef=0, a clip fraction of 0: one line with their
    values instead of flat panels. A panel with any series that moves, or logged at one step only,
    is drawn; several runs fold a panel only when all hold the same value."""
    import json

    from rlpr.report.render import constant_panels

    def write(run, extra):
        run.mkdir()
        rows = [{"step": s, "reward/mean": 0.1 * s, "reward/format_rate": 0.0, "policy/kl": 0, "policy/clip_frac": 0.0,
                 "filter/threshold": 0.05, "filter/ema_std": 0.1 * s, "perf/peak_rss_gb": 2.0, **extra(s)}
                for s in (1, 2, 3)]
        rows.append({"step": 3, "eval/accuracy": 0.5, "eval/format_rate": 1.0})
        rows.insert(0, {"step": 0, "eval/accuracy": 0.25, "eval/format_rate": 1.0})
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return run

    a = write(tmp_path / "a", lambda s: {"policy/entropy": 2.0, "rollout/response_len_mean": 9.0})
    page = write_report([a]).read_text()
    line = re.search(r'<p class="muted constant">Not drawn, constant over the run: (.*?)</p>', page.split(
        "<h2>Training</h2>")[1]).group(1)
    assert line == ("<code>reward/format_rate</code> 0, <code>rollout/response_len_mean</code> 9, "
                    "<code>policy/entropy</code> 2, <code>policy/kl</code> 0, <code>policy/clip_frac</code> 0, "
                    "<code>perf/peak_rss_gb</code> 2")
    for title in ("Format rate", "Entropy", "KL to the initial policy", "Clip fraction", "Peak memory"):
        assert f'alt="{title}' not in page, title
    # a panel drawn when one of its series moves (threshold constant, EMA std not); held-out accuracy moves
    assert 'alt="Std filter: threshold and EMA std"' in page and 'alt="Reward (mean)"' in page
    assert 'alt="Held-out: accuracy"' in page and "<code>eval/format_rate</code> 1</p>" in page
    assert len(images(page)) == 3
    # two runs: entropy constant in each but different, so drawn (the runs differ); KL 0 in both: folded
    b = write(tmp_path / "b", lambda s: {"policy/entropy": 3.0, "rollout/response_len_mean": 9.0})
    folded = dict(constant_panels([load_run(a), load_run(b)])["train"])
    assert "policy/entropy" not in folded and folded["policy/kl"] == 0 and folded["rollout/response_len_mean"] == 9
    # one step only: nothing is folded (one point is not "constant over the run")
    one = tmp_path / "one"
    one.mkdir()
    (one / "metrics.jsonl").write_text('{"step": 1, "policy/kl": 0, "reward/mean": 0.2}\n')
    assert constant_panels([load_run(one)]) == {"train": [], "eval": []}


def test_a_change_in_response_length_is_not_coloured_good_or_bad(tmp_path):
    import yaml

    run = fake_run(tmp_path / "r")
    summary = yaml.safe_load((run / "summary.yaml").read_text())
    summary["after"]["eval/response_len_mean"] = 10.0
    (run / "summary.yaml").write_text(yaml.safe_dump(summary))
    page = write_report([run]).read_text()
    assert '<span class="">-2</span>' in page  # 12 -> 10 tokens: neither green nor red
    assert '<span class="up">+25.0 pp</span>' in page  # accuracy up: green


def test_accuracy_error_bars_stay_between_0_and_1():
    from rlpr.report.render import error_bars

    below, above = error_bars([0.02, 0.5, 0.99], [0.05, 0.05, 0.05], (0.0, 1.0))
    assert below == pytest.approx([0.02, 0.05, 0.05]) and above == pytest.approx([0.05, 0.05, 0.01])
    values = [0.02, 0.5, 0.99]
    lows = [v - b for v, b in zip(values, below)]
    highs = [v + a for v, a in zip(values, above)]
    assert min(lows) >= 0.0 and max(highs) <= 1.0
    assert error_bars([-3.0], [1.0], None) == [[1.0], [1.0]]  # a quantity without bounds keeps +-1 SE
