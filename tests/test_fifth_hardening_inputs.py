"""The fifth hardening pass (issue 60) on inputs and bounds: a temperature whose logits overflow is
refused by eval, serve and training (S8, S14), eval skips prompts longer than the model's context
(S9), every float key is bounded by float32's range (S12), a lone surrogate in a data file is one
line naming the file, row and field (S13), serve's token limits are checked against the context at
start (S15)."""

import json
import threading
from pathlib import Path

import pytest

from rlpr.cli.main import main
from rlpr.config import load_config
from rlpr.errors import ConfigError

pytestmark = pytest.mark.integration

DATA = str(Path(__file__).resolve().parents[1] / "examples" / "my_questions_val.jsonl")


def one_line_error(capsys, *words) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("rlpr: error")]
    assert len(lines) == 1, err
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


# -- S8, S14: a temperature whose logits overflow -----------------------------------------------------

def test_such_a_temperature_really_makes_the_sampler_draw_garbage():
    """Why the bound: logits / 1e-40 overflow to infinity and softmax returns NaN."""
    import torch

    from rlpr.rollout.sampling import PerRowSampler

    logits = torch.tensor([[12.0, 3.0, -4.0]])
    assert torch.isnan(PerRowSampler([0], temperature=1e-40).probabilities(logits)).all()
    assert torch.isfinite(PerRowSampler([0], temperature=1e-5).probabilities(logits)).all()


@pytest.mark.parametrize("temperature", ["1e-40", "1e-300", "5e-324", "9.9e-6"])
def test_eval_refuses_a_temperature_whose_logits_overflow(tiny_dir, tmp_path, capsys, no_model, temperature):
    assert main(["eval", "--model", tiny_dir, "--data", DATA, "--output", str(tmp_path / "e"),
                 "--temperature", temperature]) == 2
    one_line_error(capsys, f"--temperature {float(temperature)!r} is below 1e-05", "use 0 for greedy decoding")
    assert not (tmp_path / "e").exists()


def test_training_and_the_python_api_refuse_it_too(tiny_dir, tmp_path):
    import rlpr

    with pytest.raises(ConfigError, match=r"rollout.temperature: 1e-40 is below 1e-05"):
        load_config("demo", ["rollout.temperature=1e-40"])
    with pytest.raises(ConfigError, match=r"trainer.eval_temperature: 1e-40 is below 1e-05.*use 0 for rollout"):
        load_config("demo", ["trainer.eval_temperature=1e-40"])  # every temperature key
    cfg = load_config("demo", [f"model.path={tiny_dir}"])
    cfg.rollout.temperature = 1e-40
    with pytest.raises(ValueError, match="--temperature 1e-40 is below"):
        rlpr.evaluate(cfg, [DATA], output_dir=tmp_path / "e")
    assert load_config("demo", ["rollout.temperature=1e-5"]).rollout.temperature == 1e-5


