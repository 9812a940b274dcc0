"""Training runs and checkpoints under a careless user and a full disk (issue 29, items 3, 4, 9,
10, 11, 20 and 22): a cut metrics line, a signal during the final evaluation, a data file changed
under a run, corrupt checkpoints, a full disk outside the checkpoint, a disk too small for any
checkpoint, and more prompts per step than the data holds. Tiny model, few steps."""

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import rlpr.errors
import torch

from rlpr.errors import ConfigError
from rlpr.train import tracking
from rlpr.train.checkpoint import STATE_FILE, latest_checkpoint, list_checkpoints, load_state, resume_config
from rlpr.train.tracking import read_metrics
from rlpr.train.trainer import train

from helpers import tiny_cfg
from test_trackers import FullDisk

pytestmark = pytest.mark.integration


def resume(run, steps):
    return train(resume_config(run, [f"trainer.max_steps={steps}"]), resume=str(run))


def one_line(message):
    assert len(str(message).strip().splitlines()) == 1, message
    return str(message)


# -- 22: prompts_per_step larger than the data ---------------------------------------------------

def test_more_prompts_per_step_than_the_data_is_refused_before_the_model_loads(tiny_dir, tmp_path, monkeypatch):
    import rlpr.model.loading

    def no_model(*a, **k):
        raise AssertionError("the model loaded before the data was checked")

    monkeypatch.setattr(rlpr.model.loading, "load_model", no_model)
    cfg = tiny_cfg(tiny_dir, tmp_path, "small", "data.demo_train_size=6", "trainer.prompts_per_step=8",
                   "data.val=")
    message = r"trainer.prompts_per_step \(8\) exceeds the 6 usable training prompts in data.train"
    with pytest.raises(ConfigError, match=message) as e:
        train(cfg)
    one_line(e.value)
    assert not (tmp_path / "small").exists()  # no config.yaml, no run directory


# -- 3: a cut metrics line -----------------------------------------------------------------------

def test_a_cut_metrics_line_is_dropped_on_resume_and_other_bad_lines_are_named(tiny_dir, tmp_path, caplog):
    run = tmp_path / "cut"
    train(tiny_cfg(tiny_dir, tmp_path, "cut", "trainer.max_steps=1", "data.val="))
    metrics = run / "metrics.jsonl"
    with open(metrics, "a") as f:  # what a full disk leaves: a record cut before its end
        f.write('{"step": 2, "reward/mean": 0.1, "reward/sc')
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        resume(run, 2)
    assert "metrics.jsonl: line 2 is cut short" in caplog.text
    assert [m["step"] for m in read_metrics(run)] == [1, 2]
    assert sorted(p.name for p in run.glob("resume_*.yaml")) == ["resume_1.yaml"]
    # anything else is not guessed at: one line naming the file and the line, and nothing is added
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text(lines[0] + '{"step": 2 "reward/mean": 0.1}\n')
    with pytest.raises(ConfigError, match=r"metrics.jsonl: line 2 is not a JSON record") as e:
        resume(run, 3)
    assert str(metrics) in one_line(e.value)
    assert sorted(p.name for p in run.glob("resume_*.yaml")) == ["resume_1.yaml"]
    assert metrics.read_text() == lines[0] + '{"step": 2 "reward/mean": 0.1}\n'  # left for the user to see


# -- 4: a signal during the final evaluation -----------------------------------------------------

