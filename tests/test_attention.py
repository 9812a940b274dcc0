"""fp32 attention inside the CPU bf16-autocast update (rlpr/model/attention.py)."""

import pytest
import torch

from rlpr.model.attention import NAME, sdpa_fp32_under_cpu_autocast, use_fp32_attention_under_autocast

pytestmark = pytest.mark.unit


def batch(tokenizer):
    ids = torch.randint(3, len(tokenizer), (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    return ids, mask


def test_outside_autocast_it_is_plain_sdpa_bit_for_bit(tokenizer):
    from rlpr.model.loading import tiny_llama

    plain, ours = tiny_llama(tokenizer, seed=1), tiny_llama(tokenizer, seed=1)
    assert use_fp32_attention_under_autocast(ours) and ours.config._attn_implementation == NAME
    ids, mask = batch(tokenizer)
    with torch.no_grad():
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits, ours(input_ids=ids, attention_mask=mask).logits)
        plain, ours = plain.to(torch.bfloat16), ours.to(torch.bfloat16)  # the bf16 rollout copy: no autocast
        assert torch.equal(plain(input_ids=ids, attention_mask=mask).logits, ours(input_ids=ids, attention_mask=mask).logits)
    assert not use_fp32_attention_under_autocast(plain.set_attn_implementation("eager") or plain)


def test_under_cpu_autocast_the_attention_runs_in_fp32(tokenizer):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from rlpr.model.loading import tiny_llama

    module = tiny_llama(tokenizer, seed=1).model.layers[0].self_attn
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim = module.config.num_attention_heads, module.config.num_key_value_heads, module.head_dim
    q = torch.randn(2, heads, 7, dim, generator=g)  # as in Llama under autocast: q, k fp32 after RoPE, v bf16
    k = torch.randn(2, kv_heads, 7, dim, generator=g)
    v = torch.randn(2, kv_heads, 7, dim, generator=g).bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = sdpa_fp32_under_cpu_autocast(module, q, k, v, None, dropout=0.0, scaling=dim ** -0.5)
        plain, _ = sdpa_attention_forward(module, q, k, v, None, dropout=0.0, scaling=dim ** -0.5)
    ref, _ = sdpa_attention_forward(module, q, k, v.float(), None, dropout=0.0, scaling=dim ** -0.5)
    assert out.dtype == plain.dtype == torch.bfloat16
    assert torch.equal(out, ref.to(torch.bfloat16))
    assert not torch.equal(out, plain)  # plain autocast runs it in bf16


def test_autocast_training_gradients_stay_close_to_fp32(tokenizer):
    """The switch changes only the attention's precision under autocast: gradients agree with the
    plain bf16-autocast ones and with full fp32 to bf16 tolerance."""
    from rlpr.model.loading import tiny_llama

    ids, mask = batch(tokenizer)

    def grads(attention_fp32: bool, autocast: bool):
        model = tiny_llama(tokenizer, seed=1).train()
        if attention_fp32:
            use_fp32_attention_under_autocast(model)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(input_ids=ids, attention_mask=mask).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].float().flatten(0, 1), ids[:, 1:].flatten(),
                                                 reduction="none")
        (loss * mask[:, 1:].flatten()).sum().backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    full = grads(False, False)
    ours, plain = grads(True, True), grads(False, True)
    assert not torch.equal(ours, plain)  # the attention really ran differently
    for g in (ours, plain):
        assert (g - full).norm() / full.norm() < 0.02