def test_serve_answers_such_a_temperature_with_400(tokenizer):
    """It was a 500 from the NaN sampler."""
    from rlpr.evaluation.serve import ChatGenerator, make_server
    from rlpr.evaluation.serve_protocol import RequestError, parse_chat_request
    from rlpr.model.loading import tiny_llama

    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    with pytest.raises(RequestError, match="'temperature' 1e-40 is below 1e-05"):
        parse_chat_request({**body, "temperature": 1e-40})
    server = make_server(ChatGenerator(tiny_llama(tokenizer, layers=1, hidden=32), tokenizer, max_new_tokens=2),
                         "tiny", port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        import http.client

        for temperature, status in ((1e-40, 400), (1e-5, 200), (0, 200)):
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
            conn.request("POST", "/v1/chat/completions", json.dumps({**body, "temperature": temperature}),
                         {"Content-Type": "application/json"})
            reply = conn.getresponse()
            assert reply.status == status, (temperature, reply.read())
            conn.close()
    finally:
        server.shutdown()
        server.server_close()


# -- S12: every float key within float32's range ------------------------------------------------------

def _unbounded_float_keys():
    from rlpr.config.ranges import INF, RANGES, float_keys

    floats = float_keys(load_config("demo", []))
    return sorted(k for k, (low, high, _, _) in RANGES.items() if k in floats and high == INF)


@pytest.mark.parametrize("key", _unbounded_float_keys())
def test_every_float_key_is_bounded_by_float32(key):
    """algorithm.clip_high=1e39 or opsd.hybrid_lambda=1e39 passed and failed at the first update with a
    traceback (a float32 overflow), leaving a run folder whose name could not be used again."""
    from rlpr.config.ranges import check_ranges

    cfg = load_config("demo", [])
    section, name = key.split(".")
    setattr(getattr(cfg, section), name, 1e39)
    with pytest.raises(ConfigError, match=rf"{key}: 1e\+39 is beyond float32's range \(3\.403e\+38\)"):
        check_ranges(cfg)


def test_the_named_keys_and_a_huge_learning_rate_are_refused_before_the_run_folder(tmp_path, capsys):
    assert {"algorithm.clip_high", "opsd.hybrid_lambda", "trainer.lr"} <= set(_unbounded_float_keys())
    for override in ("algorithm.clip_high=1e39", "opsd.hybrid_lambda=3.5e38", "trainer.lr=1e308"):
        assert main(["train", override, f"trainer.output_dir={tmp_path}", "trainer.name=r"]) == 2
        one_line_error(capsys, "is beyond float32's range")
    assert not (tmp_path / "r").exists()
    assert load_config("demo", ["trainer.grad_clip=inf"]).trainer.grad_clip == float("inf")  # inf: no clipping


# -- S13: a lone surrogate in a data file --------------------------------------------------------------

def test_a_lone_surrogate_in_a_data_file_names_the_file_row_and_field(tiny_dir, tmp_path, capsys):
    """A traceback from eval and score ("surrogates not allowed"), and from train a line naming no
    file, row or field."""
    questions = tmp_path / "q.jsonl"
    questions.write_text('{"question": "Capital of France?", "answer": "Paris"}\n'
                         '{"question": "What is \\ud800 2+2?", "answer": "4"}\n')
    answers = tmp_path / "a.json"
    answers.write_text('[{"question": "Capital?", "answer": "Par\\udfffis"}]')
    scored = tmp_path / "s.jsonl"
    scored.write_text('{"prompt": "What is 2+2?", "response": "4 \\udfff", "reference": "4"}\n')
    for args, where in (
            (["eval", "--model", tiny_dir, "--data", str(questions), "--output", str(tmp_path / "e")],
             f"{questions}: row 2: field 'question'"),
            (["eval", "--model", tiny_dir, "--data", str(answers), "--output", str(tmp_path / "e")],
             f"{answers}: row 1: field 'answer'"),
            (["score", "--model", tiny_dir, "--input", str(scored), "--output", str(tmp_path / "s.out")],
             f"{scored}: row 1: field 'response'"),
            (["train", f"model.path={tiny_dir}", f"data.train={questions}", "data.val=",
              f"trainer.output_dir={tmp_path}", "trainer.name=r"], f"{questions}: row 2: field 'question'")):
        assert main(args) == 2, args
        one_line_error(capsys, where, "holds a lone surrogate")
    assert not (tmp_path / "e").exists() and not (tmp_path / "r").exists()


# -- S9: eval skips prompts longer than the model's context --------------------------------------------

def test_eval_skips_prompts_longer_than_the_context(tiny_model, tokenizer, tmp_path, capsys, caplog):
    import copy

    model = copy.deepcopy(tiny_model)
    model.config.max_position_embeddings = 400
    model.save_pretrained(tmp_path / "short")
    tokenizer.save_pretrained(tmp_path / "short")
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "Capital of France?", "answer": "Paris"}) + "\n"
                    + json.dumps({"question": "Summarize: " + "word " * 600, "answer": "words"}) + "\n")
    assert main(["eval", "--model", str(tmp_path / "short"), "--data", str(data), "--output", str(tmp_path / "e"),
                 "--max-new-tokens", "2"]) == 0
    err = caplog.text
    assert "q: skipped 1 of 2 questions whose prompt is longer than the model's context of 400 tokens" in err
    results = json.loads((tmp_path / "e" / "results.json").read_text())
    assert results["q"]["n_questions"] == 1 and results["q"]["skipped_too_long"] == 1
    assert len((tmp_path / "e" / "samples.jsonl").read_text().splitlines()) == 1
    data.write_text(json.dumps({"question": "Summarize: " + "word " * 600, "answer": "words"}) + "\n")
    assert main(["eval", "--model", str(tmp_path / "short"), "--data", str(data), "--output", str(tmp_path / "f"),
                 "--max-new-tokens", "2"]) == 2
    one_line_error(capsys, "q: every one of its 1 prompts is longer than the model's context of 400 tokens")


