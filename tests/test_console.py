"""A normal run's console carries no deprecation noise (issue 30): `rlpr train` (LoRA, and full
fine-tuning with gradient checkpointing), `rlpr eval` and `rlpr score` in fresh processes with
Python's default warning filters, as a user runs them; stderr has no FutureWarning,
DeprecationWarning or transformers' "deprecated" notices (they used to print
"`past_key_values` is deprecated ... Use `cache` instead" several times per command)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
NOISE = ("FutureWarning", "DeprecationWarning", "deprecated", "UserWarning")


# issue 43: the libraries' own console lines, none of which a user asked for
LIBRARY_LINES = ("Loading weights", "Writing model shards", "font_manager", "INFO matplotlib", "Setting accelerator",
                 "Converting and de-quantizing")


def rlpr(*args, cwd, **extra_env):
    # a fresh matplotlib cache: its first use logs "INFO matplotlib.font_manager: generated new fontManager"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "2", "MPLCONFIGDIR": str(cwd / "mpl"),
           **{k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ}, **extra_env}  # the tree under test
    result = subprocess.run([sys.executable, "-m", "rlpr", *args], capture_output=True, text=True, cwd=cwd,
                            timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    # both streams: DeepSpeed's logger writes to stdout
    noise = [line for line in (result.stdout + result.stderr).splitlines()
             if any(word in line for word in NOISE + LIBRARY_LINES)]
    assert not noise, noise
    return result


def test_train_eval_and_score_print_no_deprecation_warnings(tiny_dir, tmp_path):
    common = [f"model.path={tiny_dir}", f"trainer.output_dir={tmp_path}", "trainer.max_steps=1",
              "rollout.max_new_tokens=8", "data.demo_train_size=40", "data.demo_val_size=4",
              "trainer.prompts_per_step=2", "trainer.mini_batch_prompts=2", "rollout.responses_per_prompt=2",
              "trainer.eval_samples=2", "trainer.progress=false"]
    train = rlpr("train", *common, "trainer.name=lora", cwd=tmp_path)
    assert "report: " in train.stderr and (tmp_path / "mpl").is_dir()  # the report drew its plots: matplotlib ran
    # no held-out set: the first checkpoint's save_pretrained is the first thing to import DeepSpeed (through
    # accelerate), whose "Setting accelerator to CPU" line a full fine-tuning run printed; the first run drew
    # the report (matplotlib) already
    rlpr("train", *common, "trainer.name=full", "model.lora=false", "model.gradient_checkpointing=true", "data.val=",
         "trainer.report=false", cwd=tmp_path)
    result = rlpr("eval", "--model", tiny_dir, "--checkpoint", str(tmp_path / "lora"), "--data",
                  str(ROOT / "examples" / "my_questions_val.jsonl"), "--limit", "3", "--samples", "2",
                  "--max-new-tokens", "8", "--output", str(tmp_path / "eval"), cwd=tmp_path)
    # issue 35, E3: no DeepSpeed accelerator warning (DeepSpeed is not used) and no per-file bars
    for library_line in ("Setting accelerator", "DeepSpeed", "Loading weights", "Writing model shards"):
        assert library_line not in result.stderr, result.stderr
    rlpr("score", "--model", tiny_dir, "--input", str(ROOT / "examples" / "score_example.jsonl"),
         "--output", str(tmp_path / "scored.jsonl"), cwd=tmp_path)


def test_a_first_run_on_a_gguf_file_converts_it_quietly(tiny_model, tokenizer, tmp_path):
    """A user's first `rlpr train` converts the GGUF once (the embedded model's is one): its console
    showed transformers' per-tensor "Converting and de-quantizing GGUF tensors" bar and DeepSpeed's
    "Setting accelerator to CPU" line beside rlpr's own "converting ... (once)"."""
    from rlpr.model.export import write_gguf

    gguf = tmp_path / "tiny.gguf"
    write_gguf(tiny_model, tokenizer, gguf, "f32")
    result = rlpr("train", f"model.path={gguf}", f"trainer.output_dir={tmp_path}", "trainer.max_steps=1",
                  "rollout.max_new_tokens=4", "data.demo_train_size=8", "data.val=", "trainer.prompts_per_step=2",
                  "trainer.mini_batch_prompts=2", "rollout.responses_per_prompt=2", "trainer.progress=false",
                  "trainer.report=false", cwd=tmp_path, RLPR_CACHE_DIR=str(tmp_path / "cache"))
    assert "converting tiny.gguf" in result.stderr and any((tmp_path / "cache" / "models").iterdir())


def test_help_lists_every_command(capsys):
    """`rlpr --help`'s description named ten commands by hand and left export out; it is now made
    from the commands registered."""
    from rlpr.cli.main import build_parser

    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    commands = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction").choices
    description = text[text.index("The rlpr command line:"):]
    for name in commands:
        assert (name if name != "data" else "data convert") in description, name
    assert "export" in description.split("positional arguments")[0]
