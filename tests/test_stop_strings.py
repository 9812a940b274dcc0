"""rollout.stop (issue 33: a base model answering in the Question/Answer format goes on to ask itself the
next question) and the Question/Answer chat template of tokenizers that have none."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import torch

from rlpr.config import load_config
from rlpr.model.loading import QA_CHAT_TEMPLATE
from rlpr.reward.sequence import turn_cue
from rlpr.rollout.engines import StopAt, build_engine
from rlpr.rollout.hf import Rollout, stop_tokens

pytestmark = pytest.mark.unit


def test_cut_at_the_first_stop_string(tokenizer):
    ids = tokenizer("Paris\nQuestion: what else?", add_special_tokens=False)["input_ids"]
    text = tokenizer.decode(ids, skip_special_tokens=True)
    r = StopAt(None, tokenizer, ["\n"]).cut(Rollout(0, ids, text, False))
    assert r.text == "Paris" and r.finished
    assert "\n" in tokenizer.decode(r.token_ids) and "\n" not in tokenizer.decode(r.token_ids[:-1])
    r = StopAt(None, tokenizer, ["Question:", "\n"]).cut(Rollout(0, ids, text, False))
    assert r.text == "Paris"  # the earliest of several
    unchanged = Rollout(0, ids[:1], tokenizer.decode(ids[:1]), True)
    assert StopAt(None, tokenizer, ["\n"]).cut(unchanged) is unchanged


def test_stop_tokens_hold_the_string(tokenizer):
    ends = stop_tokens(tokenizer, ["\n"])
    assert ends and all("\n" in tokenizer.decode([t]) for t in ends)
    assert stop_tokens(tokenizer, []) == () and stop_tokens(tokenizer, [""]) == ()


@pytest.mark.parametrize("loop", ["rlpr", "generate"])
def test_stopped_responses_are_the_unstopped_ones_cut(tiny_model, tokenizer, loop):
    """Rows end early at a token holding the stop string; each response equals the one sampled without
    the stop, cut there (per-row seeded sampling is the same up to the cut)."""
    prompts = [tokenizer(f"Question {i}:", add_special_tokens=False)["input_ids"] for i in range(4)]
    ends = list(stop_tokens(tokenizer, ["\n"]))

    def engine(stop):
        cfg = load_config("demo", ["model.rollout_dtype=float32", f"rollout.decode_loop={loop}"] +
                          ([f"rollout.stop={stop}"] if stop else []))
        return build_engine(tiny_model, tokenizer, cfg.rollout, torch.float32)

    plain, stopped = engine(None), engine('["\\n"]')
    # make the stop likely: the tiny random model gives the newline tokens a large logit
    for e in (plain, stopped):
        with torch.no_grad():
            e.model.get_output_embeddings().weight[ends] *= 40
    kw = dict(max_new_tokens=12, temperature=1.0, top_p=1.0, seeds=[1, 2, 3, 4])
    a, b = plain.generate(prompts, 3, **kw), stopped.generate(prompts, 3, **kw)
    assert any("\n" in r.text for r in a)  # the test means something
    cut = StopAt(None, tokenizer, ["\n"])
    for x, y in zip(a, b):
        assert "\n" not in y.text
        assert cut.cut(x).text == y.text and cut.cut(x).token_ids == y.token_ids


def test_qa_template_for_a_tokenizer_without_one(tokenizer):
    tok = copy.deepcopy(tokenizer)  # the session's tokenizer keeps its own template
    tok.chat_template = QA_CHAT_TEMPLATE
    text = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}], tokenize=False,
                                   add_generation_prompt=True)
    assert text == f"{tok.bos_token}Question: What is the capital of France?\nAnswer:"
    cue = turn_cue(tok, "Repeat your answer.")
    assert cue == "\n\nQuestion: Repeat your answer.\nAnswer:"


def test_loading_gives_a_template_to_a_tokenizer_without_one(tiny_dir, tmp_path):
    from rlpr.model.loading import load_tokenizer

    folder = tmp_path / "base-model"
    shutil.copytree(tiny_dir, folder)
    config = folder / "tokenizer_config.json"
    data = json.loads(config.read_text())
    data.pop("chat_template", None)
    config.write_text(json.dumps(data))
    for extra in folder.glob("chat_template.*"):
        extra.unlink()
    assert load_tokenizer(folder).chat_template == QA_CHAT_TEMPLATE
