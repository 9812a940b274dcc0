"""The fourth hardening pass (issue 43) on training runs: non-finite values stop a run, a resume
proves its base model, the shuffled-reference control is one, leftovers of killed writers are
cleaned, run names never nest in another run, pasted commands are shell-quoted, and an optimizer
state of the wrong shape falls back. Tiny model, few steps."""

import json
import logging
import math

import pytest
import torch

from rlpr.train.checkpoint import list_checkpoints

from helpers import tiny_cfg

pytestmark = pytest.mark.integration


# the smallest steps that still train: 2 prompts x 2 responses
SMALL = ("rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2",
         "rollout.max_new_tokens=4", "data.val=", "trainer.report=false")


def one_line(message):
    assert len(str(message).strip().splitlines()) == 1, message
    return str(message)


def strict_json(path):
    """Every line of a JSONL file, read by a parser that refuses NaN and Infinity."""
    def refuse(constant):
        raise ValueError(f"{path}: {constant} is not JSON")

    return [json.loads(line, parse_constant=refuse) for line in path.read_text().splitlines() if line.strip()]


# -- 1: non-finite values stop a run ----------------------------------------------------------------

def poison(policy):
    """Every weight of the embedding NaN (the base weights: LoRA trains on top of them)."""
    with torch.no_grad():
        next(p for n, p in policy.named_parameters() if "embed_tokens" in n).fill_(float("nan"))


def test_a_nonfinite_value_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_dir, tmp_path, monkeypatch):
    from rlpr.train.finite import NonFiniteValue
    from rlpr.train.trainer import Trainer, train

    original = Trainer.train_step

    def poisoned_at_step_2(self, step):
        if step == 2:
            poison(self.policy)
        return original(self, step)

    monkeypatch.setattr(Trainer, "train_step", poisoned_at_step_2)
    cfg = tiny_cfg(tiny_dir, tmp_path, "nan", "trainer.max_steps=3", "trainer.save_every=1", "trainer.sample_every=1",
                   *SMALL)
    with pytest.raises(NonFiniteValue) as e:
        train(cfg)
    message = one_line(e.value)
    assert message.startswith("step 2, reward phase: score B") and " nan " in message, message
    assert "step_1" in message and "rlpr train --resume" in message
    run = tmp_path / "nan"
    assert [c.name for c in list_checkpoints(run)] == ["step_1"]  # the NaN update was never saved
    assert [r["step"] for r in strict_json(run / "metrics.jsonl")] == [1]
    rows = strict_json(run / "samples" / "step_000002.jsonl")  # the failing step's samples, NaN as null
    assert rows and all(r["score_b"] is None for r in rows)


def test_a_model_with_a_nan_weight_is_one_line_and_exit_2(tiny_model, tokenizer, tmp_path, capsys):
    """The whole command: exit status 2 and one line, where it used to train to the end with exit 0."""
    import copy

    from rlpr.cli.main import main

    model = copy.deepcopy(tiny_model)
    poison(model)
    model.save_pretrained(tmp_path / "nan-model")
    tokenizer.save_pretrained(tmp_path / "nan-model")
    code = main(["train", f"model.path={tmp_path / 'nan-model'}", f"trainer.output_dir={tmp_path}",
                 "trainer.name=r", "trainer.max_steps=2", "rollout.max_new_tokens=4",
                 "rollout.responses_per_prompt=2", "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2",
                 "data.demo_train_size=8", "data.val=", "trainer.progress=false", "trainer.tensorboard=false"])
    err = capsys.readouterr().err
    assert code == 2
    lines = [line for line in err.splitlines() if line.startswith("rlpr: error:")]
    assert len(lines) == 1 and "step 1, reward phase" in lines[0] and "no checkpoint was saved" in lines[0], err
    assert "Traceback" not in err and not list_checkpoints(tmp_path / "r")


def test_every_watched_value_is_named_with_its_phase():
    from rlpr.train.finite import first_nonfinite

    good = {"reward/score_b_mean": 0.2, "reward/score_a_mean": 0.1, "reward/mean": 0.3, "policy/entropy": 1.0,
            "policy/pg_loss": 0.0, "policy/kl": 0.0, "policy/grad_norm": 0.5, "policy/updates": 2,
            "policy/tokens": 40.0}
    assert first_nonfinite(good) is None
    assert first_nonfinite({**good, "policy/grad_norm": math.inf})[1:] == ("the gradient norm", "update", math.inf)
    assert first_nonfinite({**good, "policy/pg_loss": -math.inf})[2] == "update"
    assert first_nonfinite({**good, "reward/mean": math.nan, "policy/grad_norm": math.nan})[2] == "reward"
    assert first_nonfinite({**good, "policy/entropy": math.nan})[1] == "the policy's logits (their entropy)"
    # a step whose groups were all filtered out updates nothing: its NaN loss is no failure
    assert first_nonfinite({**good, "policy/updates": 0, "policy/pg_loss": math.nan,
                            "policy/grad_norm": math.nan}) is None


