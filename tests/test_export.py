"""`rlpr export`: a run's trained model as a Hugging Face folder and as a GGUF file, each read back
by transformers (its GGUF loader is the one llama.cpp's files are written for) and equal to the
trained policy; a model card in both."""

import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rlpr.cli.main import main
from rlpr.model.loading import load_policy
from rlpr.train.trainer import train

from helpers import at_a_terminal, tiny_cfg

pytestmark = pytest.mark.integration

PROMPTS = ["The capital of France is", "Water is made of", "<|im_start|>user\nName a color.<|im_end|>\n"]


@pytest.fixture(scope="module")
def runs(tiny_dir, tmp_path_factory):
    """Two 1-step runs of the tiny model: LoRA (an adapter checkpoint) and full fine-tuning."""
    out = tmp_path_factory.mktemp("export-runs")
    for name, extra in (("lora", []), ("full", ["model.lora=false"])):
        train(tiny_cfg(tiny_dir, out, name, "trainer.max_steps=1", "trainer.eval_samples=0", *extra))
    return out


def logits(model, tokenizer):
    return [model(torch.tensor([tokenizer(p)["input_ids"]])).logits[0] for p in PROMPTS]


@pytest.mark.parametrize("kind", ["lora", "full"])
def test_hf_folder_loads_with_transformers_and_equals_the_trained_policy(runs, tiny_dir, tmp_path, kind, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    assert main(["export", str(runs / kind), "--format", "hf", "-o", str(tmp_path / "hf")]) == 0
    assert "wrote" in capsys.readouterr().out
    trained, tokenizer = load_policy(tiny_dir, runs / kind)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        for a, b in zip(logits(trained, tokenizer), logits(exported, tokenizer)):
            assert torch.equal(a, b)
    assert AutoTokenizer.from_pretrained(tmp_path / "hf")(PROMPTS[2])["input_ids"] == tokenizer(PROMPTS[2])["input_ids"]
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "| steps | 1 |" in card and "probability (mean_prob; " in card and tiny_dir in card
    assert (tmp_path / "hf" / "generation_config.json").exists()


@pytest.mark.parametrize("gguf_type,atol", [("f32", 1e-5), ("f16", 2e-3), ("q8_0", 3e-2)])
def test_gguf_reloads_with_the_same_tokenizer_and_logits(runs, tiny_dir, tmp_path, gguf_type, atol):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlpr.model.gguf_fields import fast_gguf_loading

    target = tmp_path / "model.gguf"
    assert main(["export", str(runs / "lora"), "--format", "gguf", "--gguf-type", gguf_type, "-o", str(target)]) == 0
    trained, tokenizer = load_policy(tiny_dir, runs / "lora")
    # the GGUF's config and tokenizer fields do not depend on the tensor type: read them in the f32 case only
    # (transformers' GGUF reader takes about 5 s a read for SmolLM2's vocabulary)
    config = {} if gguf_type == "f32" else {"config": trained.config}
    with fast_gguf_loading():  # transformers' loader through the reader test_gguf_fields.py checks
        exported = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=target.name, dtype=torch.float32,
                                                        **config).eval()
    with torch.no_grad():
        for a, b in zip(logits(trained, tokenizer), logits(exported, tokenizer)):
            scale = max(a.abs().max().item(), 1.0)
            assert (a - b).abs().max().item() <= atol * scale
            if gguf_type == "f32":  # exact weights: the same greedy token everywhere
                assert torch.equal(a.argmax(-1), b.argmax(-1))
    if gguf_type == "f32":
        with fast_gguf_loading():
            reread = AutoTokenizer.from_pretrained(tmp_path, gguf_file=target.name)
        for p in PROMPTS:
            assert reread(p)["input_ids"] == tokenizer(p)["input_ids"]
        assert reread.eos_token_id == tokenizer.eos_token_id
    assert "library_name: gguf" in (tmp_path / "model.README.md").read_text()  # never README.md (issue 35, N2)