def test_sigterm_during_the_final_evaluation_keeps_the_final_checkpoint(tiny_dir, tmp_path):
    run = tmp_path / "term"
    script = textwrap.dedent(f"""
        import os, signal, sys, time
        from rlpr.cli.main import main
        from rlpr.train.trainer import Trainer

        real = Trainer.evaluate

        def evaluate(self):
            if self.step == self.cfg.trainer.max_steps:  # the final evaluation: stopped midway
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(2)
            return real(self)

        Trainer.evaluate = evaluate
        sys.exit(main(["train", "model.path={tiny_dir}", "trainer.output_dir={tmp_path}", "trainer.name=term",
                       "trainer.max_steps=2", "rollout.max_new_tokens=4", "rollout.responses_per_prompt=2",
                       "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "data.demo_train_size=8",
                       "data.demo_val_size=2", "trainer.eval_before=false", "trainer.tensorboard=false",
                       "trainer.progress=false", "trainer.report=false", "model.threads=1"]))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "SIGTERM during the final evaluation" in result.stderr
    assert load_state(latest_checkpoint(run))["step"] == 2  # every step is kept
    assert [m["step"] for m in read_metrics(run)] == [1, 2]


# -- 9: a data file changed under a run ----------------------------------------------------------

def test_resume_refuses_a_data_file_whose_rows_changed(tiny_dir, tmp_path):
    data = tmp_path / "qa.jsonl"
    rows = [{"question": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "data"
    train(tiny_cfg(tiny_dir, tmp_path, "data", "trainer.max_steps=1", f"data.train={data}", "data.val="))
    original = data.read_text()
    rows[3]["answer"] = "7"  # same path, same size, different rows
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="data.train changed since the run started") as e:
        resume(run, 2)
    assert str(data) in one_line(e.value)
    assert not list(run.glob("resume_*.yaml"))
    # the same rows written again (a new mtime) are the same data: the resume goes on
    data.write_text(original)
    os.utime(data, (1, 1))
    resume(run, 2)
    assert load_state(latest_checkpoint(run))["step"] == 2


# -- 10: corrupt checkpoints ---------------------------------------------------------------------

def test_a_corrupt_checkpoint_falls_back_to_the_previous_complete_one(tiny_dir, tmp_path, caplog):
    from rlpr.model.loading import load_model
    from rlpr.train.checkpoint import load_weights
    from rlpr.train.setup import build_policy

    run = tmp_path / "ck"
    cfg = tiny_cfg(tiny_dir, tmp_path, "ck", "trainer.max_steps=2", "trainer.save_every=1", "data.val=")
    train(cfg)
    first, second = list_checkpoints(run)
    # each kind of corruption is one line naming the file
    weights = second / "adapter" / "adapter_model.safetensors"
    good_weights = weights.read_bytes()
    weights.write_bytes(good_weights[:len(good_weights) // 2])  # truncated
    policy = build_policy(cfg, load_model(tiny_dir)[0])
    with pytest.raises(ConfigError, match="adapter_model.safetensors: unreadable weights") as e:
        load_weights(policy, second)
    one_line(e.value)
    state_file = second / STATE_FILE
    good_state = state_file.read_bytes()
    for bad in (b"", good_state[:len(good_state) // 2]):
        state_file.write_bytes(bad)
        with pytest.raises(ConfigError, match=STATE_FILE) as e:
            load_state(second)
        one_line(e.value)
    torch.save({"step": 2}, state_file)  # readable, but not a trainer state
    with pytest.raises(ConfigError, match="trainer_state.pt: not an rlpr trainer state .missing optimizer") as e:
        load_state(second, resumable=True)
    one_line(e.value)
    # --resume skips the corrupt newest checkpoint with a warning and goes on from the previous one
    weights.write_bytes(good_weights[:len(good_weights) // 2])
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        resume(run, 3)
    assert f"skipped the corrupt checkpoint {second}" in caplog.text
    assert f"resumed from {first}" in caplog.text
    assert [p.name for p in list_checkpoints(run)] == ["step_2", "step_3"]  # step_2 trained again
    assert (run / "checkpoints" / "corrupt-step_2" / STATE_FILE).is_file()  # set aside, not deleted
    assert [m["step"] for m in read_metrics(run)] == [1, 2, 3]
    assert yaml_load(run / "resume_1.yaml")["resumed_at_step"] == 1


def test_eval_and_export_skip_a_corrupt_newest_checkpoint(tiny_dir, tmp_path, caplog):
    """`rlpr eval --checkpoint RUN`, serve, score and export (load_policy / usable_checkpoint) use the
    newest checkpoint that reads back, like --resume; a corrupt step dir named explicitly, or a run
    with none readable, is one line."""
    from rlpr.errors import ModelError
    from rlpr.model.export import choose_checkpoint
    from rlpr.model.loading import load_policy, load_tokenizer, tiny_llama, usable_checkpoint

    run = tmp_path / "ev"
    train(tiny_cfg(tiny_dir, tmp_path, "ev", "trainer.max_steps=2", "trainer.save_every=1", "data.val="))
    first, second = list_checkpoints(run)
    weights = second / "adapter" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])  # truncated by a full disk or a copy cut short
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        assert usable_checkpoint(run) == first
        model, _ = load_policy(tiny_dir, run)
        assert choose_checkpoint(run, None) == first
    assert f"skipped a corrupt checkpoint ({weights}: unreadable weights" in caplog.text
    assert f"using {first}" in caplog.text
    assert model(torch.tensor([[1, 2, 3]])).logits.isfinite().all()
    with pytest.raises(ConfigError, match="adapter_model.safetensors: unreadable weights") as e:
        load_policy(tiny_dir, second)  # the step named: no silent substitute
    one_line(e.value)
    config = first / "adapter" / "adapter_config.json"
    good = config.read_text()
    # an adapter config peft cannot read, or a base of another shape (serve, export: tracebacks before)
    config.write_text("{}")
    with pytest.raises(ModelError, match=rf"^{config}: not a LoRA adapter config that fits the model {tiny_dir} "
                                         r"\(KeyError: 'peft_type'\)$") as e:
        load_policy(tiny_dir, first)
    config.write_text(good)
    other = tmp_path / "other"
    tiny_llama(load_tokenizer(tiny_dir), layers=2, hidden=32, seed=0).save_pretrained(other)
    load_tokenizer(tiny_dir).save_pretrained(other)
    with pytest.raises(ModelError, match=rf"^{first}: its weights do not fit the model {other} \(size mismatch\)"):
        load_policy(str(other), first)
    config.write_text('{"x": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(ConfigError, match=rf"^{config}: not JSON \(nested too deep\)$"):
        load_policy(tiny_dir, first)
    config.write_text("{not json")
    with pytest.raises(ModelError, match="no readable checkpoint: .*unreadable weights.*1 older one") as e:
        load_policy(tiny_dir, run)
    one_line(e.value)


def test_no_loadable_checkpoint_is_one_line_and_changes_nothing(tiny_dir, tmp_path):
    run = tmp_path / "bad"
    train(tiny_cfg(tiny_dir, tmp_path, "bad", "trainer.max_steps=1", "data.val="))
    (ckpt,) = list_checkpoints(run)
    torch.save([1, 2, 3], ckpt / STATE_FILE)
    before = sorted(p.relative_to(run) for p in run.rglob("*"))
    with pytest.raises(ConfigError, match="no loadable checkpoint") as e:
        resume(run, 2)
    assert str(ckpt) in one_line(e.value)
    assert sorted(p.relative_to(run) for p in run.rglob("*")) == before


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


# -- 11: a full disk outside the checkpoint ------------------------------------------------------

def test_a_full_disk_for_metrics_and_samples_warns_and_training_goes_on(tiny_dir, tmp_path, monkeypatch, caplog):
    opened = {"metrics": 0}

    def fails(path):
        if path.endswith("metrics.jsonl"):
            opened["metrics"] += 1
            return opened["metrics"] == 2  # step 2's record
        return "samples" in path

    disk = FullDisk(fails)
    monkeypatch.setattr(tracking, "open", disk, raising=False)
    monkeypatch.setattr(rlpr.errors, "open", disk, raising=False)  # write_atomic's files
    run = tmp_path / "full"
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        train(tiny_cfg(tiny_dir, tmp_path, "full", "trainer.max_steps=3", "trainer.sample_every=1", "data.val="))
    assert any("metrics.jsonl" in p for p in disk.failed) and any("samples" in p for p in disk.failed)
    assert "could not write" in caplog.text and "No space left on device" in caplog.text
    assert "Traceback" not in caplog.text
    assert [m["step"] for m in read_metrics(run)] == [1, 3]  # step 2's record is missing, never half there
    assert not list((run / "samples").iterdir()) if (run / "samples").exists() else True  # never empty or partial
    assert load_state(latest_checkpoint(run))["step"] == 3


# -- 20: a disk too small for any checkpoint -----------------------------------------------------

def test_a_disk_too_small_for_a_checkpoint_is_refused_before_step_1(tiny_dir, tmp_path, monkeypatch):
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=4096))
    run = tmp_path / "tiny-disk"
    with pytest.raises(ConfigError, match="not enough free space for a checkpoint") as e:
        train(tiny_cfg(tiny_dir, tmp_path, "tiny-disk", "trainer.max_steps=2", "data.val="))
    assert str(run) in one_line(e.value)
    assert not (run / "metrics.jsonl").exists() or not read_metrics(run)  # found before step 1
    assert not (run / "checkpoints").exists() or not any((run / "checkpoints").iterdir())


# -- issue 35: N6 (a reused folder), N7 (one writer), N8 (a state of the wrong shape), N10 (the name) ----

def test_a_new_run_never_appends_to_a_run_folder_without_checkpoints(tiny_dir, tmp_path):
    """N6: a new run in a folder whose run stopped before its first checkpoint appended to its
    metrics.jsonl (and would reuse its tracker run ids)."""
    run = tmp_path / "again"
    run.mkdir()
    (run / "metrics.jsonl").write_text('{"step": 0, "eval/accuracy": 0.5}\n')
    (run / "wandb_run_id").write_text("abc")
    cfg = tiny_cfg(tiny_dir, tmp_path, "again", "trainer.max_steps=1", "data.val=")
    with pytest.raises(ConfigError, match="already holds a run that saved no checkpoint .metrics.jsonl, "
                                          "wandb_run_id.*choose another trainer.name") as e:
        train(cfg)
    one_line(e.value)
    assert sorted(p.name for p in run.iterdir()) == ["metrics.jsonl", "wandb_run_id"]  # nothing written
    assert (run / "metrics.jsonl").read_text() == '{"step": 0, "eval/accuracy": 0.5}\n'
    (run / "metrics.jsonl").unlink()
    (run / "wandb_run_id").unlink()
    (run / "config.yaml").write_text("stale: true\n")  # a run refused before its records: started anew
    train(cfg)
    assert [m["step"] for m in read_metrics(run)] == [1]


def test_a_run_directory_has_one_writer(tiny_dir, tmp_path):
    """N7: two resumes of one run could run at once, each writing its checkpoints and metrics."""
    run = tmp_path / "locked"
    train(tiny_cfg(tiny_dir, tmp_path, "locked", "trainer.max_steps=1", "data.val="))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from rlpr.train.run_dir import lock_run_dir
        lock_run_dir(Path({str(run)!r}))
        print("locked", flush=True)
        time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        before = sorted(p.name for p in run.rglob("*"))
        with pytest.raises(ConfigError, match="another rlpr process is training this run") as e:
            resume(run, 2)
        one_line(e.value)
        assert sorted(p.name for p in run.rglob("*")) == before  # the refused resume wrote nothing
    finally:
        holder.kill()
        holder.wait()
    resume(run, 2)  # the lock went with its process
    assert [c.name for c in list_checkpoints(run)] == ["step_1", "step_2"]


def test_a_trainer_state_of_the_wrong_shape_falls_back_and_an_absurd_step_is_refused(tiny_dir, tmp_path, caplog):
    """N8: a state of the wrong shape loaded ("resumed") and failed later with a traceback and no
    fallback; an absurd step was accepted, and resuming past max_steps saved step_N with it and
    pruned the good checkpoints."""
    run = tmp_path / "shape"
    train(tiny_cfg(tiny_dir, tmp_path, "shape", "trainer.max_steps=2", "trainer.save_every=1", "data.val="))
    first, second = list_checkpoints(run)
    good = torch.load(second / STATE_FILE, weights_only=True)

    def planted(**change):
        state = {**good, **change}
        torch.save(state, second / STATE_FILE)

    bad_states = [dict(step=10 ** 9), dict(step=-1), dict(filter={**good["filter"], "ema": "abc"}),
                  dict(filter={"ema": None}),
                  dict(ranks=[{**good["ranks"][0], "stream": {"epoch": 0, "position": "x", "cache": []}}]),
                  dict(ranks=[{**good["ranks"][0], "score_a_cache": [["only", "three", 1]]}]),
                  dict(ranks=[{**good["ranks"][0], "threads": 10 ** 9}]),  # a resume sets them: bounded
                  dict(ranks=[{**good["ranks"][0], "threads": "2"}]), dict(ranks=[{**good["ranks"][0], "threads": 0}])]
    for change in bad_states:
        planted(**change)
        with pytest.raises(ConfigError, match="trainer_state.pt: not an rlpr trainer state") as e:
            load_state(second, resumable=True)
        one_line(e.value)
    # a position past the data's end loads as data but not into the prompt stream: also skipped
    planted(ranks=[{**good["ranks"][0], "stream": {**good["ranks"][0]["stream"], "position": 10 ** 6}}])
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        resume(run, 3)
    assert f"skipped the corrupt checkpoint {second}" in caplog.text and "does not fit" in caplog.text
    assert [c.name for c in list_checkpoints(run)] == ["step_2", "step_3"]
    # the absurd step: skipped too, never saved as step_1000000000 pruning the good ones
    caplog.clear()
    third = run / "checkpoints" / "step_3"
    state = torch.load(third / STATE_FILE, weights_only=True)
    torch.save({**state, "step": 10 ** 9}, third / STATE_FILE)
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        resume(run, 4)
    assert f"skipped the corrupt checkpoint {third}" in caplog.text and "step 1000000000 in step_3" in caplog.text
    assert [c.name for c in list_checkpoints(run)] == ["step_3", "step_4"]


@pytest.mark.parametrize("name", ["../escaped", "ABSOLUTE", "a/../../b", "."])
def test_trainer_name_stays_inside_the_output_dir(tiny_dir, tmp_path, name):
    """N10: trainer.name with ../ or an absolute path put the run outside trainer.output_dir."""
    name = str(tmp_path / "elsewhere") if name == "ABSOLUTE" else name  # never outside the test's folder
    out = tmp_path / "runs"
    out.mkdir()
    with pytest.raises(ConfigError, match="trainer.name: .* must name a folder inside trainer.output_dir") as e:
        train(tiny_cfg(tiny_dir, out, name, "trainer.max_steps=1", "data.val="))
    one_line(e.value)
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
