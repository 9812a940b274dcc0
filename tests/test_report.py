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
    for title in ("Reward (mean)", "Score B", "Score A", "Std filter: kept fraction", "Entropy", "Gradient norm",
                  "Response length", "Peak memory", "Step time", "Held-out: accuracy", "Held-out: pass@2"):
        assert title in page, title
    for absent in ("Clip fraction", "KL to the initial policy", "Format rate", "Accuracy (graded"):
        assert absent not in page, absent  # not logged by this run, not plotted
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

    train(tiny_cfg(tiny_dir, tmp_path, "rep", "trainer.max_steps=2"))
    run = tmp_path / "rep"
    err = capsys.readouterr().err
    assert f"run directory: {run}" in err and f"report: {run / 'report.html'}" in err
    assert f"last checkpoint: {run / 'checkpoints'}" in err  # the end of a run names its last checkpoint
    page = (run / "report.html").read_text()
    assert "Reward (mean)" in page and "Held-out evaluation" in page and "Sample responses" in page
    assert "Step time" in page and len(images(page)) >= 10
