"""The static loop's decode step (graph_decode.py) for Llama-shaped families (Llama, Qwen2, Qwen3) on
fused projection weights: q, k and v of a layer in one matrix, gate and up in another, so a layer runs
two matrix products where the model's forward runs five, and a 24-layer step 72 fewer kernels.

The weights are not copied: at the first step the q/k/v (and gate/up) parameters of the rollout copy
are moved into one tensor each and become views of it (`param.data` reassigned: the same Parameter
objects, so `state_dict`, the engine's in-place `sync` and prepacked layouts keep working on them),
and the fused product reads that tensor. A parameter no longer a view of its fused tensor (replaced
since) is fused again before the next call. Everything else is the model's own modules, in the
model's order, with the static loop's attention function: the logits differ from the model forward's
only by the rounding of a wider product (tests/test_fused_step.py: the same tokens, greedy and seeded).

`fused_step(model, attention)` gives the step, or None where the model's forward runs instead: another family,
sliding-window layers (those take the model's own masks per layer type), trainable weights (only a
frozen rollout copy is rearranged), projections other than plain `nn.Linear` (a CPU copy's prepacked
layers), hooks on the modules whose work the fused products
replace, or `ENABLED` off (benchmarks compare both)."""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.nn.functional as F

from rlpr.rollout.direct_step import FAMILIES

ENABLED = True
SCOPE = None  # step_profile sets a record_function factory here, so the fused products get a class


def _scope(label: str):
    return SCOPE(label) if SCOPE is not None else contextlib.nullcontext()


def fused_step(model, attention: str):
    """`step(tokens [B, 1], mask [B, 1, 1, L] additive, positions [B, 1], cache) -> logits [B, V]`, or None.
    `attention`: the registered attention function the step calls (graph_decode.DECODE_ATTENTION)."""
    if not ENABLED or type(model).__name__ not in FAMILIES:
        return None
    layers = model.model.layers[:model.config.num_hidden_layers]
    if any(t != "full_attention" for t in getattr(model.config, "layer_types", None) or ()) or any(
            getattr(layer.self_attn, "sliding_window", None) for layer in layers):
        return None
    replaced = [m for layer in layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                                                 layer.mlp.gate_proj, layer.mlp.up_proj)]
    if any(m.weight.requires_grad for m in replaced):
        return None  # a model being trained, not a frozen rollout copy: its parameters are left as they are
    if any(type(m) is not torch.nn.Linear for m in replaced):
        return None  # e.g. a CPU copy's prepacked layers (model/prepacked.py): their own layout is faster there
    if SCOPE is None and any(m._forward_hooks or m._forward_pre_hooks for m in replaced):
        return None  # (while step_profile profiles, the hooks are its own scopes)
    groups = [(layer.self_attn, "rlpr_qkv", (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj))
              for layer in layers] + [(layer.mlp, "rlpr_gate_up", (layer.mlp.gate_proj, layer.mlp.up_proj))
                                      for layer in layers]
    if any(len({m.bias is None for m in linears}) > 1 for _, _, linears in groups):
        return None  # some biased, some not: a fused bias would be a copy that a sync does not reach
    for owner, name, linears in groups:
        setattr(owner, name, _fused(getattr(owner, name, None), linears))
    return _FusedStep(model, sys.modules[type(model).__module__].apply_rotary_pos_emb, attention)


def _views_of(fused, linears) -> bool:
    """Whether each Linear's weight (and bias) is still its slice of `fused` (weight, bias, sizes)."""
    if fused is None:
        return False
    weight, bias, sizes = fused
    offset = 0
    for m, size in zip(linears, sizes):
        w, b = m.weight, m.bias
        if w.data_ptr() != weight[offset].data_ptr() or w.shape[0] != size or (b is None) != (bias is None):
            return False
        if b is not None and b.data_ptr() != bias[offset:].data_ptr():
            return False
        offset += size
    return True


@torch.no_grad()
def _fused(fused, linears):
    """(weight, bias, sizes): the Linears' weights (and biases) moved into one tensor, each now its view."""
    if _views_of(fused, linears):
        return fused
    sizes = [m.weight.shape[0] for m in linears]
    weight = torch.cat([m.weight.detach() for m in linears])
    bias = torch.cat([m.bias.detach() for m in linears]) if linears[0].bias is not None else None
    offset = 0
    for m, size in zip(linears, sizes):
        m.weight.data = weight[offset:offset + size]
        if bias is not None:
            m.bias.data = bias[offset:offset + size]
        offset += size
    return weight, bias, sizes


class _FusedStep:
    def __init__(self, model, rotary, attention: str):
        self.model, self.rotary, self.attention = model, rotary, attention
        self.head = model.get_output_embeddings()

    def __call__(self, tokens: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache) -> torch.Tensor:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        with _scope("model"):  # (step_profile: what no inner scope claims is the model's, not sampling)
            return self._forward(tokens, mask, positions, cache, ALL_ATTENTION_FUNCTIONS[self.attention])

    def _forward(self, tokens, mask, positions, cache, attention) -> torch.Tensor:
        m = self.model.model
        hidden = m.embed_tokens(tokens)
        cos, sin = m.rotary_emb(hidden, positions)
        for index, layer in enumerate(m.layers[:self.model.config.num_hidden_layers]):
            a, mlp = layer.self_attn, layer.mlp
            x = layer.input_layernorm(hidden)
            with _scope("projections"):
                qkv = F.linear(x, a.rlpr_qkv[0], a.rlpr_qkv[1])
            shape = (*x.shape[:-1], -1, a.head_dim)
            q, k, v = (t.view(shape) for t in qkv.split(a.rlpr_qkv[2], dim=-1))
            if hasattr(a, "q_norm"):  # Qwen3: per-head norms before the rotary embedding
                q, k = a.q_norm(q), a.k_norm(k)
            with _scope("rotary"):
                q, k = self.rotary(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            with _scope("copies"):
                k, v = cache.update(k, v.transpose(1, 2), index)
            out, _ = attention(a, q, k, v, mask, dropout=0.0, scaling=a.scaling)
            hidden = hidden + a.o_proj(out.reshape(*x.shape[:-1], -1))
            x = layer.post_attention_layernorm(hidden)
            with _scope("projections"):
                gate, up = F.linear(x, mlp.rlpr_gate_up[0], mlp.rlpr_gate_up[1]).split(mlp.rlpr_gate_up[2], dim=-1)
            hidden = hidden + mlp.down_proj(mlp.act_fn(gate) * up)
        hidden = m.norm(hidden)
        return self.head(hidden)[:, -1]