def test_export_errors_are_one_line(runs, tmp_path, capsys):
    assert main(["export", str(tmp_path), "-o", str(tmp_path / "x")]) == 2
    assert "not a run directory (no config.yaml)" in capsys.readouterr().err
    assert main(["export", str(runs / "lora"), "--step", "7", "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "no complete checkpoint for step 7" in err and len(err.strip().splitlines()) == 1


def test_gguf_refuses_an_architecture_llama_cpp_layout_is_not_known_for(tokenizer, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rlpr.errors import ConfigError
    from rlpr.model.export import write_gguf

    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ConfigError, match="GGUF export supports .* not GPT2LMHeadModel: export --format hf"):
        write_gguf(model, tokenizer, tmp_path / "m.gguf")


# -- issue 35: export never destroys, is whole or nothing, and checks its output first -------------

def digest(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def no_model_load(monkeypatch):
    """Make loading the model fail loudly: a check that should come first must not reach it."""
    import rlpr.model.loading

    def fail(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")
    monkeypatch.setattr(rlpr.model.loading, "load_policy", fail)


def one_line_error(capsys, *words):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err
    return err


def test_export_refuses_a_non_empty_folder_and_overwrite_replaces_it_whole(runs, tiny_dir, tmp_path, capsys,
                                                                         monkeypatch):
    """N1: into a folder holding other weights, export used to write in place (stale shards and an
    index beside the new files); pointed at the base model's folder it overwrote the base weights."""
    stale = tmp_path / "out"
    stale.mkdir()
    (stale / "model-00001-of-00002.safetensors").write_bytes(b"old shard")
    (stale / "model.safetensors.index.json").write_text("{}")
    base_before = digest(tiny_dir)
    with monkeypatch.context() as m:
        no_model_load(m)
        assert main(["export", str(runs / "lora"), "-o", str(stale)]) == 2
        one_line_error(capsys, str(stale), "not empty", "--overwrite")
        assert main(["export", str(runs / "lora"), "-o", tiny_dir]) == 2  # the run's own base model
        one_line_error(capsys, tiny_dir, "not empty")
        assert main(["export", str(runs / "lora"), "-o", tiny_dir, "--overwrite"]) == 2
        one_line_error(capsys, "--overwrite would replace")
        assert main(["export", str(runs / "lora"), "-o", str(runs), "--overwrite"]) == 2  # holds the run
        one_line_error(capsys, "--overwrite would replace")
    assert digest(tiny_dir) == base_before
    assert sorted(p.name for p in stale.iterdir()) == ["model-00001-of-00002.safetensors",
                                                        "model.safetensors.index.json"]
    # issue 43: --overwrite replaces only an earlier export, never a folder of other weights
    assert main(["export", str(runs / "lora"), "-o", str(stale), "--overwrite"]) == 2
    one_line_error(capsys, "--overwrite replaces only a folder rlpr export wrote")
    (stale / "rlpr-export.json").write_text('{"rlpr_export": 1}')  # as an earlier export leaves it
    assert main(["export", str(runs / "lora"), "-o", str(stale), "--overwrite"]) == 0
    names = sorted(p.name for p in stale.iterdir())
    assert "model.safetensors" in names and not any("00001" in n or "index" in n for n in names)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["export", str(runs / "lora"), "-o", str(empty)]) == 0  # an empty folder is fine
    assert (empty / "model.safetensors").is_file()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary left


def test_gguf_export_never_replaces_a_readme(runs, tmp_path, capsys):
    """N2: a GGUF export wrote README.md beside the .gguf, replacing whatever README was there."""
    (tmp_path / "README.md").write_text("my notes")
    assert main(["export", str(runs / "lora"), "--format", "gguf", "-o", str(tmp_path / "m.gguf")]) == 0
    assert (tmp_path / "README.md").read_text() == "my notes"
    assert "library_name: gguf" in (tmp_path / "m.README.md").read_text()
    assert main(["export", str(runs / "lora"), "--format", "gguf", "-o", str(tmp_path / "m.gguf")]) == 2
    one_line_error(capsys, "m.gguf", "already exists", "--overwrite")
    assert main(["export", str(runs / "lora"), "--format", "gguf", "-o", str(tmp_path / "m.gguf"),
                 "--overwrite"]) == 0
    assert (tmp_path / "README.md").read_text() == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "m.README.md", "m.gguf"]


def test_overwrite_replaces_only_an_earlier_export(runs, tiny_dir, tmp_path, capsys, monkeypatch):
    """Issue 43, item 4: `export --overwrite` deleted a folder holding a run's training data and
    replaced the embedded model's converted weights in rlpr's cache. Now only a folder export wrote
    (its rlpr-export.json) or a .gguf it wrote (its rlpr.export key) is replaced."""
    import shutil

    data = tmp_path / "my-data"
    data.mkdir()
    (data / "train.jsonl").write_text('{"question": "q", "answer": "a"}\n')
    cache = tmp_path / "cache"
    shutil.copytree(tiny_dir, cache / "models" / "SmolLM2-135M-Instruct-Q8_0-1")  # a converted base model
    monkeypatch.setenv("RLPR_CACHE_DIR", str(cache))
    foreign_gguf = tmp_path / "theirs.gguf"
    foreign_gguf.write_bytes(b"GGUF not ours")
    lora = str(runs / "lora")
    with monkeypatch.context() as m:
        no_model_load(m)
        for target, fmt in ((data, "hf"), (cache / "models" / "SmolLM2-135M-Instruct-Q8_0-1", "hf"),
                            (data, "gguf"), (foreign_gguf, "gguf")):
            before = digest(target.parent)
            assert main(["export", lora, "--format", fmt, "-o", str(target), "--overwrite"]) == 2
            one_line_error(capsys, "--overwrite replaces only a", "rlpr export wrote")
            assert digest(target.parent) == before
    from rlpr.model.export import written_by_export

    # an earlier export of either kind is replaced
    for fmt, target in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "m.gguf")):
        assert main(["export", lora, "--format", fmt, "-o", str(target)]) == 0
        assert written_by_export(target)
        assert main(["export", lora, "--format", fmt, "-o", str(target), "--overwrite"]) == 0
        assert written_by_export(target)
    capsys.readouterr()
    assert (tmp_path / "hf" / "rlpr-export.json").is_file()
    assert not written_by_export(data) and not written_by_export(Path(tiny_dir)) and not written_by_export(foreign_gguf)
    deep = tmp_path / "deep"  # a marker nested a thousand deep was a RecursionError traceback: not an export
    deep.mkdir()
    (deep / "rlpr-export.json").write_text('{"rlpr_export": ' + "[" * 5000 + "]" * 5000 + "}")
    assert not written_by_export(deep)


