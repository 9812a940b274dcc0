"""One prompt's responses packed into rows after its keys and values (trainer.pack_responses).

The shared-prefix path (`forward.continuation_hidden`) runs a prompt's responses as [rows,
longest response] with the prompt's keys/values repeated per row: every shorter response is padded
to the longest (15% of the update's forward tokens on speed.py's samples, after `similar_widths`)
and the prompt's cache is copied once per row. Packed, several responses share a row one after the
other: a block-diagonal causal mask lets each token see the prompt and the earlier tokens of its
own response only (within the window, in a sliding-window layer), and position ids restart at the
prompt's end for each response, so every response is computed as if alone (the same numbers up to
float summation order; tests prove it against the padded path and single sequences). The update,
its log-prob passes and the scoring forwards that recompute (score B, A, label-free statistics) use
it; measured in docs/training.md.

The mask is dense: a row of S tokens attends over prompt + S keys, so a row's attention grows with
S squared where the padded rows' grows with each response's own length; rows are therefore capped
(`row_capacity`) and a response longer than the cap has a row of its own.
"""

from __future__ import annotations

import inspect

import torch

from rlpr.errors import ConfigError
from rlpr.model.forward import PrefixState, cache_kwargs, causal_lm, continuation_hidden

PACK_MODES = ("auto", "on", "off")

# Attention implementations whose masks are boolean [batch, 1, query, key] tensors (SDPA's, and
# rlpr's fp32-under-autocast SDPA): the packed mask is built in that form.
BOOL_MASK_ATTENTION = ("sdpa", "rlpr_sdpa")


def attention_windows(model) -> list[int | None] | None:
    """Per decoder layer, the keys its attention sees: None (every earlier position) or a sliding
    window's size; None (the list) where a layer is neither (linear attention, chunked, ...).
    Chunked attention (Llama 4) is told apart by the config: transformers caches it in the same
    sliding-window layer, only its mask differs."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    config = causal_lm(model).config
    text = config.get_text_config(decoder=True)
    if getattr(text, "attention_chunk_size", None) or any(
            t not in ("full_attention", "sliding_attention") for t in getattr(text, "layer_types", None) or ()):
        return None
    try:
        layers = DynamicCache(config=config).layers
    except Exception:  # a config transformers cannot build a cache from
        return None
    kinds = {DynamicLayer: lambda layer: None, DynamicSlidingWindowLayer: lambda layer: int(layer.sliding_window)}
    if not layers or any(type(layer) not in kinds for layer in layers):
        return None
    return [kinds[type(layer)](layer) for layer in layers]


def _takes_masks_per_layer_type(decoder) -> bool:
    """Whether the decoder's forward takes a prebuilt {layer type: mask} mapping (transformers' models
    that mix full and sliding-window layers: Gemma 2/3, Qwen 2/3, ...)."""
    try:
        return "causal_mask_mapping" in inspect.getsource(type(decoder).forward)
    except (OSError, TypeError):
        return False


def unpackable(model) -> str | None:
    """Why `model` cannot run packed rows (None: it can): packing builds the mask itself, so every layer
    must attend to all earlier positions or to a sliding window of them, through an attention that
    takes a boolean 4D mask, and a model that mixes the two must take one mask per layer type."""
    lm = causal_lm(model)
    windows = attention_windows(lm)
    if windows is None:
        return f"{type(lm).__name__} has layers other than full or sliding-window attention"
    impl = getattr(lm.config, "_attn_implementation", None)
    if impl not in BOOL_MASK_ATTENTION:
        return f"its attention implementation is {impl!r} (packing needs one of {', '.join(BOOL_MASK_ATTENTION)})"
    if len(set(windows)) > 1 and not (getattr(lm.config, "layer_types", None)
                                      and _takes_masks_per_layer_type(lm.get_decoder())):
        return f"{type(lm).__name__} mixes full and sliding-window layers and takes no mask per layer type"
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


def packed_layout(lengths: list[int], rows: list[list[int]]):
    """Continuations of `lengths` laid out in `rows` (indices, in order within a row): (where each
    starts: (row, column) per index, the continuation each column holds [R, W] (-1: padding), each
    column's position within its continuation [R, W])."""
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
    return starts, seg, pos


def packed_mask(seg: torch.Tensor, pos: torch.Tensor, prefix_len: int, held: int | None = None,
                window: int | None = None) -> torch.Tensor:
    """The attention mask [R, 1, W, held + W] (bool) of packed rows (`packed_layout`'s `seg`, `pos`)
    after a prefix of `prefix_len` tokens whose last `held` keys the layer holds (all by default):
    each token sees the prefix and the earlier tokens of its own continuation, within `window`
    positions of itself (a sliding-window layer: query - key < window, as transformers' masks);
    padding sees the prefix only, so no row of the softmax is empty."""
    held = prefix_len if held is None else held
    own = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] >= 0) & (pos[:, None, :] <= pos[:, :, None])
    prefix = torch.ones(*seg.shape, held, dtype=torch.bool)
    if window is not None:
        query = prefix_len + pos  # absolute positions: the prefix's held keys end at prefix_len - 1
        keys = torch.arange(prefix_len - held, prefix_len)
        prefix = query[:, :, None] - keys < window
        own = own & (pos[:, :, None] - pos[:, None, :] < window)
    return torch.cat([prefix, own], dim=-1)[:, None]


