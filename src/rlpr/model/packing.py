"""One prompt's responses packed into rows after its keys and values (trainer.pack_responses).

The shared-prefix path (`forward.continuation_hidden`) runs a prompt's responses as [rows,
longest response] with the prompt's keys/values repeated per row: every shorter response is padded
to the longest (15% of the update's forward tokens on speed.py's samples, after `similar_widths`)
and the prompt's cache is copied once per row. Packed, several responses share a row one after the
other: a block-diagonal causal mask lets each token see the prompt and the earlier tokens of its
own response only, and position ids restart at the prompt's end for each response, so every
response is computed as if alone (the same numbers up to float summation order; tests prove it
against the padded path). On the demo's samples the update took 13% (fp32) to 22% (bf16 autocast)
less time (docs/training.md).

The mask is dense: a row of S tokens attends over prompt + S keys, so a row's attention grows with
S squared where the padded rows' grows with each response's own length; rows are therefore capped
(`row_capacity`) and a response longer than the cap has a row of its own.
"""

from __future__ import annotations

import torch

from rlpr.errors import ConfigError
from rlpr.model.forward import PrefixState, cache_kwargs, causal_lm

PACK_MODES = ("auto", "on", "off")

# Attention implementations whose masks are boolean [batch, 1, query, key] tensors (SDPA's, and
# rlpr's fp32-under-autocast SDPA): the packed mask is built in that form.
BOOL_MASK_ATTENTION = ("sdpa", "rlpr_sdpa")


def unpackable(model) -> str | None:
    """Why `model` cannot run packed rows (None: it can): packing needs every layer to attend to all
    earlier positions (a sliding-window layer needs its own mask) and an attention that takes a
    boolean 4D mask."""
    from rlpr.rollout.kept_cache import full_attention_cache

    lm = causal_lm(model)
    if not full_attention_cache(lm):
        return f"{type(lm).__name__} has layers that do not attend to every earlier position (sliding window)"
    impl = getattr(lm.config, "_attn_implementation", None)
    if impl not in BOOL_MASK_ATTENTION:
        return f"its attention implementation is {impl!r} (packing needs one of {', '.join(BOOL_MASK_ATTENTION)})"
    return None


def resolve_packing(mode: str, model, device: torch.device, shared_prefix: bool) -> bool:
    """trainer.pack_responses: `on` packs (a clear error where the model cannot), `off` does not,
    `auto` packs on the CPU where the model can (on a GPU, padding costs little beside the attention
    kernels a dense mask gives up). Only with the shared prompt prefix (trainer.share_prompt_prefix,
    not under gradient checkpointing): the responses are packed after their prompt's keys/values."""
    if mode not in PACK_MODES:
        raise ConfigError(f"trainer.pack_responses: {mode!r} is not one of {', '.join(PACK_MODES)}")
    if mode == "off" or not shared_prefix:
        if mode == "on":
            raise ConfigError("trainer.pack_responses=on needs the shared prompt prefix "
                              "(trainer.share_prompt_prefix=true, model.gradient_checkpointing=false)")
        return False
    reason = unpackable(model)
    if mode == "on" and reason:
        raise ConfigError(f"trainer.pack_responses=on: {reason}; use auto or off")
    return reason is None and (mode == "on" or device.type == "cpu")


def row_capacity(config, longest: int) -> int:
    """Tokens per packed row: where a row's extra attention (S x S scores against the padded rows'
    own-length ones) stays near a tenth of its projections' work, i.e. S ~ 0.1 x (linear weights per
    layer) / hidden size: 510 tokens for SmolLM2-135M, about 5,000 for a 7B model. Never under the
    longest response (it goes alone)."""
    h = config.hidden_size
    inter = getattr(config, "intermediate_size", 4 * h)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or h // heads
    kv = getattr(config, "num_key_value_heads", heads) or heads
    per_layer = h * head_dim * (2 * heads + 2 * kv) + 3 * h * inter
    return max(longest, int(0.1 * per_layer / h))


def pack_rows(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices into `lengths` grouped into rows of at most `capacity` tokens, first fit in order of
    decreasing length (a length over the capacity gets a row of its own)."""
    rows: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for r, free in enumerate(room):
            if lengths[i] <= free:
                rows[r].append(i)
                room[r] -= lengths[i]
                break
        else:
            rows.append([i])
            room.append(capacity - lengths[i])
    return rows


def packed_layout(prefix_len: int, lengths: list[int], rows: list[list[int]]):
    """For continuations of `lengths` laid out in `rows` (indices, in order within a row): (where each
    continuation starts: (row, column) per index, the row width, position ids [R, W], the attention
    mask [R, 1, W, prefix + W] (bool: each token sees the whole prefix and the earlier tokens of its
    own continuation; padding sees the prefix only, so no row of the softmax is empty))."""
    width = max(sum(lengths[i] for i in row) for row in rows)
    seg = torch.full((len(rows), width), -1, dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    starts: dict[int, tuple[int, int]] = {}
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            starts[i] = (r, at)
            seg[r, at:at + lengths[i]] = i
            pos[r, at:at + lengths[i]] = torch.arange(lengths[i])
            at += lengths[i]
    same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0)
    own = same & (pos[:, None, :] <= pos[:, :, None])
    mask = torch.cat([torch.ones(len(rows), width, prefix_len, dtype=torch.bool), own], dim=-1)[:, None]
    return starts, width, prefix_len + pos, mask


def packed_continuation_hidden(model, state: PrefixState, continuations: list[list[int]],
                               capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`forward.continuation_hidden` with every token a target, the continuations packed into rows of
    at most `capacity` tokens (default `row_capacity`) after the prefix's keys/values: (hidden states
    [N, H] before each continuation token, those tokens [N]), continuation by continuation."""
    lm = causal_lm(model)
    lengths = [len(c) for c in continuations]
    capacity = capacity or row_capacity(lm.config, max(lengths))
    rows = pack_rows(lengths, capacity)
    starts, width, positions, mask = packed_layout(state.length, lengths, rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, c in enumerate(continuations):
        r, at = starts[i]
        ids[r, at:at + len(c)] = torch.tensor(c, dtype=torch.long)
    device = next(lm.parameters()).device
    decoder = lm.get_decoder()
    out = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                  **cache_kwargs(decoder, state.cache(len(rows))), use_cache=True)
    # the hidden state before a continuation's token j: the prefix's last one (flat index 0) for j = 0,
    # else the row's output at the token before it (flat index 1 + r * W + column)
    flat = torch.cat([state.last_hidden.reshape(1, -1), out.last_hidden_state.reshape(len(rows) * width, -1)])
    index = torch.cat([torch.cat([torch.zeros(min(n, 1), dtype=torch.long),
                                  1 + starts[i][0] * width + starts[i][1] + torch.arange(max(n - 1, 0))])
                       for i, n in enumerate(lengths)])
    tokens = torch.tensor([t for c in continuations for t in c], dtype=torch.long, device=device)
    return flat[index.to(device)], tokens