# -- 3: a resume, eval or export proves it has the same base model ----------------------------------

def test_resume_eval_and_export_refuse_a_base_whose_weights_changed(tiny_model, tokenizer, tmp_path, capsys):
    import copy
    import os
    import shutil
    from pathlib import Path

    from rlpr.cli.main import main
    from rlpr.model.fingerprint import check_base
    from rlpr.model.loading import tiny_llama
    from rlpr.train.trainer import train

    base = tmp_path / "base"
    tiny_model.save_pretrained(base)
    tokenizer.save_pretrained(base)
    train(tiny_cfg(str(base), tmp_path, "run", "trainer.max_steps=1", *SMALL))
    run = tmp_path / "run"
    assert (run / "base_model.yaml").is_file()
    # the same weights copied back (new modification times): still the same base
    shutil.copytree(base, tmp_path / "copy")
    shutil.rmtree(base)
    shutil.copytree(tmp_path / "copy", base)
    os.utime(base / "model.safetensors", (1, 1))
    check_base(run, str(base), "--resume")  # no refusal
    # other weights at the same path
    other = tiny_llama(tokenizer, layers=2, hidden=64, seed=1)
    other.save_pretrained(base)
    capsys.readouterr()
    data = str(Path(__file__).resolve().parents[1] / "examples" / "my_questions_val.jsonl")
    for args in (["train", "--resume", str(run), "trainer.max_steps=3"],
                 ["eval", "--checkpoint", str(run), "--data", data, "--limit", "1", "--max-new-tokens", "2",
                  "--output", str(tmp_path / "eval")],
                 ["export", str(run), "-o", str(tmp_path / "export")]):
        assert main(args) == 2, args
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlpr: error")]
        assert len(err) == 1 and f"the base model {base} changed since the run started (model.safetensors" in err[0]
        assert "--accept-base-change" in err[0]
    assert not (tmp_path / "eval").exists() and not (tmp_path / "export").exists()
    assert main(["export", str(run), "-o", str(tmp_path / "export"), "--accept-base-change"]) == 0
    assert (tmp_path / "export" / "model.safetensors").is_file()


def test_a_run_s_records_yaml_cannot_read_are_one_line(tmp_path, caplog):
    """data.yaml and base_model.yaml nested a thousand deep (a damaged run folder) were a
    RecursionError traceback. data.yaml is then not checked, with a warning; base_model.yaml
    refuses in one line (issue 60, S6: a record that proves nothing fails closed)."""
    from rlpr.errors import ConfigError
    from rlpr.model.fingerprint import FINGERPRINT_FILE, check_base
    from rlpr.train.run_dir import check_data

    for name in ("data.yaml", FINGERPRINT_FILE):
        (tmp_path / name).write_text("train: " + "[" * 5000 + "]" * 5000 + "\n")
    with caplog.at_level(logging.WARNING, logger="rlpr"):
        check_data(tmp_path, {})
    assert f"{tmp_path / 'data.yaml'}: unreadable (nested too deep)" in caplog.text
    with pytest.raises(ConfigError) as e:
        check_base(tmp_path, "default", "--resume")
    assert f"{tmp_path / FINGERPRINT_FILE}: unreadable (nested too deep)" in one_line(e.value)


