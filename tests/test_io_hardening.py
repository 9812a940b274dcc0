"""Issue 29 (second hardening pass), the inputs, outputs and reports: a model folder's own code
never runs, the report escapes and survives whatever a run directory holds, unwritable outputs
fail at start in one line, graders are picked by exact names, `rlpr score` and `reward-quality
--build-from` validate their rows, over-long references are counted instead of scored 0 in
silence, the collapse warning means collapse, and a prompt must end with a user turn."""

from __future__ import annotations

import builtins
import json
import logging
import math
import shutil

import pytest
import yaml

from rlpr.cli.main import main
from rlpr.errors import DataError, ModelError

from helpers import fake_run, write_eval_data

pytestmark = pytest.mark.integration  # the CLI in-process, tiny models, a one-step training run


def one_error_line(capsys) -> str:
    """The single stderr line of a failed command (no traceback)."""
    err = capsys.readouterr().err.strip()
    assert err.startswith("rlpr: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture
def no_input(monkeypatch):
    """Answers "y" to any question on stdin, and records that it was asked."""
    asked = []
    monkeypatch.setattr(builtins, "input", lambda *a: (asked.append(a), "y")[1])
    return asked


def code_planting_folder(tmp_path, base=None, *, model_type="evil_custom"):
    """A model folder whose config.json maps the Auto classes to Python files in the folder; each
    file writes a marker file when imported."""
    folder = tmp_path / "planted"
    if base:
        shutil.copytree(base, folder)
        config = json.loads((folder / "config.json").read_text())
    else:
        folder.mkdir()
        config = {}
    marker = tmp_path / "MARKER"
    config.update(model_type=model_type, auto_map={"AutoConfig": "configuration_evil.EvilConfig",
                                                   "AutoModelForCausalLM": "modeling_evil.EvilModel"})
    (folder / "config.json").write_text(json.dumps(config))
    code = f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
    for name in ("configuration_evil.py", "modeling_evil.py"):
        (folder / name).write_text(code)
    return folder, marker


# --------------------------------------------------------------------------- 1. code in a model folder

def test_model_folder_code_never_runs(tmp_path, no_input, capsys):
    from rlpr.model.loading import load_model

    folder, marker = code_planting_folder(tmp_path)
    with pytest.raises(ModelError) as e:
        load_model(folder)
    assert str(e.value).startswith(f"{folder}: ") and "\n" not in str(e.value)
    assert "rlpr never runs code from a model folder" in str(e.value)
    assert not marker.exists() and not no_input  # nothing ran, nobody was asked
    # the command line: one line, exit 2
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert main(["eval", "--data", str(data), "--model", str(folder), "--output", str(tmp_path / "ev")]) == 2
    assert str(folder) in one_error_line(capsys)
    assert not marker.exists() and not no_input


def test_tokenizer_code_in_a_model_folder_never_runs(tmp_path, tiny_dir, no_input):
    from rlpr.model.loading import load_tokenizer

    folder = tmp_path / "tok"
    shutil.copytree(tiny_dir, folder)
    marker = tmp_path / "MARKER"
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="EvilTokenizer",
                  auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", "tokenization_evil.EvilTokenizer"]})
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    with pytest.raises(ModelError) as e:
        load_tokenizer(folder)
    assert str(e.value).startswith(f"{folder}: ") and "\n" not in str(e.value)
    assert "rlpr never runs code from a model folder" in str(e.value)
    assert not marker.exists() and not no_input


def test_a_known_architecture_loads_without_its_folder_code(tmp_path, tiny_dir, no_input):
    """auto_map beside a model_type transformers knows (many hub models ship both): the built-in
    class loads and the folder's code stays unread."""
    from rlpr.model.loading import load_model

    folder, marker = code_planting_folder(tmp_path, tiny_dir, model_type="llama")
    model, _ = load_model(folder)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert not marker.exists() and not no_input


# --------------------------------------------------------------------------- 2, 17. the report

XSS = ['<script>alert(1)</script>', '<img src=x onerror=alert(2)>', '"><svg onload=alert(3)>']
RAW = ("<script", "<img src=x", "<svg", "onerror=alert(2)>")


def planted_run(path, marker_index=0):
    """A run directory with markup in every field the report reads."""
    markup = XSS[marker_index % len(XSS)]
    run = fake_run(path)
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["preset"] = markup
    cfg["model"]["path"] = markup
    cfg["trainer"]["lr"] = markup
    cfg["trainer"][markup] = [markup, {markup: markup}]
    cfg[markup] = markup
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for r in records:
        r[f"reward/{markup}"] = 0.5
        r[f"eval/{markup}"] = 0.25
        r["eval/questions"] = markup
    records[-1]["eval/accuracy_se"] = markup
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    evaluation = {k: v for k, v in records[-1].items() if k.startswith("eval/")}
    summary = {"before": {**evaluation, "eval/accuracy": markup, "eval/samples": markup},
               "after": {**evaluation, "eval/samples": markup, f"eval/pass@{markup}": markup},
               "interrupted": markup}
    (run / "summary.yaml").write_text(yaml.safe_dump(summary))
    sample = next((run / "samples").glob("*.jsonl"))
    rows = [{"prompt": markup, "reference": markup, "response": markup, "reward": markup, "score_b": markup,
             "score_a": 0.1, "format": [markup], "correct": {markup: markup}},
            {"prompt": markup, "reference": markup, "response": markup, "reward": 0.2}]
    sample.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_report_escapes_every_field(tmp_path):
    from rlpr.report import write_report

    one = planted_run(tmp_path / XSS[1])  # the run's name is markup too
    page = write_report([one], tmp_path / "one.html").read_text()
    two = planted_run(tmp_path / "b", 2)
    both = write_report([one, two], tmp_path / "two.html").read_text()
    for text in (page, both):
        for raw in RAW:
            assert raw not in text, raw
        assert "&lt;script&gt;" in text and "&lt;img src=x onerror=alert(2)&gt;" in text
    assert "&quot;&gt;&lt;svg onload=alert(3)&gt;" in both
    assert "Sample responses" in page and "Reward (mean)" in page  # the rest of the report is still there


def test_one_bad_value_does_not_break_the_report(tmp_path):
    """A key that is matplotlib mathtext, bytes that are not UTF-8, and values of the wrong type or
    size in every file the report reads: the report is written, with the rest of the data."""
    from rlpr.report import write_report

    a = fake_run(tmp_path / "a$x^{$")  # mathtext in a run name (legends, titles)
    b = fake_run(tmp_path / "b")
    with open(a / "metrics.jsonl", "ab") as f:
        f.write(b'{"step": 4, "eval/$\\\\frac{$": 0.5, "policy/kl": 0.1, "eval/bad\xff\xfebytes": 0.2}\n')
        f.write(b'{"step": "x", "reward/mean": 0.3}\n{"step": null, "reward/mean": 0.3}\n')
        f.write(b'{"step": 1e999, "reward/mean": 0.3}\n{"step": NaN, "reward/mean": 0.3}\n')
        f.write(b'{"step": 5, "reward/mean": ' + b"9" * 5000 + b"}\n")  # beyond Python's int-string limit
        f.write(b'{"step": 5, "policy/entropy": ' + b"9" * 4000 + b"}\n")  # an int no float holds
        f.write(b'{"step": 5, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n")  # deep nesting
    sample = next((a / "samples").glob("*.jsonl"))
    sample.write_bytes(b'{"prompt": "caf\xe9", "reference": "x", "response": "r\xff", "reward": 0.9}\n'
                       + sample.read_bytes())  # the first prompt: the report shows it
    (b / "config.yaml").write_bytes((b / "config.yaml").read_bytes()
                                    + b"\nextra: \xff\nwhen: 2024-01-02\nmodel_note: [1, {2: 3}]\n")
    (b / "summary.yaml").write_text(yaml.safe_dump({"before": ["not", "a", "dict"], "after": "nor this"}))
    page = write_report([a, b], tmp_path / "r.html").read_text()
    assert "Reward (mean)" in page and "Sample responses" in page and "KL to the initial policy" in page
    assert "caf\ufffd" in page  # the bad byte is replaced, the row is kept
    single = write_report([a], tmp_path / "a.html").read_text()
    assert "Held-out: $\\frac{$" in single.replace("&#x27;", "'")  # drawn as text, not mathtext
    (b / "config.yaml").write_text("model: just-a-string\n")
    assert "Configuration" in write_report([b], tmp_path / "b.html").read_text()


# --------------------------------------------------------------------------- 13. unwritable outputs

@pytest.fixture
def blocked(tmp_path):
    """A path nobody can create (under a regular file; the tests may run as root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "out"


def test_unwritable_outputs_fail_at_start_in_one_line(tmp_path, blocked, tiny_dir, capsys, monkeypatch):
    import rlpr.model.loading as loading

    def no_model(*a, **k):
        raise AssertionError("the model was loaded before the output was checked")

    monkeypatch.setattr(loading, "load_policy", no_model)
    monkeypatch.setattr(loading, "load_model", no_model)
    math_file, _ = write_eval_data(tmp_path)
    assert main(["eval", "--data", str(math_file), "--model", tiny_dir, "--output", str(blocked)]) == 2
    assert f"{blocked}: cannot write" in one_error_line(capsys)

    responses = tmp_path / "responses.jsonl"
    responses.write_text(json.dumps({"index": 0, "response": "<answer>0</answer>"}) + "\n")
    assert main(["grade", "--data", str(math_file), "--responses", str(responses), "--output", str(blocked)]) == 2
    assert f"{blocked}: cannot write" in one_error_line(capsys)

    run = fake_run(tmp_path / "run")
    assert main(["report", str(run), "-o", str(blocked / "r.html")]) == 2
    assert f"{blocked / 'r.html'}: cannot write" in one_error_line(capsys)
    assert main(["report", str(run), "-o", str(tmp_path / "r.html"), "--png-dir", str(blocked)]) == 2
    assert f"{blocked}: cannot write" in one_error_line(capsys)
    assert not (tmp_path / "r.html").exists()  # refused before anything was written

    flat = tmp_path / "flat.jsonl"
    flat.write_text(json.dumps({"question": "q", "answer": "a"}) + "\n")
    assert main(["data", "convert", "--format", "jsonl", "--input", str(flat),
                 "--output", str(blocked / "x.parquet")]) == 2
    assert f"{blocked / 'x.parquet'}: cannot write" in one_error_line(capsys)
    assert main(["data", "convert", "--format", "jsonl", "--input", str(flat), "--output", str(tmp_path)]) == 2
    one_error_line(capsys)  # a directory where the file should go

    labeled = tmp_path / "labeled.jsonl"
    labeled.write_text(json.dumps({"prompt": "q", "response": "r", "reference": "a", "correct": True}) + "\n")
    assert main(["reward-quality", "--input", str(labeled), "--model", tiny_dir, "--output", str(blocked)]) == 2
    assert f"{blocked}: cannot write" in one_error_line(capsys)
    assert main(["reward-quality", "--build-from", str(flat), "--samples", "1", "--model", tiny_dir,
                 "--output", str(blocked / "l.jsonl")]) == 2
    assert f"{blocked / 'l.jsonl'}: cannot write" in one_error_line(capsys)


def test_writable_output_checks_leave_nothing_behind(tmp_path):
    from rlpr.cli.outputs import check_output_dir, check_output_file

    check_output_dir(tmp_path / "new" / "deeper")
    check_output_file(tmp_path / "other" / "f.parquet")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


# --------------------------------------------------------------------------- 14. graders by name

@pytest.mark.parametrize("data_source, ability, expected", [
    ("trivia_reclaimed", "", "short_answer"),  # "aime" inside a word
    ("scamcheck", "", "short_answer"),  # "amc" inside a word
    ("gpqa_like_but_free", "", "short_answer"),  # "gpqa" followed by other words
    ("mathematics_quiz", "", "short_answer"),
    ("summary_of_mmlu_talk", "", "short_answer"),
    ("my_theoremqa_notes", "", "short_answer"),
    ("gpqa", "", "multiple_choice"), ("gpqa_diamond_Avg4", "", "multiple_choice"),
    ("MMLU_Pro_Avg4", "", "multiple_choice"), ("MMLUPro-1000_Avg2", "", "multiple_choice"),
    ("mmlu_pro_test_1000_seed0", "", "multiple_choice"), ("mmlu/abstract_algebra", "", "multiple_choice"),
    ("bbh-multiple-choice", "", "multiple_choice"),
    ("aime24_Avg16", "", "math"), ("AIME2024", "", "math"), ("aime_2025", "", "math"), ("amc23", "", "math"),
    ("Math-500_Avg2", "", "math"), ("math500", "", "math"), ("minerva_math", "", "math"),
    ("theoremqa_test", "", "math"), ("TheoremQA", "", "math"), ("gsm8k_val", "", "math"),
    ("trivia_reclaimed", "math", "math"),  # the ability still says math
    ("bbh/date_understanding", "", "short_answer"), ("WebInstruct-verified", "", "short_answer"),
])
def test_grader_for_matches_names_exactly(data_source, ability, expected):
    from rlpr.grading import grader_for

    assert grader_for(data_source, ability) == expected


# --------------------------------------------------------------------------- 15. rlpr score rows

@pytest.mark.parametrize("row, message", [
    ({"prompt": [{"role": "robot", "content": "q"}], "response": "r", "reference": "a"},
     r"row 1: field 'prompt\[0\].role' is 'robot'"),
    ({"prompt": [{"role": "assistant", "content": "q"}], "response": "r", "reference": "a"},
     r"row 1: field 'prompt\[0\].role' is 'assistant'"),
    ({"prompt": "q", "response": "r", "reference": "a", "score_a": float("nan")},
     "row 1: field 'score_a' must be a finite number"),
    ({"prompt": "q", "response": "r", "reference": "a", "scoreA": float("inf")},
     "row 1: field 'scoreA' must be a finite number"),
    ({"prompt": "q", "response": "r", "reference": "a", "score_a": True},
     "row 1: field 'score_a' must be a finite number"),
])
def test_score_rows_are_validated(tmp_path, row, message):
    from rlpr.evaluation.score_file import read_score_rows

    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(row) + "\n")  # json writes NaN and Infinity, as a careless tool does
    with pytest.raises(DataError, match=f"{path}: {message}"):
        read_score_rows(path, "plain")


def test_score_output_is_strict_json(tmp_path, tiny_dir):
    rows = tmp_path / "in.jsonl"
    rows.write_text(json.dumps({"prompt": "q", "response": "<think> a </think> <answer> x </answer>",
                                "reference": "x", "note": float("nan"), "more": [float("-inf")]}) + "\n")
    out = tmp_path / "out.jsonl"
    assert main(["score", "--input", str(rows), "--output", str(out), "--model", tiny_dir]) == 0

    def refuse(name):
        raise AssertionError(f"{name} in the output")

    row = json.loads(out.read_text(), parse_constant=refuse)
    assert row["note"] is None and row["more"] == [None] and math.isfinite(row["reward"])


def test_score_on_a_disk_that_fills_up_is_one_line_and_leaves_no_file(tmp_path, tiny_dir, capsys, monkeypatch):
    import rlpr.errors

    from test_trackers import FullDisk

    rows = tmp_path / "in.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "response": "<answer> x </answer>", "reference": "x"})
                            + "\n" for i in range(3)))
    out = tmp_path / "out.jsonl"
    out.write_text("an earlier output\n")
    monkeypatch.setattr(rlpr.errors, "open", FullDisk(lambda path: True), raising=False)  # atomic_output's
    assert main(["score", "--input", str(rows), "--output", str(out), "--model", tiny_dir]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"rlpr: error: cannot write {out}: No space left on device"
    assert out.read_text() == "an earlier output\n"  # untouched, no partial file beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.jsonl", "out.jsonl"]


# --------------------------------------------------------------------------- 16. duplicate ids

def test_duplicate_ids_in_build_from_are_refused(tmp_path, tiny_dir, capsys, monkeypatch):
    import rlpr.model.loading as loading

    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"q{n}", "answer": "a"}) + "\n"
                            for n, i in enumerate(["x", "y", "x"])))
    monkeypatch.setattr(loading, "load_policy", lambda *a, **k: pytest.fail("the model loaded first"))
    assert main(["reward-quality", "--build-from", str(data), "--samples", "1", "--model", tiny_dir,
                 "--max-new-tokens", "2", "--output", str(tmp_path / "l.jsonl")]) == 2
    err = one_error_line(capsys)
    assert f"{data}: rows 1 and 3 share the id 'x'" in err
    assert not (tmp_path / "l.jsonl").exists()
    # beyond --limit a duplicate does not matter
    from rlpr.evaluation.reward_quality import build_examples

    assert len(build_examples(data, limit=2)) == 2


# --------------------------------------------------------------------------- 5. over-long references

def test_over_long_scored_texts_are_counted_and_warned_once(tiny_model, tokenizer, caplog):
    from rlpr.config import RewardConfig
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.train.metrics import Group, rollout_metrics

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Capital of France?"}], tokenize=False,
                                           add_generation_prompt=True)
    n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    reward = ProbabilityReward(RewardConfig(), tokenizer, max_length=n_prompt + 40)
    response = "<think> a </think> <answer> x </answer>"
    references = ["Paris", "Paris " * 60, "Paris"]
    with caplog.at_level(logging.WARNING):
        outs = reward(tiny_model, [prompt] * 3, [response] * 3, references)
        again = reward(tiny_model, [prompt], [response], [references[1]])
    assert [o.too_long for o in outs] == [False, True, False] and again[0].too_long
    warnings = [r.getMessage() for r in caplog.records if "reward/too_long_frac" in r.getMessage()]
    assert len(warnings) == 1 and f"{n_prompt + 40} tokens" in warnings[0]

    class R:
        token_ids, finished, text = [1, 2], True, "t"

    class P:  # what the rollout metrics read of a Prompt
        class example:
            reference = "Paris"

        def response_text(self, text):
            return text

    m = rollout_metrics([Group(prompt=P(), rollouts=[R()] * 3, rewards=outs)])
    assert m["reward/too_long_frac"] == pytest.approx(1 / 3)
    invalid = reward(tiny_model, [prompt], ["no tags"], [references[1]])  # unscored anyway: not "too long"
    assert not invalid[0].too_long


def test_training_logs_the_too_long_fraction(tmp_path, tokenizer, caplog):
    from rlpr.model.loading import tiny_llama
    from rlpr.train.trainer import train

    from helpers import tiny_cfg

    model = tiny_llama(tokenizer)
    model.config.max_position_embeddings = 200  # room for the prompt and response, not for this reference
    short_ctx = tmp_path / "short-ctx"
    model.save_pretrained(short_ctx)
    tokenizer.save_pretrained(short_ctx)
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"question": f"Say {i}", "answer": "word " * 150}) + "\n" for i in range(4)))
    with caplog.at_level(logging.WARNING):
        train(tiny_cfg(str(short_ctx), tmp_path / "runs", "long", f"data.train={data}", "data.val=",
                       "trainer.max_steps=1", "reward.invalid_fallback=free", "trainer.sample_every=0"))
    lines = [json.loads(line) for line in (tmp_path / "runs" / "long" / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward/too_long_frac"] for r in lines if "reward/too_long_frac" in r] == [1.0]
    assert sum("reward/too_long_frac" in r.getMessage() for r in caplog.records) == 1


# --------------------------------------------------------------------------- 19. collapse warning

@pytest.mark.parametrize("n, distinct_frac, warned", [
    (2, 1.0, False), (2, 0.75, False), (2, 0.5, True),  # two responses that differ are not a collapse
    (1, 1.0, False),  # one response per prompt: nothing to compare
    (4, 1.0, False), (4, 0.5, True), (4, 0.25, True), (3, 2 / 3, True), (3, 1.0, False),
    (8, 0.25, True), (8, 0.375, False),
])
def test_collapse_warning_only_on_collapse(n, distinct_frac, warned, caplog):
    from rlpr.train.metrics import flag_collapse

    with caplog.at_level(logging.WARNING, logger="rlpr.train"):
        flag_collapse(7, {"rollout/distinct_frac": distinct_frac}, n)
    assert bool(caplog.records) is warned


# --------------------------------------------------------------------------- 21. prompts end with a user turn

@pytest.mark.parametrize("prompt, field", [
    ([{"role": "assistant", "content": "Paris is the capital."}], "prompt[0].role"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "prompt[1].role"),
    ([{"role": "system", "content": "be brief"}], "prompt[0].role"),
])
def test_a_prompt_must_end_with_a_user_turn(tmp_path, prompt, field):
    from rlpr.data.loading import load_examples

    path = tmp_path / "d.jsonl"
    good = {"data_source": "x", "prompt": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"}],
            "reward_model": {"ground_truth": "a"}}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "prompt": prompt}) + "\n")
    with pytest.raises(DataError) as e:
        load_examples(str(path))
    assert str(e.value).startswith(f"{path}: row 2: field '{field}'") and "user" in str(e.value)
    path.write_text(json.dumps(good) + "\n")
    assert len(load_examples(str(path))) == 1


def test_a_full_or_read_only_disk_under_any_command_is_one_line(monkeypatch, capsys):
    import errno

    import rlpr.cli.main as cli

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "out/samples.jsonl")

    monkeypatch.setattr(cli, "cmd_config", full)
    assert cli.main(["config"]) == 2
    assert capsys.readouterr().err.strip() == \
        "rlpr: error: out/samples.jsonl: No space left on device (run with -v for a traceback)"

    def bug(args):
        raise OSError(errno.EBADF, "Bad file descriptor")  # not the user's disk: a real traceback

    monkeypatch.setattr(cli, "cmd_config", bug)
    with pytest.raises(OSError):
        cli.main(["config"])


@pytest.mark.parametrize("damage", ["cut", "garbage"])
def test_a_cut_or_corrupt_gguf_is_one_line_for_train_and_plan(tiny_model, tokenizer, tmp_path, capsys, monkeypatch,
                                                                  damage):
    """A `.gguf` model.path that is cut short or is not a GGUF inside: transformers' readers raised
    struct.error (and the like) through the conversion as a traceback; now one line naming the file."""
    from rlpr.model.export import write_gguf

    monkeypatch.setenv("RLPR_CACHE_DIR", str(tmp_path / "cache"))
    whole = tmp_path / "whole.gguf"
    write_gguf(tiny_model, tokenizer, whole, "f32")
    bad = tmp_path / f"{damage}.gguf"
    bad.write_bytes(whole.read_bytes()[:300_000] if damage == "cut" else b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    assert main(["train", f"model.path={bad}", f"trainer.output_dir={tmp_path / 'runs'}", "trainer.max_steps=1"]) == 2
    err = one_error_line(capsys)
    assert f"{bad}: cannot read it as a GGUF model" in err
    assert not any((tmp_path / "cache" / "models").glob("*/config.json"))  # no half-converted copy
    assert main(["plan", f"model.path={bad}"]) == 2
    assert f"{bad}: cannot read the GGUF metadata" in one_error_line(capsys)
