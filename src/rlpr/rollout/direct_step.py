"""One decode step (one new token per row) through the decoder's layers called directly, for the
families whose layer is Llama's (Llama, Qwen2, Qwen3): the same modules and functions, in the same
order, as the model's forward, so the logits are the same bits (tests/test_direct_step.py).

On a CPU a decode step of a small model is mostly small kernels, and the Python around them counts:
transformers' forward goes through `nn.Module.__call__` for every norm, projection and activation
(about 400 per step for SmolLM2's 30 layers), decorators that rename keyword arguments, an output
recorder, the attention registry and a mask builder. Here each projection's and norm's `forward` is
called directly and the step's mask is made once: the demo rollout 0.92x the time (3.80 against 4.14
s, bf16 copy, AMD EPYC, 2 cores; benchmarks/step_variants.py at a0f9d4c, results/archive/step_variants_amd.md).

`step_function(model)` gives the step where the model allows it, else None (the caller runs the
model's own forward): another family, a sliding-window or other special cache layer, an attention
other than SDPA, or forward hooks on the modules whose `forward` is called directly (they would be
skipped; the embedding and the output layer are called as modules, so their hooks run)."""

from __future__ import annotations

import sys
from typing import Callable

import torch

FAMILIES = frozenset({"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})  # Llama's layer shape
ATTENTION = frozenset({"sdpa", "rlpr_sdpa"})  # rlpr_sdpa is plain SDPA outside autocast (model/attention.py)
ENABLED = True  # False: always the model's forward (tests, benchmarks)


def step_function(model) -> Callable | None:
    """`step(feed [B, 1], mask [B, L], positions [B, 1], cache) -> logits [B, V]` for `model`, or None
    where it must run its own forward."""
    if not ENABLED or type(model).__name__ not in FAMILIES:
        return None
    config, decoder = model.config, model.model
    if getattr(config, "_attn_implementation", None) not in ATTENTION:
        return None
    if any(t != "full_attention" for t in getattr(config, "layer_types", None) or ()) or any(
            getattr(layer.self_attn, "sliding_window", None) for layer in decoder.layers):
        return None
    called = (decoder.embed_tokens, model.get_output_embeddings())  # through __call__: their hooks run
    if any((m._forward_hooks or m._forward_pre_hooks) and m not in called for m in model.modules()):
        return None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rotary = sys.modules[type(model).__module__].apply_rotary_pos_emb
    return _DirectStep(model, rotary, sdpa_attention_forward)


class _DirectStep:
    """The step of `step_function`, its modules looked up once."""

    def __init__(self, model, rotary, attention):
        self.model, self.rotary, self.attention = model, rotary, attention
        self.head = model.get_output_embeddings()

    @torch.no_grad()
    def __call__(self, feed: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        m = self.model.model
        hidden = m.embed_tokens(feed)
        cos, sin = m.rotary_emb.forward(hidden, positions)
        keep = mask.bool()
        # transformers' SDPA mask for one query: none where every row sees every position, else [B, 1, 1, L]
        attend = None if bool(keep.all()) else keep[:, None, None, :]
        for index, layer in enumerate(m.layers[:self.model.config.num_hidden_layers]):
            residual = hidden
            hidden = residual + self._attention(layer.self_attn, layer.input_layernorm.forward(hidden), cos, sin,
                                                cache, index, attend)
            residual = hidden
            mlp = layer.mlp
            x = layer.post_attention_layernorm.forward(hidden)
            hidden = residual + mlp.down_proj.forward(mlp.act_fn(mlp.gate_proj.forward(x)) * mlp.up_proj.forward(x))
        hidden = m.norm.forward(hidden)
        return self.head(hidden[:, -1:, :])[:, -1]

    def _attention(self, a, x, cos, sin, cache, index, attend):
        shape = (*x.shape[:-1], -1, a.head_dim)
        q, k = a.q_proj.forward(x).view(shape), a.k_proj.forward(x).view(shape)
        if hasattr(a, "q_norm"):  # Qwen3: per-head norms before the rotary embedding
            q, k = a.q_norm.forward(q), a.k_norm.forward(k)
        v = a.v_proj.forward(x).view(shape).transpose(1, 2)
        q, k = self.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        k, v = cache.update(k, v, index)
        out, _ = self.attention(a, q, k, v, attend, dropout=0.0, scaling=a.scaling)
        return a.o_proj.forward(out.reshape(*x.shape[:-1], -1).contiguous())
