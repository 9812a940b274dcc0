"""The fifth hardening pass (issue 60) on runs and checkpoints: a non-finite update is never saved
nor loaded (S1), SIGHUP checkpoints like SIGINT/SIGTERM (S3), the base fingerprint covers the
tokenizer and fails closed (S4, S6), every reader of a checkpoint checks its base (S5). Tiny model,
one or two steps."""

import os
import signal
from pathlib import Path

import pytest
import torch

import rlpr

from rlpr.train.checkpoint import list_checkpoints

from helpers import tiny_cfg

pytestmark = pytest.mark.integration

SMALL = ("rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2",
         "rollout.max_new_tokens=4", "data.val=", "trainer.report=false")
DATA = str(Path(__file__).resolve().parents[1] / "examples" / "my_questions_val.jsonl")


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err, err
    return [line for line in err.splitlines() if line.startswith("rlpr: error")]


# -- S1: a NaN made by the update itself is never saved, and never loaded -----------------------------

def test_an_update_that_makes_the_weights_nan_is_never_saved(tiny_dir, tmp_path):
    """trainer.lr=1e308: the step's rewards, loss and gradient norm are finite, the AdamW step makes
    every trained weight infinite. It ended rc 0 with a NaN adapter (one step), or named that NaN
    step_1 as the last good checkpoint (three)."""
    from rlpr.train.finite import NonFiniteValue
    from rlpr.train.trainer import train

    cfg = tiny_cfg(tiny_dir, tmp_path, "lr", "trainer.max_steps=3", "trainer.save_every=1", "trainer.lr=1e308",
                   *SMALL)
    with pytest.raises(NonFiniteValue) as e:
        train(cfg)
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("step 1, update phase: the optimizer step made the trainable weights") and \
        "no checkpoint was saved" in message, message
    assert not list_checkpoints(tmp_path / "lr")


def test_a_checkpoint_is_never_written_with_a_nonfinite_weight_or_optimizer_state(tiny_model, tokenizer, tmp_path):
    """`save_checkpoint` itself refuses (whatever its caller checked): the weights, and the AdamW
    moments in the trainer state."""
    from rlpr.train.checkpoint import save_checkpoint
    from rlpr.train.finite import NonFiniteValue

    weights = {n: p.detach().clone() for n, p in tiny_model.named_parameters()}
    state = {"step": 1, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}}}}
    nan_weights = {**weights, "model.norm.weight": torch.full_like(weights["model.norm.weight"], float("nan"))}
    nan_state = {**state, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3),
                                                      "exp_avg_sq": torch.tensor([1.0, float("inf"), 0.0])}}}}
    for w, s, named in ((nan_weights, state, "model.norm.weight"), (weights, nan_state, "optimizer.state.0.exp_avg_sq")):
        with pytest.raises(NonFiniteValue) as e:
            save_checkpoint(tmp_path, 1, tiny_model, tokenizer, s, keep_last=2, weights=w)
        assert "checkpoint step_1 holds NaN or infinite values (" + named in str(e.value), str(e.value)
        assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


def _poison(ckpt: Path, where: str) -> None:
    """A NaN in a saved checkpoint's adapter weights, or in its AdamW state (an older rlpr saved them)."""
    from safetensors.torch import load_file, save_file

    if where == "weights":
        path = ckpt / "adapter" / "adapter_model.safetensors"
        tensors = load_file(str(path))
        first = sorted(tensors)[0]
        tensors[first] = torch.full_like(tensors[first], float("nan"))
        save_file(tensors, str(path))
        return
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    moments = next(iter(state["optimizer"]["state"].values()))
    moments["exp_avg"] = torch.full_like(moments["exp_avg"], float("nan"))
    torch.save(state, ckpt / "trainer_state.pt")


@pytest.mark.parametrize("where", ["weights", "optimizer"])
def test_eval_serve_score_and_export_refuse_a_nonfinite_checkpoint(tiny_dir, tmp_path, capsys, where):
    """Every command that reads a checkpoint: one line naming the file (a run's newest NaN one is
    skipped for the previous with a warning, as a corrupt one is), never a NaN model scored or written."""
    from rlpr.cli.main import main
    from rlpr.model.loading import load_policy
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=2", "trainer.save_every=1", *SMALL))
    run = tmp_path / "run"
    _poison(run / "checkpoints" / "step_2", where)
    bad = "adapter_model.safetensors" if where == "weights" else "trainer_state.pt"
    capsys.readouterr()
    step = str(run / "checkpoints" / "step_2")
    for args in (["eval", "--checkpoint", step, "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                  "--output", str(tmp_path / "eval")],
                 ["export", str(run), "--step", "2", "-o", str(tmp_path / "export")]):
        assert main(args) == 2, args
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and bad in lines[0] and "holds NaN or infinite values" in lines[0], lines
    assert not (tmp_path / "eval").exists() and not (tmp_path / "export").exists()
    # serve and the Python API load through load_policy: the run's newest good checkpoint, with a warning
    model, _ = load_policy(tiny_dir, run)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    cfg = tiny_cfg(tiny_dir, tmp_path, "x")
    with pytest.raises(Exception, match="holds NaN or infinite values"):
        rlpr.score(cfg, ["What is 2+2?"], ["4"], ["4"], checkpoint=step)


def test_a_resume_skips_a_nonfinite_checkpoint_for_the_previous_one(tiny_dir, tmp_path, caplog):
    from rlpr.train.trainer import train

    cfg = tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=2", "trainer.save_every=1", *SMALL)
    train(cfg)
    run = tmp_path / "run"
    _poison(run / "checkpoints" / "step_2", "optimizer")
    with caplog.at_level("WARNING", logger="rlpr"):
        summary = train(cfg, resume=str(run))
    assert summary["step"] == 2
    assert "skipped the corrupt checkpoint" in caplog.text and "holds NaN or infinite values" in caplog.text
    assert (run / "checkpoints" / "corrupt-step_2").is_dir()


# -- S3: every stop signal of a user's session checkpoints -------------------------------------------

@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_every_stop_signal_finishes_the_step_and_checkpoints(tiny_dir, tmp_path, monkeypatch, capsys, name):
    """SIGHUP (a closed terminal, a dropped ssh session) ended a run with 130 and no checkpoint. A
    stand-in handler catches a signal training does not handle (the test fails instead of dying)."""
    from rlpr.errors import STOP_SIGNALS
    from rlpr.train.trainer import Trainer, _train

    assert name in STOP_SIGNALS
    number = getattr(signal, name)
    original = Trainer.train_step

    def signalled_in_step_1(self, step):
        if step == 1:
            os.kill(os.getpid(), number)
        return original(self, step)

    class Unhandled(Exception):
        pass

    def unhandled(signum, frame):
        raise Unhandled(signal.Signals(signum).name)

    monkeypatch.setattr(Trainer, "train_step", signalled_in_step_1)
    previous = signal.signal(number, unhandled)
    try:
        summary = _train(tiny_cfg(tiny_dir, tmp_path, "a run", "trainer.max_steps=5", *SMALL), None)
    finally:
        signal.signal(number, previous)
    run = tmp_path / "a run"
    assert summary.get("interrupted") and summary["step"] == 1
    assert [c.name for c in list_checkpoints(run)] == ["step_1"]
    err = capsys.readouterr().err
    assert f"{name}: finishing step 1" in err and f"rlpr train --resume '{run}'" in err
    assert f"run directory: '{run}'" in err  # quoted to paste, as the resume line (S16)