def _masks(lm, cache, seg: torch.Tensor, pos: torch.Tensor, prefix_len: int, windows: list[int | None]):
    """The attention mask of every layer kind: one tensor where all layers are alike, else transformers'
    {layer type: mask} mapping (`config.layer_types`)."""
    width = seg.shape[1]
    by_window = {}
    for idx, window in enumerate(windows):
        if window not in by_window:
            kv_length, _ = cache.get_mask_sizes(width, idx)
            by_window[window] = packed_mask(seg, pos, prefix_len, kv_length - width, window)
    if len(by_window) == 1:
        return next(iter(by_window.values()))
    return {kind: by_window[window] for kind, window in zip(lm.config.layer_types, windows)}


def packed_continuation_hidden(model, state: PrefixState, continuations: list[list[int]],
                               targets: list[list[bool]] | None = None,
                               capacity: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`forward.continuation_hidden` with the continuations packed into rows of at most `capacity`
    tokens (default `row_capacity`) after the prefix's keys/values: (hidden states [N, H] before each
    marked continuation token (`targets`; None: every token), those tokens [N]), continuation by
    continuation."""
    lm = causal_lm(model)
    lengths = [len(c) for c in continuations]
    capacity = capacity or row_capacity(lm.config, max(lengths))
    rows = pack_rows(lengths, capacity)
    starts, seg, pos = packed_layout(lengths, rows)
    width = seg.shape[1]
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    for i, c in enumerate(continuations):
        r, at = starts[i]
        ids[r, at:at + len(c)] = torch.tensor(c, dtype=torch.long)
    device = next(lm.parameters()).device
    cache = state.cache(len(rows))
    mask = _masks(lm, cache, seg, pos, state.length, attention_windows(lm))
    mask = {k: m.to(device) for k, m in mask.items()} if isinstance(mask, dict) else mask.to(device)
    decoder = lm.get_decoder()
    out = decoder(input_ids=ids.to(device), attention_mask=mask, position_ids=(state.length + pos).to(device),
                  **cache_kwargs(decoder, cache), use_cache=True)
    # the hidden state before a continuation's token j: the prefix's last one (flat index 0) for j = 0,
    # else the row's output at the token before it (flat index 1 + r * W + column)
    flat = torch.cat([state.last_hidden.reshape(1, -1), out.last_hidden_state.reshape(len(rows) * width, -1)])
    index, tokens = [], []
    for i, (c, n) in enumerate(zip(continuations, lengths)):
        before = torch.cat([torch.zeros(min(n, 1), dtype=torch.long),
                            1 + starts[i][0] * width + starts[i][1] + torch.arange(max(n - 1, 0))])
        chosen = torch.ones(n, dtype=torch.bool) if targets is None else torch.tensor(targets[i], dtype=torch.bool)
        index.append(before[chosen])
        tokens.append(torch.tensor(c, dtype=torch.long)[chosen])
    return flat[torch.cat(index).to(device)], torch.cat(tokens).to(device)


def prefix_continuation_hidden(model, state: PrefixState, continuations: list[list[int]],
                               targets: list[list[bool]] | None = None, pack: bool = False):
    """(hidden states [N, H] before each marked continuation token (`targets`; None: every token), those
    tokens [N]) of continuations of one prefix, continuation by continuation: packed into rows (`pack`,
    trainer.pack_responses resolved) or one padded row each (`forward.continuation_hidden`). What the
    update's micro-batches and the scoring forwards call."""
    if pack:
        return packed_continuation_hidden(model, state, continuations, targets)
    targets = targets if targets is not None else [[True] * len(c) for c in continuations]
    return continuation_hidden(model, state, continuations, targets)
