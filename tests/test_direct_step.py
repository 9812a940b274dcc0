"""rollout/direct_step.py: a decode step through Llama-shaped layers called directly gives the same
logits, bit for bit, as the model's own forward (fp32 and bf16, with and without left padding, on a
plain and a preallocated cache, and with the rollout copy's prepacked weights), and the families or
settings it does not cover take the model's forward."""

import pytest
import torch

from rlpr.model import prepacked
from rlpr.model.forward import cache_kwargs, position_ids_from_mask
from rlpr.rollout import direct_step
from rlpr.rollout.decode import preallocated_cache
from rlpr.rollout.direct_step import step_function

from test_model_families import _build

pytestmark = pytest.mark.unit

COVERED = ["llama3", "qwen2.5", "qwen3"]


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _model(name, tokenizer, dtype=torch.float32):
    torch.manual_seed(0)
    return _build(name, tokenizer).to(dtype).eval().requires_grad_(False)


def _decode(model, step, padded: bool, steps: int = 4, preallocated: bool = True) -> torch.Tensor:
    """Greedy logits of `steps` decode steps after a prefill of 3 prompts; each step through `step`
    (None: the model's forward)."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(10, 1000, (3, 9), generator=g)
    attn = torch.ones_like(ids)
    if padded:
        attn[0, :4] = 0
        attn[2, :1] = 0
    mask = torch.zeros(3, 9 + steps, dtype=attn.dtype)
    mask[:, :9] = attn
    pos = position_ids_from_mask(attn)
    cache = preallocated_cache(model.config, 9 + steps) if preallocated else None
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=pos, **cache_kwargs(model, cache),
                    use_cache=True, logits_to_keep=1)
    cache = out["cache"] if "cache" in out else out["past_key_values"]
    feed, pos, length, rows = out.logits[:, -1].argmax(-1)[:, None], pos[:, -1:] + 1, 9, []
    for _ in range(steps):
        mask[:, length] = 1
        length += 1
        if step is None:
            with torch.no_grad():
                logits = model(input_ids=feed, attention_mask=mask[:, :length], position_ids=pos,
                               **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1).logits[:, -1]
        else:
            logits = step(feed, mask[:, :length], pos, cache)
        rows.append(logits.float())
        feed, pos = logits.argmax(-1)[:, None], pos + 1
    return torch.stack(rows)


@pytest.mark.parametrize("name", COVERED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_logits_as_the_models_forward(name, dtype, tokenizer):
    model = _model(name, tokenizer, dtype)
    step = step_function(model)
    assert step is not None
    for padded in (True, False):
        for preallocated in (True, False):
            assert torch.equal(_decode(model, step, padded, preallocated=preallocated),
                               _decode(model, None, padded, preallocated=preallocated)), (padded, preallocated)


def test_same_logits_on_prepacked_weights(tokenizer):
    if not prepacked.available(torch.bfloat16):
        pytest.skip("this CPU cannot prepack bf16 weights for oneDNN")
    model = _model("llama3", tokenizer, torch.bfloat16)
    prepacked.prepack(model)
    assert torch.equal(_decode(model, step_function(model), True), _decode(model, None, True))


@pytest.mark.parametrize("name", ["gemma2", "gemma3", "mistral", "phi3"])
def test_other_families_take_the_models_forward(name, tokenizer):
    assert step_function(_model(name, tokenizer)) is None


def test_settings_it_does_not_cover_take_the_models_forward(tokenizer, monkeypatch):
    model = _model("llama3", tokenizer)
    handle = model.model.layers[0].mlp.register_forward_hook(lambda *a: None)  # would be skipped
    assert step_function(model) is None
    handle.remove()
    handle = model.model.embed_tokens.register_forward_pre_hook(lambda *a: None)  # called as a module: runs
    assert step_function(model) is not None
    handle.remove()
    model.set_attn_implementation("eager")
    assert step_function(model) is None
    model.set_attn_implementation("sdpa")
    monkeypatch.setattr(direct_step, "ENABLED", False)
    assert step_function(model) is None


def test_the_decode_loop_draws_the_same_tokens_either_way(tokenizer, monkeypatch):
    from rlpr.rollout.hf import HFRollout

    model = _model("qwen3", tokenizer)
    engine = HFRollout(model, tokenizer, torch.bfloat16)
    prompts = [tokenizer("What is the capital of France?")["input_ids"], tokenizer("Name a colour.")["input_ids"]]

    def tokens():
        return [r.token_ids for r in engine.generate(prompts, 3, max_new_tokens=12, temperature=1.0, top_p=1.0,
                                                     seeds=[5, 6])]

    direct = tokens()
    monkeypatch.setattr(direct_step, "ENABLED", False)
    assert tokens() == direct
