"""Bounds and validation (issue 43, item 7): `rlpr eval --samples` bounded by memory and Ctrl-C in
eval one line; every seconds flag, thread count and plan size finite and bounded; rollout.stop
items validated; override values for string keys kept as typed; an optimizer state of the wrong
shape falls back to the previous checkpoint; eval takes a run's own sample count."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from rlpr.cli.main import main
from rlpr.config import load_config
from rlpr.errors import ConfigError

from helpers import at_a_terminal, tiny_cfg

pytestmark = pytest.mark.integration

DATA = str(Path(__file__).resolve().parents[1] / "examples" / "my_questions_val.jsonl")


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("rlpr: error:") and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def test_eval_samples_beyond_memory_are_one_line_before_the_model_loads(tiny_dir, tmp_path, capsys, no_model):
    """--samples 1000000000 used to build a list of a billion rows: a MemoryError or the OOM killer."""
    from rlpr.evaluation.benchmark import Benchmark, check_fits

    assert main(["eval", "--model", tiny_dir, "--data", DATA, "--samples", "1000000000", "--output",
                 str(tmp_path / "e")]) == 2
    one_line_error(capsys, "--samples 1000000000", "GiB of responses in memory", "lower --samples")
    assert not (tmp_path / "e").exists()
    bench = [Benchmark("b", [None] * 100, 8)]
    check_fits(bench, 1024, available=1 << 30)  # 800 responses of 1024 tokens: about 40 MiB
    with pytest.raises(ValueError, match="more than half of the 0.1 GiB available"):
        check_fits(bench, 1024, available=1 << 26)


@pytest.mark.parametrize("argv, message", [
    (["serve", "--port", "0", "--read-timeout", "1e308"], "--read-timeout must be in (0, 1e+06] seconds"),
    (["serve", "--port", "0", "--read-timeout", "nan"], "--read-timeout"),
    (["serve", "--port", "0", "--max-connections", "100000000"], "--max-connections must be in 1..65536"),
    (["serve", "--port", "0", "--fault-mode", "slow", "--fault-delay", "1e308"], "--fault-delay must be in"),
    (["eval", "--data", DATA, "--output", "OUT", "--judge-url", "http://127.0.0.1:9", "--judge-model", "m",
      "--judge-timeout", "1e308"], "--judge-timeout in (0, 1e+06]"),
    (["eval", "--data", DATA, "--output", "OUT", "--judge-url", "http://127.0.0.1:9", "--judge-model", "m",
      "--judge-backoff", "nan"], "--judge-backoff"),
    (["eval", "--data", DATA, "--output", "OUT", "--judge-url", "http://127.0.0.1:9", "--judge-model", "m",
      "--judge-concurrency", "1000000"], "--judge-concurrency in 1..1024"),
    (["reward-quality", "--input", DATA, "--output", "OUT", "--bootstrap", "10000000000"], "--bootstrap"),
])
def test_every_seconds_and_thread_flag_is_bounded(tiny_dir, tmp_path, capsys, no_model, argv, message):
    """1e308 seconds overflowed a socket timeout or a sleep (a traceback, after the model loaded);
    NaN passed `<= 0`; a million judge threads or connections, ten billion resamples were accepted."""
    argv = [a.replace("OUT", str(tmp_path / "out")) for a in argv]
    assert main([*argv, "--model", tiny_dir]) == 2
    one_line_error(capsys, message)


@pytest.mark.parametrize("override, message", [
    ("rollout.stop=[null]", "rollout.stop: item 0 is null"),
    ('rollout.stop=["\\n", ""]', "rollout.stop: item 1 is empty"),
    ('rollout.stop=["\\ud800"]', "rollout.stop: item 0 holds a lone surrogate"),
    ('trainer.name="\\udfff"', "trainer.name: holds a lone surrogate"),
    ("model.lora_target_modules=[q_proj, null]", "model.lora_target_modules: item 1 is null"),
])
def test_stop_strings_and_every_text_are_validated(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config("demo", [override])


def test_eval_refuses_bad_stop_strings_in_one_line(tiny_dir, tmp_path, capsys, no_model):
    assert main(["eval", "--model", tiny_dir, "--data", DATA, "--output", str(tmp_path / "e"),
                 "rollout.stop=[null]"]) == 2
    one_line_error(capsys, "rollout.stop: item 0 is null")


@pytest.mark.parametrize("typed, kept", [("2024-01-01", "2024-01-01"), ("null", "null"), ("007", "007"),
                                         ("1.50", "1.50"), ("yes", "yes"), ('"quoted"', "quoted"), ("", "")])
def test_override_values_of_string_keys_stay_as_typed(typed, kept, capsys):
    """YAML read `trainer.name=2024-01-01` as a date (refused), `=null` as an empty string (a run
    named by the clock), `=007` as 7; a string key now keeps the text as typed (quote it for YAML)."""
    assert load_config("demo", [f"trainer.name={typed}"]).trainer.name == kept
    assert main(["config", f"trainer.name={typed}"]) == 0
    import yaml

    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["name"] == kept
    assert load_config("demo", ["trainer.max_steps=7"]).trainer.max_steps == 7  # other keys: YAML as before


# -- a run with two checkpoints: the optimizer's state, eval's default sample count ------------------

@pytest.fixture(scope="module")
def run(tiny_dir, tmp_path_factory):
    from rlpr.train.trainer import train

    out = tmp_path_factory.mktemp("bounds-run")
    train(tiny_cfg(tiny_dir, out, "run", "trainer.max_steps=2", "trainer.save_every=1", "data.val=",
                   "trainer.eval_samples=3", "trainer.report=false", "trainer.keep_last=3",
                   "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "rollout.max_new_tokens=4"))
    return out / "run"


def test_an_optimizer_state_of_the_wrong_shape_falls_back_to_the_previous_checkpoint(run, tmp_path, caplog):
    """torch's load_state_dict checks the counts only: a moment of the wrong shape loaded and the
    first optimizer step after the resume failed with a traceback."""
    import logging

    from rlpr.train.checkpoint import list_checkpoints, resume_config
    from rlpr.train.trainer import train

    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    state_file = copy / "checkpoints" / "step_2" / "trainer_state.pt"
    state = torch.load(state_file, weights_only=True)
    first = next(iter(state["optimizer"]["state"]))
    state["optimizer"]["state"][first]["exp_avg"] = torch.zeros(3, 5)
    torch.save(state, state_file)
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        summary = train(resume_config(copy, ["trainer.max_steps=3"]), resume=str(copy))
    assert summary["step"] == 3
    assert "skipped the corrupt checkpoint" in caplog.text and "has shape (3, 5)" in caplog.text
    assert "resumed from" in caplog.text
    assert [p.name for p in list_checkpoints(copy)] == ["step_1", "step_2", "step_3"]  # step_2 again, from step_1
    assert (copy / "checkpoints" / "corrupt-step_2").is_dir()


def test_eval_of_a_run_takes_its_own_sample_count(run, tmp_path, capsys):
    assert main(["eval", "--checkpoint", str(run), "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                 "--output", str(tmp_path / "e")]) == 0
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert results["my_questions_val"]["samples_per_question"] == 3
    assert "samples: 3 per question, the run's trainer.eval_samples" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(run), "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                 "--samples", "1", "--output", str(tmp_path / "e1")]) == 0
    assert json.loads((tmp_path / "e1" / "results.json").read_text())["my_questions_val"]["samples_per_question"] == 1


EVAL_WAITING = """
import sys, time
from pathlib import Path
import rlpr.evaluation.benchmark as benchmark

def slow(*a, **k):
    Path(sys.argv[1]).write_text("sampling")
    for _ in range(600):  # slices: a signal another thread took runs its handler between them
        time.sleep(0.1)

benchmark.sample_and_grade = slow
from rlpr.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_ctrl_c_or_sigterm_in_eval_is_one_line(tiny_dir, tmp_path, signame):
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", EVAL_WAITING, str(ready), "eval", "--model", tiny_dir, "--data",
                             DATA, "--output", str(tmp_path / "e")], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=at_a_terminal)
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "eval never started sampling"
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == f"rlpr: eval interrupted ({signame})" and "Traceback" not in err, err
