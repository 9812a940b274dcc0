"""Attention in fp32 inside the CPU bf16-autocast update.

On CPU, PyTorch's flash-attention kernel is much slower backward in bf16 than in fp32 (forward +
backward of one layer at the demo's shapes: 5.1 ms bf16, 2.0 ms fp32), and bf16 buys nothing in
the attention itself. Autocast casts SDPA's inputs down to bf16 (in Llama, q and k arrive in
fp32 after the rotary embedding, v in bf16); under CPU autocast we instead run the attention in
fp32 (the projections stay bf16), which is both faster and more precise; outside autocast (fp32
scoring, the bf16 rollout copy) this is plain SDPA, bit for bit. Registered under its own name in
transformers' attention registry, with SDPA's mask function.
"""

from __future__ import annotations

import torch

NAME = "rlpr_sdpa"


def sdpa_fp32_under_cpu_autocast(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if not (query.device.type == "cpu" and torch.is_autocast_enabled("cpu")
            and torch.get_autocast_dtype("cpu") in (torch.bfloat16, torch.float16)):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.is_floating_point():
        attention_mask = attention_mask.float()
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                              **kwargs)
    return out.to(torch.get_autocast_dtype("cpu")), weights  # what autocast's SDPA returns


def use_fp32_attention_under_autocast(model) -> bool:
    """Switch a transformers model from SDPA to the function above; False (unchanged) if the model
    does not use SDPA."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return False
    AttentionInterface.register(NAME, sdpa_fp32_under_cpu_autocast)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    model.set_attn_implementation(NAME)
    return True