@pytest.mark.parametrize("fmt", ["hf", "gguf"])
def test_a_failed_or_interrupted_export_leaves_nothing_and_keeps_the_old_output(runs, tmp_path, capsys,
                                                                              monkeypatch, fmt):
    """N3 and N9: a full disk midway or Ctrl-C left a truncated .gguf (or an HF folder with a cut
    tokenizer) under the final name, and the error was a traceback."""
    import rlpr.model.export as export

    target = tmp_path / ("m.gguf" if fmt == "gguf" else "hf")
    real = export.write_gguf if fmt == "gguf" else export.save_hf

    def full_disk(model, tokenizer, path, *a, **k):
        real(model, tokenizer, path, *a, **k)  # written whole, then the disk fills up on the next file
        raise OSError(errno.ENOSPC, "No space left on device")

    def interrupted(model, tokenizer, path, *a, **k):
        Path(path).write_bytes(b"half") if fmt == "gguf" else Path(path).mkdir(exist_ok=True)
        raise KeyboardInterrupt

    args = ["export", str(runs / "lora"), "--format", fmt, "-o", str(target)]
    monkeypatch.setattr(export, real.__name__, full_disk)
    assert main(args) == 2
    one_line_error(capsys, "cannot write", str(target), "No space left on device", "nothing was written")
    assert list(tmp_path.iterdir()) == []  # no target, no card, no temporary
    monkeypatch.setattr(export, real.__name__, interrupted)
    assert main(args) == 130
    one_line_error(capsys, "interrupted", "nothing was written")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(export, real.__name__, real)
    assert main(args) == 0
    before = digest(tmp_path)
    monkeypatch.setattr(export, real.__name__, full_disk)
    assert main([*args, "--overwrite"]) == 2  # the old export stays whole
    capsys.readouterr()
    assert digest(tmp_path) == before


def test_bad_outputs_are_one_line_before_the_model_loads(runs, tmp_path, capsys, monkeypatch):
    """N9: a file where a folder goes, a folder where a file goes, a path under a file and a
    read-only folder are one line each, found before the model loads."""
    no_model_load(monkeypatch)
    lora = str(runs / "lora")
    (tmp_path / "file").write_text("x")
    (tmp_path / "dir.gguf").mkdir()
    (tmp_path / "dir.gguf" / "x").write_text("x")
    cases = [(["-o", str(tmp_path / "file")], "a file is there"),
             (["--format", "gguf", "-o", str(tmp_path / "dir.gguf")], "a folder is there"),
             (["--format", "gguf", "-o", str(tmp_path / "dir.gguf"), "--overwrite"], "a folder is there"),
             (["-o", str(tmp_path / "file" / "sub")], "is a file, not a folder")]
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        cases.append((["-o", str(ro / "out")], "permission denied"))
    for extra, words in cases:
        assert main(["export", lora, *extra]) == 2, extra
        one_line_error(capsys, words)