def test_the_fingerprint_of_a_large_file_samples_it(tmp_path):
    """Above 64 MiB a file is not read whole: its size, safetensors header and 17 blocks spread over
    it are hashed, so that a 7B folder costs megabytes of reads; a change in a sampled block, the
    header or the size is seen."""
    import struct

    from rlpr.model import fingerprint

    header = b'{"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
    path = tmp_path / "big.safetensors"
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(fingerprint.WHOLE_LIMIT + (1 << 20))  # sparse: nothing written beyond the header
    first = fingerprint.file_digest(path)
    reads = []
    real_open = open

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            reads.append(len(data))
            return data

        def seek(self, n):
            return self.f.seek(n)

    fingerprint.open = lambda p, mode: Counting(real_open(p, mode))
    try:
        assert fingerprint.file_digest(path) == first
    finally:
        del fingerprint.open
    assert sum(reads) < 2 << 20  # not the 65 MiB of the file
    size = path.stat().st_size
    for offset in (8 + len(header) - 3, 8 * (size // fingerprint.SAMPLES) + 100, size - 10):
        with open(path, "r+b") as f:
            f.seek(offset)
            old = f.read(1)
            f.seek(offset)
            f.write(b"x")
        assert fingerprint.file_digest(path) != first, offset
        with open(path, "r+b") as f:
            f.seek(offset)
            f.write(old)
    assert fingerprint.file_digest(path) == first


# -- 5: the shuffled-reference control is one -------------------------------------------------------

@pytest.mark.parametrize("answers", [["4"], ["4", "4", "4", "4", "7", "9"]], ids=["one-prompt", "shared-answer"])
def test_a_shuffled_reference_control_never_keeps_a_prompt_s_own_reference(tiny_dir, tmp_path, answers):
    """One prompt has no other reference, and with 4 of 6 prompts answering "4" two of them must
    keep "4": both used to train silently on their own references."""
    from rlpr.errors import ConfigError
    from rlpr.train.trainer import Trainer

    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"question": f"What is item {i}?", "answer": a}) + "\n"
                            for i, a in enumerate(answers)))
    cfg = tiny_cfg(tiny_dir, tmp_path, "shuf", f"data.train={data}", "data.val=", "reward.shuffle_references=true",
                   "trainer.prompts_per_step=1", "trainer.mini_batch_prompts=1")
    with pytest.raises(ConfigError) as e:
        Trainer(cfg, tmp_path / "shuf")
    message = one_line(e.value)
    own = 1 if len(answers) == 1 else 2
    assert f"reward.shuffle_references: {own} of {len(answers)} training prompts would be scored against their own " \
           f"reference text" in message, message


def test_a_shuffled_run_records_the_reference_it_scored(tiny_dir, tmp_path):
    from rlpr.train.trainer import train

    train(tiny_cfg(tiny_dir, tmp_path, "shuf", "reward.shuffle_references=true", "trainer.max_steps=1",
                   "trainer.sample_every=1", *SMALL))
    rows = strict_json(tmp_path / "shuf" / "samples" / "step_000001.jsonl")
    assert rows and all(r["scored_reference"] and r["scored_reference"] != r["reference"] for r in rows)
    (step,) = strict_json(tmp_path / "shuf" / "metrics.jsonl")
    assert step["reward/own_reference_frac"] == 0.0


def test_the_reward_records_the_reference_it_scored(tiny_model, tokenizer):
    """Every output names its reference (the samples' scored_reference); rollout_metrics counts
    those that are the prompt's own (1 without the control)."""
    from types import SimpleNamespace

    from rlpr.config import RewardConfig
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.rollout.hf import Rollout
    from rlpr.train.metrics import Group, rollout_metrics

    reward = ProbabilityReward(RewardConfig(), tokenizer)
    outs = reward(tiny_model, ["Q?", "Q?"], ["<answer>Paris</answer>", "Lyon"], ["Paris", "Rome"])
    assert [o.scored_reference for o in outs] == ["Paris", "Rome"]
    prompt = SimpleNamespace(example=SimpleNamespace(reference="Paris"), response_text=lambda t: t)
    group = Group(prompt, [Rollout(0, [1], "a", True), Rollout(0, [1], "b", True)], outs)
    assert rollout_metrics([group])["reward/own_reference_frac"] == 0.5


# -- 6: leftovers, nested runs, quoted commands ----------------------------------------------------

def test_a_killed_save_s_leftovers_are_removed_when_the_run_starts_again(tiny_dir, tmp_path, caplog):
    """A save or a pruning killed by SIGKILL leaves checkpoints/.tmp-step_N or .trash-step_N; the
    next start of the run (`prepare_run_dir`, before the model loads, under the run's lock: no
    other writer) removes them, naming each."""
    import logging

    from rlpr.train.run_dir import prepare_run_dir, release_run_dir
    from rlpr.train.setup import load_data

    cfg = tiny_cfg(tiny_dir, tmp_path, "run", "data.val=")
    run = tmp_path / "run"
    root = run / "checkpoints"
    (root / "step_1" / "adapter").mkdir(parents=True)
    (root / ".tmp-step_2" / "adapter").mkdir(parents=True)
    (root / ".trash-step_0").mkdir()
    (run / "config.yaml").write_text("{}\n")
    try:
        with caplog.at_level(logging.WARNING, logger="rlpr"):
            prepare_run_dir(run, cfg, load_data(cfg), resume=True)
    finally:
        release_run_dir(run)
    assert sorted(p.name for p in root.iterdir()) == ["step_1"]
    assert f"removed {root / '.tmp-step_2'}, left by an interrupted checkpoint save" in caplog.text
    assert f"removed {root / '.trash-step_0'}" in caplog.text


