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

@pytest.mark.parametrize("poisoned", ["weight", "moment"])
def test_an_update_that_makes_the_weights_nan_is_never_saved(tiny_dir, tmp_path, monkeypatch, poisoned):
    """The optimizer step itself turns a trained weight (trainer.lr=1e308 did it to every one), or
    an AdamW moment, infinite, while the step's rewards, loss and gradient norm are finite: it ended
    rc 0 with a NaN adapter (one step), or named that NaN step_1 the last good checkpoint (three)."""
    from rlpr.train.finite import NonFiniteValue
    from rlpr.train.trainer import train

    step = torch.optim.AdamW.step

    def overflowing_step(self, *args, **kwargs):
        out = step(self, *args, **kwargs)
        first = self.param_groups[0]["params"][0]
        target = first if poisoned == "weight" else self.state[first]["exp_avg_sq"]
        with torch.no_grad():
            target.view(-1)[0] = float("inf")
        return out

    monkeypatch.setattr(torch.optim.AdamW, "step", overflowing_step)
    cfg = tiny_cfg(tiny_dir, tmp_path, "lr", "trainer.max_steps=3", "trainer.save_every=1", *SMALL)
    with pytest.raises(NonFiniteValue) as e:
        train(cfg)
    message = str(e.value)
    assert len(message.splitlines()) == 1
    assert message.startswith("step 1, update phase: the optimizer step made the trainable weights") and \
        "no checkpoint was saved" in message, message
    assert ("optimizer state" in message) == (poisoned == "moment")
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

def signal_in_step_1(monkeypatch, number: int) -> None:
    """Training sends itself `number` at the start of step 1 (what a user's signal does mid-run)."""
    from rlpr.train.trainer import Trainer

    original = Trainer.train_step

    def signalled_in_step_1(self, step):
        if step == 1:
            os.kill(os.getpid(), number)
        return original(self, step)

    monkeypatch.setattr(Trainer, "train_step", signalled_in_step_1)


