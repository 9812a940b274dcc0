"""rlpr/rollout/fused_step.py: the static loop's step on fused q/k/v and gate/up weights (Llama-shaped
families). The weights stay the rollout copy's own (views of the fused tensors, written by `sync`),
the logits are the model forward's up to a wider product's rounding, and the static loop's tokens are
the same with the fused step as without it, greedy and seeded, on Llama, Qwen2 (biased q/k/v) and
Qwen3 (q/k norms)."""

import copy

import pytest
import torch

from rlpr.rollout import fused_step, graph_decode
from rlpr.rollout.hf import HFRollout
from rlpr.rollout.sampling import PerRowSampler

pytestmark = pytest.mark.unit

VOCAB = 256
DECODE = graph_decode.DECODE_ATTENTION


def _model(name):
    import transformers as tf

    base = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, initializer_range=0.1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    if name == "llama":
        model = tf.LlamaForCausalLM(tf.LlamaConfig(**base))
    elif name == "qwen2":
        model = tf.Qwen2ForCausalLM(tf.Qwen2Config(**base))
    else:
        model = tf.Qwen3ForCausalLM(tf.Qwen3Config(**base, head_dim=16))
    return model.eval().requires_grad_(False)  # a frozen copy, as the rollout engine's


def _batch():
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (6, 20), generator=g)
    attn = torch.ones_like(ids)
    attn[0, :7] = attn[3, :2] = 0  # left padding
    return ids, attn


@pytest.mark.parametrize("name", ["llama", "qwen2", "qwen3"])
def test_fused_step_tokens_equal_the_model_forward(name, monkeypatch):
    model = _model(name)
    ids, attn = _batch()
    assert fused_step.fused_step(model, DECODE) is not None
    out = {}
    for enabled in (True, False):
        monkeypatch.setattr(fused_step, "ENABLED", enabled)
        out[enabled] = [graph_decode.static_sample(model, ids, attn, sampler, max_new_tokens=16, eos=2, pad=0)
                        for sampler in (None, PerRowSampler(list(range(6))), PerRowSampler(list(range(6)), 0.7, 0.9))]
    for fused, plain in zip(out[True], out[False]):
        assert torch.equal(fused, plain)


def test_one_fused_step_gives_the_forward_logits():
    model = _model("qwen2")
    ids, attn = _batch()
    cache = graph_decode.DynamicCache(config=model.config)
    from rlpr.model.forward import cache_kwargs, position_ids_from_mask

    positions = position_ids_from_mask(attn)
    mask = torch.where(attn.bool(), 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    with torch.no_grad():
        prefix = model(input_ids=ids[:, :-1], attention_mask=attn[:, :-1], position_ids=positions[:, :-1],
                       **cache_kwargs(model, copy.deepcopy(cache)), use_cache=True)
        theirs = model(input_ids=ids[:, -1:], attention_mask=attn, position_ids=positions[:, -1:],
                       **cache_kwargs(model, copy.deepcopy(prefix.past_key_values)), use_cache=True).logits[:, -1]
        previous = model.config._attn_implementation
        model.config._attn_implementation = graph_decode.DECODE_ATTENTION
        try:
            ours = fused_step.fused_step(model, DECODE)(ids[:, -1:], mask, positions[:, -1:],
                                                copy.deepcopy(prefix.past_key_values))
        finally:
            model.config._attn_implementation = previous
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


def test_weights_stay_the_copys_own_and_sync_reaches_the_fused_tensors(tokenizer):
    """The q/k/v parameters become views of the fused tensor (no second copy of the weights); the
    engine's sync writes through them, and a parameter replaced outright is fused again."""
    policy = _model("qwen2")
    prepacked = HFRollout(policy, tokenizer, torch.float32, batch_sequences=6, loop="graph", prepacked_weights="auto")
    if prepacked.prepacked:  # a CPU copy's prepacked layers keep their own (faster there) products
        assert fused_step.fused_step(prepacked.model, DECODE) is None
    engine = HFRollout(policy, tokenizer, torch.float32, batch_sequences=6, loop="graph", prepacked_weights="off")
    model = engine.model
    assert fused_step.fused_step(model, DECODE) is not None
    a = model.model.layers[0].self_attn
    weight, bias, sizes = a.rlpr_qkv
    assert a.q_proj.weight.data_ptr() == weight.data_ptr() and a.v_proj.bias.data_ptr() == bias[-sizes[2]:].data_ptr()
    params = sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        policy.model.layers[0].self_attn.k_proj.weight.add_(1.0)
    engine.sync(policy)
    assert torch.equal(weight[sizes[0]:sizes[0] + sizes[1]], policy.model.layers[0].self_attn.k_proj.weight)
    a.k_proj.weight = torch.nn.Parameter(torch.zeros_like(a.k_proj.weight), requires_grad=False)
    fused_step.fused_step(model, DECODE)
    assert a.rlpr_qkv[0] is not weight and torch.equal(a.rlpr_qkv[0][sizes[0]:sizes[0] + sizes[1]], a.k_proj.weight)
    assert sum(p.numel() for p in model.parameters()) == params


def test_other_families_trainable_and_hooked_modules_take_the_model_forward(tiny_model):
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    gemma = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                               num_attention_heads=2, num_key_value_heads=1, head_dim=16))
    assert fused_step.fused_step(gemma, DECODE) is None
    model = copy.deepcopy(tiny_model)
    assert fused_step.fused_step(model, DECODE) is None  # trainable: a policy, not a rollout copy
    model.requires_grad_(False)
    handle = model.model.layers[1].mlp.up_proj.register_forward_hook(lambda *a: None)
    assert fused_step.fused_step(model, DECODE) is None
    handle.remove()
    assert fused_step.fused_step(model, DECODE) is not None