def test_removal_of_leftovers_only_takes_a_gone_process_s_of_this_host(tmp_path, caplog):
    """`errors.remove_leftovers` (exports, checkpoint-free temporaries, the GGUF conversion cache,
    the Gemma assembly): a temporary whose process ended on this host is removed; one a live
    process writes stays; another host's, or one without an owner, is reported."""
    import logging
    import os
    import socket
    import subprocess
    import sys

    from rlpr.errors import owned_temporary_prefix, remove_leftovers

    host = "".join(c if c.isalnum() or c == "_" else "_" for c in socket.gethostname())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    gone = tmp_path / f".m.tmp-{host}-{child.pid}-x"
    mine = tmp_path / (owned_temporary_prefix("m") + "y")
    other = tmp_path / ".m.tmp-another_host-1-z"
    legacy = tmp_path / ".m.tmp-123"
    for path in (gone, mine, other, legacy):
        path.mkdir()
    log = logging.getLogger("rlpr.test")
    with caplog.at_level(logging.WARNING, logger="rlpr.test"):
        remove_leftovers(tmp_path, ".m.tmp-*", "conversion", log)
    assert not gone.exists() and mine.exists() and other.exists() and legacy.exists()
    assert f"removed {gone}" in caplog.text and f"{other}: left by" in caplog.text and f"{legacy}: left by" in caplog.text
    assert os.getpid() == int(mine.name.split("-")[-2])


@pytest.mark.parametrize("name", ["a/checkpoints/step_9", "a/sub", "the folder holding a"])
def test_a_run_is_never_inside_another_run_nor_holds_one(tiny_dir, tmp_path, monkeypatch, name):
    """A run named into another's checkpoints/ was deleted by that run's pruning."""
    import rlpr.model.loading
    from rlpr.errors import ConfigError
    from rlpr.train.trainer import train

    (tmp_path / "out" / "a" / "checkpoints" / "step_1").mkdir(parents=True)
    (tmp_path / "out" / "a" / "config.yaml").write_text("trainer: {}\n")
    monkeypatch.setattr(rlpr.model.loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    holding = name == "the folder holding a"
    out, run_name = (tmp_path, "out") if holding else (tmp_path / "out", name)
    with pytest.raises(ConfigError) as e:
        train(tiny_cfg(tiny_dir, out, run_name, "data.val="))
    message = one_line(e.value)
    assert ("holds the run" if holding else "would be inside the run") in message, message
    assert sorted(p.name for p in (tmp_path / "out" / "a").rglob("*")) == ["checkpoints", "config.yaml", "step_1"]


def test_every_command_printed_to_paste_is_shell_quoted(tmp_path, capsys):
    """The resume line after SIGINT (and the eval lines after the last step or the final
    evaluation, the refusal of a run with checkpoints, the stop on a NaN) quoted a run's path for
    no shell: a run named `a b;touch X` gave a line that ran `touch X`."""
    import shlex
    from pathlib import Path
    from types import SimpleNamespace

    from rlpr.errors import ConfigError
    from rlpr.train.finite import stop_on_nonfinite
    from rlpr.train.run_dir import check_fresh
    from rlpr.train.signals import end_of_run

    run = tmp_path / "runs" / "a b;touch X"
    (run / "checkpoints" / "step_1" / "adapter").mkdir(parents=True)
    (run / "checkpoints" / "step_1" / "trainer_state.pt").write_bytes(b"x")
    (run / "checkpoints" / "step_1" / "adapter" / "adapter_model.safetensors").write_bytes(b"x")

    def pasted(text):
        line = next(line.strip() for line in text.splitlines() if line.strip().startswith("rlpr ") or "rlpr " in line)
        return shlex.split(line[line.index("rlpr "):].removesuffix(" --data ...").split(")")[0])

    for step in (1, 3):  # stopped before the last step: resume; after it: evaluate
        trainer = SimpleNamespace(run_dir=run, step=step, stop_requested=True,
                                  cfg=SimpleNamespace(trainer=SimpleNamespace(max_steps=3)))
        end_of_run(trainer)
        verb = ["train", "--resume"] if step == 1 else ["eval", "--checkpoint"]
        assert pasted(capsys.readouterr().err) == ["rlpr", *verb, str(run)]
    with pytest.raises(ConfigError) as e:
        check_fresh(run)
    assert pasted(str(e.value).replace(" or choose", ")")) == ["rlpr", "train", "--resume", str(run)]
    with pytest.raises(Exception) as e:
        stop_on_nonfinite(2, {"reward/mean": float("nan")}, Path(run))
    assert pasted(str(e.value)) == ["rlpr", "train", "--resume", str(run)]