# -- S15: serve's token limits against the model's context ---------------------------------------------

@pytest.mark.parametrize("flags, message", [
    (["--max-new-tokens", "2048"], "--max-new-tokens 2048 leaves no room for a prompt in the model's context of "
                                   "2048 tokens"),
    (["--max-new-tokens", "100", "--max-prompt-tokens", "2000"],
     "--max-prompt-tokens 2000 plus --max-new-tokens 100 exceed the model's context of 2048 tokens"),
])
def test_serve_checks_its_token_limits_against_the_context_at_start(tiny_dir, capsys, flags, message):
    """A server that refused every prompt, or answered past its context, started without a word."""
    assert main(["serve", "--model", tiny_dir, "--port", "0", *flags]) == 2
    one_line_error(capsys, message)


# -- S7: YAML aliases and the values an error message prints are bounded -------------------------------

def _alias_bomb(levels: int = 7) -> str:
    """About 300 bytes of nested aliases that expand to 10^levels strings."""
    text = 'trainer:\n  lr: [&a ["xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",x,x,x,x,x,x,x,x,x]'
    prev = "a"
    for name in "bcdefghijk"[:levels - 1]:
        text += f", &{name} [" + ",".join([f"*{prev}"] * 10) + "]"
        prev = name
    return text + f", *{prev}]\n"


def test_a_yaml_alias_bomb_is_one_short_line(tmp_path, capsys):
    """A 466-byte file of nested aliases printed its expanded value: a 351 MB line, or a MemoryError."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    assert len(bomb.read_bytes()) < 500
    assert main(["config", "--preset", str(bomb)]) == 2
    line = one_line_error(capsys, f"{bomb}: not valid YAML (its aliases expand to more than 1 MiB")
    assert len(line) < 300
    (tmp_path / "loop.yaml").write_text("trainer: &a {lr: [*a]}\n")
    assert main(["config", "--preset", str(tmp_path / "loop.yaml")]) == 2
    one_line_error(capsys, "an alias refers to the value that holds it")


@pytest.mark.parametrize("value", ["[" + ",".join(["[1,2,3,4,5,6,7,8]"] * 2000) + "]", "x" * 1_000_000,
                                   "{" + ",".join(f"k{i}: {i}" for i in range(5000)) + "}"])
def test_every_value_an_error_prints_is_bounded(capsys, value):
    assert main(["config", f"trainer.lr={value}"]) == 2
    assert len(one_line_error(capsys, "trainer.lr: expected a number, got")) < 400
    assert main(["config", f"rollout.engine={value}"]) == 2  # a choice
    assert len(one_line_error(capsys, "rollout.engine:")) < 400


def test_every_yaml_reader_bounds_aliases(tmp_path):
    """The run's records are read with the same loader: a bomb in base_model.yaml is one line."""
    from rlpr.errors import yaml_load
    from rlpr.model.fingerprint import FINGERPRINT_FILE, check_base

    with pytest.raises(ValueError, match="aliases expand"):
        yaml_load(_alias_bomb())
    assert yaml_load("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}  # ordinary aliases load
    (tmp_path / FINGERPRINT_FILE).write_text(_alias_bomb())
    with pytest.raises(ConfigError, match="unreadable \\(its aliases expand"):
        check_base(tmp_path, "default", "--resume")
