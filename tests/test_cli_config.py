"""One Config for every command (issue 15): `rlpr eval`, `serve` and `reward-quality` read
`model.*`, `rollout.*` and `reward.*` from the tree `rlpr train` reads, with presets, config files
and dotted overrides; their flags are shorthands for config keys, and of a flag and an override of
one key the later on the command line wins."""

from __future__ import annotations

import pytest

from rlpr.cli.main import build_parser, main
from rlpr.cli.options import command_config

pytestmark = pytest.mark.integration

EVAL = ["eval", "--data", "bench.jsonl", "--output", "out"]


def effective(argv: list[str]):
    """The Config a command's handler would build from `argv` (not run)."""
    return command_config(build_parser().parse_args(argv)).to_dict()


def test_a_flag_and_an_override_give_the_same_config():
    assert effective([*EVAL, "rollout.max_new_tokens=8"]) == effective([*EVAL, "--max-new-tokens", "8"])
    assert effective([*EVAL, "model.device=cpu", "rollout.temperature=0"]) == \
        effective([*EVAL, "--device", "cpu", "--temperature", "0"])
    rq = ["reward-quality", "--input", "x.jsonl", "--output", "o"]
    assert effective([*rq, "reward.invalid_fallback=free"]) == effective([*rq, "--fallback", "free"])
    serve = ["serve", "--port", "0"]
    assert effective([*serve, "model.threads=1"]) == effective([*serve, "--threads", "1"])


def test_the_later_setting_of_a_key_wins():
    assert effective([*EVAL, "--max-new-tokens", "8", "rollout.max_new_tokens=16"])["rollout"]["max_new_tokens"] == 16
    assert effective(["eval", "rollout.max_new_tokens=16", "--max-new-tokens", "8", "--data", "b.jsonl",
                      "--output", "o"])["rollout"]["max_new_tokens"] == 8
    # an override typed among the --data files is an override, not a file
    args = build_parser().parse_args(["eval", "--data", "a.jsonl", "b.jsonl", "rollout.top_p=0.5", "--output", "o"])
    assert args.data == ["a.jsonl", "b.jsonl"] and command_config(args).rollout.top_p == 0.5


def test_command_defaults_sit_under_the_preset():
    assert effective(EVAL)["rollout"]["max_new_tokens"] == 1024  # eval's own default, as before
    assert effective([*EVAL, "--preset", "demo"])["rollout"]["max_new_tokens"] == 32  # the preset's
    assert effective(["serve", "--port", "0"])["rollout"]["max_new_tokens"] == 256
    assert effective(["reward-quality", "--input", "x", "--output", "o"])["reward"] == effective(
        ["score", "--input", "x", "--output", "o"])["reward"]  # no preset: the documented defaults


def test_a_preset_applies_to_reward_quality(monkeypatch, tmp_path):
    cfg = command_config(build_parser().parse_args(["reward-quality", "--preset", "demo", "--input", "x",
                                                    "--output", "o"]))
    assert cfg.reward.invalid_fallback == "free" and cfg.reward.answer_turn and cfg.reward.alpha == 0.0
    # and the handler scores with exactly that reward config
    import rlpr.cli.evaluation as cli_eval
    import rlpr.evaluation.reward_quality as rq

    seen = {}

    def fake_quality(model, tokenizer, rows, output_dir, *, reward_cfg, **kw):
        seen["reward"] = reward_cfg
        return {"n_mixed_groups": 0, "n_mixed_rows": 0, "scores": {}}

    monkeypatch.setattr(rq, "read_labeled", lambda path, template: [])
    monkeypatch.setattr(rq, "reward_quality", fake_quality)
    monkeypatch.setattr(cli_eval, "_load", lambda cfg, checkpoint: (None, None))
    assert main(["reward-quality", "--preset", "demo", "--input", "x", "--output", str(tmp_path),
                 "reward.alpha=0.5"]) == 0
    assert seen["reward"].answer_turn == cfg.reward.answer_turn and seen["reward"].alpha == 0.5