@pytest.mark.parametrize("name", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_every_stop_signal_finishes_the_step_and_checkpoints(tiny_dir, tmp_path, monkeypatch, capsys, name):
    """SIGHUP (a closed terminal, a dropped ssh session) ended a run with 130 and no checkpoint. A
    stand-in handler catches a signal training does not handle (the test fails instead of dying)."""
    from rlpr.errors import STOP_SIGNALS
    from rlpr.train.trainer import _train

    assert name in STOP_SIGNALS
    number = getattr(signal, name)
    signal_in_step_1(monkeypatch, number)

    class Unhandled(Exception):
        pass

    def unhandled(signum, frame):
        raise Unhandled(signal.Signals(signum).name)

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


@pytest.mark.parametrize("name", ["SIGHUP", "SIGINT"])
def test_a_stop_signal_the_process_was_started_ignoring_stays_ignored(tiny_dir, tmp_path, monkeypatch, name):
    """`nohup rlpr train` (SIGHUP ignored) and a script's background job (SIGINT ignored) ask the run
    to outlive a closed terminal or the terminal's Ctrl-C; rlpr's handlers replaced SIG_IGN, so a
    hang-up stopped a nohup'd run after its step. Now the run trains on to its last step."""
    from rlpr.cli.main import interrupt_on_signals
    from rlpr.train.trainer import _train

    number = getattr(signal, name)
    signal_in_step_1(monkeypatch, number)
    previous = signal.signal(number, signal.SIG_IGN)
    try:
        interrupt_on_signals()  # what rlpr's main installs first
        assert signal.getsignal(number) is signal.SIG_IGN
        summary = _train(tiny_cfg(tiny_dir, tmp_path, "nohup", "trainer.max_steps=3", *SMALL), None)
    finally:
        signal.signal(number, previous)
    assert not summary.get("interrupted") and summary["step"] == 3


# -- S4-S6: the base fingerprint covers the tokenizer, every reader checks it, and it fails closed -----

@pytest.fixture
def lora_run(tiny_model, tokenizer, tmp_path):
    """A one-step LoRA run on a base folder of its own (which the test then changes)."""
    from rlpr.train.trainer import train

    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    train(tiny_cfg(str(base), tmp_path, "run", "trainer.max_steps=1", *SMALL))
    return base, tmp_path / "run"


def _change_tokenizer(base: Path) -> None:
    """A normalizer in tokenizer.json: the same weights read other ids for the same text."""
    import json

    spec = json.loads((base / "tokenizer.json").read_text())
    spec["normalizer"] = {"type": "Lowercase"}
    (base / "tokenizer.json").write_text(json.dumps(spec))


def test_a_changed_tokenizer_is_a_changed_base_for_every_reader(lora_run, tmp_path, capsys):
    """The fingerprint covered config.json and the weights: a resume on a changed tokenizer went on
    in silence (the adapter, score A's cache and the prompts were built with the old ids)."""
    from rlpr.cli.main import main
    from rlpr.model.fingerprint import check_base

    base, run = lora_run
    (base / "README.md").write_text("notes that change nothing\n")
    check_base(run, str(base), "--resume")  # documentation is not the model
    _change_tokenizer(base)
    capsys.readouterr()
    for args in (["train", "--resume", str(run), "trainer.max_steps=2"],
                 ["eval", "--checkpoint", str(run), "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                  "--output", str(tmp_path / "eval")],
                 ["export", str(run), "-o", str(tmp_path / "export")]):
        assert main(args) == 2, args
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and f"the base model {base} changed since the run started (tokenizer.json" in lines[0]
    assert not (tmp_path / "eval").exists() and not (tmp_path / "export").exists()


def test_the_chat_template_is_part_of_the_base(lora_run):
    import json

    from rlpr.errors import ConfigError
    from rlpr.model.fingerprint import check_base

    base, run = lora_run
    config = json.loads((base / "tokenizer_config.json").read_text())
    config["chat_template"] = "{{ messages[0]['content'] }}"
    (base / "tokenizer_config.json").write_text(json.dumps(config))
    (base / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(ConfigError, match=r"changed since the run started \((chat_template\.jinja|tokenizer_config)"):
        check_base(run, str(base), "--resume")


def test_a_run_recorded_before_the_tokenizer_was_covered_still_resumes(lora_run):
    """A version-1 base_model.yaml (config.json and the weights only) is compared on what it holds."""
    import yaml

    from rlpr.errors import ConfigError
    from rlpr.model.fingerprint import FINGERPRINT_FILE, WEIGHT_SUFFIXES, check_base

    base, run = lora_run
    saved = yaml.safe_load((run / FINGERPRINT_FILE).read_text())
    old = {n: v for n, v in saved["files"].items() if n == "config.json" or n.endswith(WEIGHT_SUFFIXES)}
    (run / FINGERPRINT_FILE).write_text(yaml.safe_dump({"model": saved["model"], "files": old, "sha256": "x"}))
    check_base(run, str(base), "--resume")  # the tokenizer was not recorded: not a change
    (base / "model.safetensors").write_bytes((base / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(ConfigError, match=r"\(model\.safetensors"):
        check_base(run, str(base), "--resume")


def test_the_python_api_checks_the_base_as_the_cli_does(lora_run, caplog):
    """rlpr.evaluate and rlpr.score with checkpoint= returned results on a changed base."""
    from rlpr.errors import ConfigError

    base, run = lora_run
    _change_tokenizer(base)
    cfg = rlpr.config("demo", [f"model.path={base}", "rollout.max_new_tokens=2"])
    out = run.parent / "api-eval"
    with pytest.raises(ConfigError, match="changed since the run started"):
        rlpr.evaluate(cfg, [DATA], checkpoint=run, limit=1, output_dir=out)
    with pytest.raises(ConfigError, match="changed since the run started"):
        rlpr.score(cfg, ["What is 2+2?"], ["4"], ["4"], checkpoint=run)
    assert not out.exists()
    with caplog.at_level("WARNING", logger="rlpr"):
        rows = rlpr.score(cfg, ["What is 2+2?"], ["4"], ["4"], checkpoint=run, accept_base_change=True)
    assert len(rows) == 1 and caplog.text.count("going on with the base as it is") == 1


@pytest.mark.parametrize("damage", ["empty", "cut", "binary", "not a mapping"])
def test_a_damaged_base_record_fails_closed(lora_run, tmp_path, capsys, damage):
    """An empty, cut or unreadable base_model.yaml turned the check off in silence."""
    from rlpr.cli.main import main
    from rlpr.model.fingerprint import FINGERPRINT_FILE

    base, run = lora_run
    record = run / FINGERPRINT_FILE
    text = record.read_bytes()
    record.write_bytes({"empty": b"", "cut": text[:len(text) // 3], "binary": b"\xff\xfe\x00garbage",
                        "not a mapping": b"- 1\n- 2\n"}[damage])
    capsys.readouterr()
    for args in (["train", "--resume", str(run), "trainer.max_steps=2"],
                 ["eval", "--checkpoint", str(run), "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                  "--output", str(tmp_path / "eval")]):
        assert main(args) == 2, args
        lines = error_lines(capsys.readouterr().err)
        assert len(lines) == 1 and f"{record}: " in lines[0] and "cannot tell whether the base model" in lines[0], \
            lines
        assert "--accept-base-change" in lines[0]
    assert main(["eval", "--checkpoint", str(run), "--data", DATA, "--limit", "1", "--max-new-tokens", "2",
                 "--output", str(tmp_path / "eval"), "--accept-base-change"]) == 0


def test_the_base_record_is_written_whole_or_not_at_all(tiny_dir, tmp_path, monkeypatch):
    from rlpr.errors import OutputError
    from rlpr.model import fingerprint

    def cut_short(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("rlpr.errors.os.replace", cut_short)
    with pytest.raises(OutputError, match="base_model.yaml: No space left on device"):
        fingerprint.write_fingerprint(tmp_path, tiny_dir)
    assert list(tmp_path.iterdir()) == []


# -- S11: a checkpoint its training run prunes while it is read ----------------------------------------

def test_a_checkpoint_pruned_while_it_is_read_is_taken_again_from_the_run(tiny_dir, tmp_path, monkeypatch, caplog,
                                                                          capsys):
    """`export` or `eval` during training failed with "not a LoRA adapter config that fits the model"
    when the trainer saved a newer checkpoint and pruned the one they had picked."""
    import shutil

    import rlpr.model.fingerprint as fingerprint
    from rlpr.cli.main import main
    from rlpr.model.loading import load_policy
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=1", *SMALL))
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    original = fingerprint.check_checkpoint_base

    def trainer_saves_and_prunes(ckpt, *args):
        """As the training run does between the reader's choice and its read: a newer checkpoint, then
        the chosen one removed (keep_last=1)."""
        if ckpt.name == "step_1" and ckpt.is_dir():
            n = 1 + max(int(p.name.removeprefix("step_")) for p in ckpts.glob("step_*"))
            shutil.copytree(ckpt, ckpts / f".tmp-step_{n}")
            os.replace(ckpts / f".tmp-step_{n}", ckpts / f"step_{n}")
            os.replace(ckpt, ckpts / ".trash-step_1")
            shutil.rmtree(ckpts / ".trash-step_1")
        return original(ckpt, *args)

    def back_to_step_1():
        for p in ckpts.glob("step_*"):
            if p.name != "step_1":
                os.replace(p, ckpts / "step_1") if not (ckpts / "step_1").exists() else shutil.rmtree(p)

    monkeypatch.setattr(fingerprint, "check_checkpoint_base", trainer_saves_and_prunes)
    with caplog.at_level("WARNING", logger="rlpr"):
        model, _ = load_policy(tiny_dir, run)
    assert "step_1 was removed while it was being read (its run is training and pruned it)" in caplog.text
    assert [p.name for p in ckpts.glob("step_*")] == ["step_2"]
    back_to_step_1()
    assert main(["export", str(run), "-o", str(tmp_path / "export")]) == 0
    assert (tmp_path / "export" / "model.safetensors").is_file()
    back_to_step_1()
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(ckpts / "step_1"), "--data", DATA, "--limit", "1",
                 "--max-new-tokens", "2", "--output", str(tmp_path / "eval")]) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "step_1: removed while it was being read" in lines[0] and \
        "name a newer checkpoint, or the run directory" in lines[0], lines


# -- S16: every writer's killed temporaries are removed by the next start ------------------------------

def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _owner() -> str:
    import socket

    return "".join(c if c.isalnum() or c == "_" else "_" for c in socket.gethostname()) + f"-{_dead_pid()}"


def test_a_killed_convert_or_write_leaves_nothing_after_the_next_one(tmp_path, caplog):
    """A killed `data convert` left `.out.parquet.XXXX.tmp` that nothing removed; outputs written
    whole (results, samples, summaries) left `.NAME.tmp` until that same file was written again."""
    import json

    from rlpr.data.convert import convert_file
    from rlpr.errors import write_atomic

    src = tmp_path / "flat.jsonl"
    src.write_text(json.dumps({"question": "q0", "answer": "a"}) + "\n")
    owner = _owner()
    killed = tmp_path / f".out.parquet.tmp-{owner}-k2j3"
    killed.write_bytes(b"PAR1 half")
    foreign = tmp_path / ".out.parquet.tmp-notes"  # no rlpr owner in the name: another program's
    foreign.write_text("keep")
    with caplog.at_level("WARNING", logger="rlpr"):
        convert_file("jsonl", src, tmp_path / "out.parquet")
    assert not killed.exists() and foreign.exists() and f"removed {killed}" in caplog.text
    half = tmp_path / f".results.json.tmp-{owner}-w"
    half.write_text("{")
    write_atomic(tmp_path / "results.json", "{}\n")
    assert not half.exists() and (tmp_path / "results.json").read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [foreign.name]


def test_an_export_removes_every_killed_export_s_leftovers_in_its_folder(tiny_dir, tmp_path, caplog):
    """Only an export to the same target removed them: a killed export to `a` stayed beside `b`."""
    from rlpr.cli.main import main
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "run", "trainer.max_steps=1", *SMALL))
    out = tmp_path / "out"
    out.mkdir()
    owner = _owner()
    aside = out / f".a.old-{owner}-x1"  # --overwrite of `a` killed between moving it aside and renaming
    (aside / "a").mkdir(parents=True)
    (aside / "a" / "README.md").write_text("the earlier export\n")
    partial = out / f".a.tmp-{owner}-y2"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    foreign = out / ".a.tmp-backup"
    foreign.mkdir()
    with caplog.at_level("WARNING", logger="rlpr"):
        assert main(["export", str(tmp_path / "run"), "-o", str(out / "b")]) == 0
    assert (out / "a" / "README.md").read_text() == "the earlier export\n"  # put back
    assert not aside.exists() and not partial.exists() and foreign.exists()
    assert f"put back {out / 'a'}" in caplog.text and f"removed {partial}" in caplog.text
