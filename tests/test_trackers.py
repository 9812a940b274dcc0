"""The trackers registry (`trainer.trackers`): jsonl always on, tensorboard (and its older switch
`trainer.tensorboard`), wandb and mlflow offline, with the logged metrics read back equal to
metrics.jsonl; a tracker whose package is missing is a one-line ConfigError."""

import importlib.util

import pytest

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