def test_exported_files_have_the_umask_s_modes_and_the_console_is_quiet(runs, tmp_path):
    """E2: model.safetensors came out 0600 (unreadable by a cluster's other users); E3: DeepSpeed's
    accelerator warning, transformers' per-file bars and the gguf writer's INFO lines on the console."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DS_ACCELERATOR", None)
    code = ("import os, sys; os.umask(0o022); from rlpr.cli.main import main; "
            "sys.exit(main(sys.argv[1:]))")
    for fmt, out in (("hf", tmp_path / "hf"), ("gguf", tmp_path / "gg")):
        result = subprocess.run([sys.executable, "-c", code, "export", str(runs / "lora"), "--format", fmt,
                                 "-o", str(out)], capture_output=True, text=True, env=env, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stderr == "", result.stderr  # nothing but rlpr's own line
        assert result.stdout.startswith("wrote ") and len(result.stdout.splitlines()) == 1
        assert (out.stat().st_mode & 0o777) == 0o755
        for f in out.iterdir():
            assert (f.stat().st_mode & 0o777) == 0o644, f


# -- issue 43, item 6: every signal cleans up, and a killed export's leftovers are recovered ---------

EXPORT_WAITING = """
import sys, time
from pathlib import Path
import rlpr.model.export as export

def slow(model, tokenizer, output, *a, **k):
    Path(output).mkdir(parents=True, exist_ok=True)
    (Path(output) / "model.safetensors").write_bytes(b"half")
    Path(sys.argv[1]).write_text("writing")
    for _ in range(600):  # slices: a signal another thread took runs its handler between them
        time.sleep(0.1)

export.save_hf = slow
from rlpr.cli.main import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM", "SIGHUP"])
def test_every_signal_during_an_export_cleans_up(runs, tmp_path, signame):
    """SIGTERM (a scheduler's stop) and SIGHUP used to kill the export where it stood, leaving its
    hidden temporary folder; now each ends as Ctrl-C does: one line, exit 130, nothing left."""
    import signal
    import time

    ready, out = tmp_path / "ready", tmp_path / "out" / "hf"
    proc = subprocess.Popen([sys.executable, "-c", EXPORT_WAITING, str(ready), "export", str(runs / "lora"),
                             "-o", str(out)], stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"},
                            preexec_fn=at_a_terminal)
    deadline = time.time() + 120
    while not ready.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "the export never started writing"
    assert [p.name.split("-")[0] for p in out.parent.iterdir()] == [".hf.tmp"]  # being written
    proc.send_signal(getattr(signal, signame))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err.strip() == f"rlpr: export interrupted ({signame}); nothing was written to {out}", err
    assert list(out.parent.iterdir()) == []


def dead_pid():
    """The id of a process that has ended."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_killed_export_s_leftovers_are_recovered_on_the_next_start(runs, tmp_path, capsys, caplog):
    """SIGKILL runs no cleanup: its hidden temporary stays, and an earlier output it had moved aside
    (`--overwrite`, between moving it and renaming the new one in) was the only copy. The next export
    of the same target removes the first and puts the second back; another machine's are reported."""
    import socket

    from rlpr.model.export import written_by_export

    host = "".join(c if c.isalnum() or c == "_" else "_" for c in socket.gethostname())
    pid = dead_pid()
    earlier = tmp_path / "hf"
    assert main(["export", str(runs / "lora"), "-o", str(earlier)]) == 0
    aside = tmp_path / f".hf.old-{host}-{pid}-abc"
    aside.mkdir()
    os.replace(earlier, aside / "hf")
    partial = tmp_path / f".hf.tmp-{host}-{pid}-def"
    partial.mkdir()
    (partial / "model.safetensors").write_bytes(b"half")
    elsewhere = tmp_path / ".hf.tmp-another_host-12-ghi"
    elsewhere.mkdir()
    capsys.readouterr()
    assert main(["export", str(runs / "lora"), "-o", str(earlier)]) == 2  # the earlier one is back: not empty
    one_line_error(capsys, "not empty")
    err = caplog.text
    assert f"put back {earlier}" in err and f"removed {partial}" in err and f"{elsewhere}: left by an interrupted" in err
    assert written_by_export(earlier) and not aside.exists() and not partial.exists() and elsewhere.exists()