def test_a_config_file_works_for_eval(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("rollout:\n  max_new_tokens: 12\n  temperature: 0.5\n")
    cfg = effective([*EVAL, "--config", str(path), "--temperature", "0.7"])
    assert cfg["rollout"]["max_new_tokens"] == 12 and cfg["rollout"]["temperature"] == 0.7


@pytest.mark.parametrize("command", [
    ["train"], [*EVAL], ["serve", "--port", "0"], ["reward-quality", "--input", "x", "--output", "o"],
    ["score", "--input", "x", "--output", "o"],
])
def test_an_unknown_key_is_the_same_one_line_error_everywhere(command, capsys):
    assert main([*command, "rollout.max_new_tokenz=8"]) == 2
    err = capsys.readouterr().err
    assert err == "rlpr: error: unknown config key 'rollout.max_new_tokenz' (did you mean " \
                  "'rollout.max_new_tokens'?)\n"


def test_commands_that_do_not_train_check_only_what_they_read(tmp_path, capsys):
    # data.* is training's: eval does not check it (the missing benchmark file is the error)
    assert main(["eval", "--data", str(tmp_path / "missing.jsonl"), "--output", str(tmp_path),
                 "data.train=/nowhere.parquet", "rollout.temperature=0"]) == 2
    assert "missing.jsonl: file not found" in capsys.readouterr().err
    assert main([*EVAL, "rollout.temperature=nan"]) == 2
    assert "rollout.temperature: must be in [0, inf), got nan" in capsys.readouterr().err
    assert main(["serve", "--port", "0", "--threads", "-1"]) == 2
    assert "model.threads: must be in [0, inf), got -1" in capsys.readouterr().err


def test_rlpr_config_prints_the_effective_tree(capsys):
    import yaml

    assert main(["config", "--preset", "small", "reward.alpha=0.25"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["preset"] == "small" and tree["reward"]["alpha"] == 0.25
    assert tree["data"]["demo_val_size"] == 203


def test_eval_builds_flat_prompts_with_the_presets_template(monkeypatch, tmp_path, capsys):
    """Flat rows get `data.template`, as `rlpr train` builds them (before: always r1)."""
    import json

    import rlpr.evaluation.benchmark as bench

    data = tmp_path / "qa.jsonl"
    data.write_text(json.dumps({"question": "Capital of France?", "answer": "Paris"}) + "\n")
    seen = {}

    def fake_load(files, samples, limit, template, **kwargs):
        seen["benchmarks"] = real_load(files, samples, limit, template, **kwargs)
        raise SystemExit(0)  # stop before any model work

    real_load = bench.load_benchmarks
    monkeypatch.setattr(bench, "load_benchmarks", fake_load)
    for preset, system in (("small", False), (None, True)):
        argv = ["eval", "--data", str(data), "--output", str(tmp_path / "o")] + (["--preset", preset] if preset else [])
        with pytest.raises(SystemExit):
            main(argv)
        prompt = seen["benchmarks"][0].examples[0].prompt
        assert (prompt[0]["role"] == "system") is system  # plain: the question alone; r1: the paper's system prompt
    assert main(["eval", "--data", str(data), "--output", str(tmp_path / "o"), "data.template=nope"]) != 0
    assert "data.template: 'nope' is not one of" in capsys.readouterr().err


@pytest.mark.parametrize("text,reason", [
    ("trainer:\n  max_steps: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deep"),
    ("trainer:\n  max_steps: " + "1" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
    ("trainer:\n  name: caf\xe9\n", "'utf-8' codec can't decode byte 0xe9"),
])
def test_a_config_file_yaml_cannot_read_names_the_file(tmp_path, capsys, text, reason):
    """Nesting a thousand deep was a RecursionError traceback; an integer of over 4300 digits and a
    file that is not UTF-8 were lines naming no file (yaml.safe_load raises no YAMLError on them)."""
    path = tmp_path / "mine.yaml"
    path.write_bytes(text.encode("latin-1"))
    assert main(["config", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"rlpr: error: {path}: not valid YAML ({reason}") and "\n" not in err, err


def test_an_override_yaml_cannot_read_is_its_text(capsys):
    """`key=[[[...` a thousand deep was a RecursionError traceback and `key=111...` (5000 digits) a
    line naming no key: the value is the text as typed, as for any text YAML cannot read."""
    for value in ("[" * 5000, "1" * 5000):
        assert main(["config", f"trainer.max_steps={value}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"rlpr: error: trainer.max_steps: expected an integer, got '{value[:20]}") and \
            "\n" not in err, err[:300]
    assert main(["config", "trainer.name=" + "[" * 5000]) == 0  # a string key takes the text
    assert "name: '" + "[" * 5000 in capsys.readouterr().out
