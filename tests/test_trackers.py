"""The trackers registry (`trainer.trackers`): jsonl always on, tensorboard (and its older switch
`trainer.tensorboard`), wandb and mlflow offline, with the logged metrics read back equal to
metrics.jsonl; a tracker whose package is missing is a one-line ConfigError."""

import importlib.util

import pytest

import rlpr.errors

from rlpr.cli.main import main
from rlpr.config import load_config
from rlpr.errors import ConfigError
from rlpr.train.tracking import TRACKERS, Tracker, active_trackers, mlflow_name

from helpers import logged_numbers, tiny_cfg, wandb_history

pytestmark = pytest.mark.integration  # the CLI in-process and tiny training runs

FAKE_KEY = "0123456789abcdef0123456789abcdef01234567"  # never a real key; must never be printed


def needs(package):
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (pip install 'rlpr[{package}]')")


def test_registry_and_older_switch():
    assert list(TRACKERS) == ["jsonl", "tensorboard", "wandb", "mlflow"]
    assert active_trackers(["tensorboard"]) == ["jsonl", "tensorboard"]
    assert active_trackers(["jsonl", "tensorboard", "wandb"], tensorboard=False) == ["jsonl", "wandb"]
    assert active_trackers([]) == ["jsonl"]  # jsonl is always on
    assert mlflow_name("eval/pass@4") == "eval/pass_at_4"


def test_unknown_tracker_is_one_line(capsys):
    assert main(["config", "trainer.trackers=[jsonl, comet]"]) == 2
    assert capsys.readouterr().err.strip() == (
        "rlpr: error: trainer.trackers: 'comet' is not one of jsonl, tensorboard, wandb, mlflow")


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_missing_package_is_one_line(name, monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda pkg, *a: None if pkg == name else real(pkg, *a))
    with pytest.raises(ConfigError, match=rf"^trainer.trackers: the {name} tracker needs the {name} package "
                                          rf"\(pip install 'rlpr\[{name}\]'\)$"):
        load_config("demo", [f"trainer.trackers=[jsonl, {name}]"])
    assert main(["config", f"trainer.trackers=[{name}]"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_tensorboard_logs_the_same_numbers(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tracker = Tracker(tmp_path, trackers=["tensorboard"])
    tracker.log(0, {"eval/accuracy": 0.25, "eval/pass@2": 0.5})
    tracker.log(1, {"reward/mean": 0.1, "filter/ema_std": float("nan")})
    tracker.close()
    events = EventAccumulator(str(tmp_path / "tensorboard")).Reload()
    logged = {}
    for key in events.Tags()["scalars"]:
        for e in events.Scalars(key):
            logged.setdefault(e.step, {})[key] = pytest.approx(e.value)
    assert logged == logged_numbers(tmp_path)


def test_wandb_and_mlflow_offline_log_what_metrics_jsonl_holds(tiny_dir, tmp_path, monkeypatch, capsys):
    needs("wandb")
    needs("mlflow")
    from mlflow.tracking import MlflowClient

    from rlpr.train.trainer import train

    store = f"file:{tmp_path / 'mlruns'}"
    for key, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_API_KEY": FAKE_KEY,
                       "WANDB_PROJECT": "rlpr-test", "MLFLOW_TRACKING_URI": store,
                       "MLFLOW_EXPERIMENT_NAME": "rlpr-test",
                       "MLFLOW_ALLOW_FILE_STORE": "true"}.items():  # MLflow >= 3.7 asks to opt in to file stores
        monkeypatch.setenv(key, value)
    cfg = tiny_cfg(tiny_dir, tmp_path, "tracked", "trainer.max_steps=2", "trainer.eval_samples=2",
                   "trainer.trackers=[wandb, mlflow]", "trainer.report=false")
    train(cfg)
    run = tmp_path / "tracked"
    expected = logged_numbers(run)
    assert sorted(expected) == [0, 1, 2] and "eval/pass@2" in expected[0] and "reward/mean" in expected[1]

    history = wandb_history(run)
    assert {step: {k: v for k, v in row.items() if not k.startswith("_")} for step, row in history.items()} == expected

    client = MlflowClient(tracking_uri=store)
    run_id = (run / "mlflow_run_id").read_text()
    mlflow_run = client.get_run(run_id)
    assert mlflow_run.info.run_name == "tracked" and mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["trainer.max_steps"] == "2"
    logged = {}
    for key in mlflow_run.data.metrics:
        for m in client.get_metric_history(run_id, key):
            logged.setdefault(m.step, {})[key] = m.value
    assert logged == {step: {mlflow_name(k): pytest.approx(v) for k, v in row.items()}
                      for step, row in expected.items()}

    out = capsys.readouterr()
    assert FAKE_KEY not in out.out + out.err


# -- a full disk (issue 29, items 3 and 11) ---------------------------------------------------------

class FullDisk:
    """`open` for rlpr.train.tracking whose files chosen by `fails(path)` write half of what they
    are given and then raise ENOSPC, as a full disk does."""

    def __init__(self, fails):
        self.fails, self.failed = fails, []

    def __call__(self, path, *args, **kwargs):
        import errno

        f = open(path, *args, **kwargs)
        if not self.fails(str(path)):
            return f
        self.failed.append(str(path))
        write = f.write

        def half(text):
            write(text[:len(text) // 2])
            f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

        f.write = half
        return f


def test_a_full_disk_never_leaves_a_cut_record_or_sample_file(tmp_path, monkeypatch, caplog):
    import json
    import logging

    from rlpr.train import tracking

    tracker = Tracker(tmp_path, trackers=[])
    tracker.log(1, {"reward/mean": 0.5})
    tracker.write_samples(1, [{"prompt": "p", "response": "r"}])
    full = FullDisk(lambda path: True)
    monkeypatch.setattr(tracking, "open", full, raising=False)
    monkeypatch.setattr(rlpr.errors, "open", full, raising=False)  # write_atomic's files
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        tracker.log(2, {"reward/mean": 0.25})  # no exception: a warning, the run goes on
        tracker.write_samples(2, [{"prompt": "p", "response": "r" * 1000}])
    assert len(full.failed) == 2
    assert "could not write" in caplog.text and "No space left on device" in caplog.text
    assert (tmp_path / "metrics.jsonl").read_text() == json.dumps({"step": 1, "reward/mean": 0.5}) + "\n"
    assert sorted(p.name for p in (tmp_path / "samples").iterdir()) == ["step_000001.jsonl"]
    monkeypatch.undo()  # space again: the log goes on where it was
    tracker.log(3, {"reward/mean": 0.75})
    assert [r["step"] for r in tracking.read_metrics(tmp_path)] == [1, 3]


def test_resume_drops_a_cut_last_line_and_names_any_other_bad_line(tmp_path, caplog):
    import logging

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n{"step": 3, "a"')
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        Tracker(tmp_path, resume_step=2, trackers=[]).close()
    assert "line 3 is cut short" in caplog.text
    assert path.read_text() == '{"step": 1, "a": 1}\n{"step": 2, "a": 2}\n'
    for text, problem in (('{"step": 1}\n[1, 2]\n', "line 2 is not a JSON record"),
                          ('{"step": 1}\n{"step": 2\n{"step": 3}\n', "line 2 is not a JSON record"),
                          ('{"step": "one"}\n', "line 1 has no integer step")):
        path.write_text(text)
        with pytest.raises(ConfigError, match=f"{path}: {problem}"):
            Tracker(tmp_path, resume_step=2, trackers=[])
        assert path.read_text() == text  # left as it was
