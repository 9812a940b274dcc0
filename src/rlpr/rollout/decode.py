"""rlpr's own sampling loop over a Hugging Face causal LM: the same forwards and draws as
`generate`, without its two per-token costs that matter on CPU.

- The KV cache grows by concatenation in `generate` (`DynamicLayer`): every layer copies its
  whole cache at every token, 14% of a bf16 demo rollout's time. `PreallocatedLayer` writes each
  new position into a buffer sized for the prompt plus `max_new_tokens`.
- Rows that reached EOS keep being computed until the longest finishes (22% of the demo's rows
  hit the token cap while the mean response is 52 of 64 tokens). Here finished rows leave the
  batch (in bunches: dropping rows copies the cache).

Each row draws from its own generator (`PerRowSampler`), so which rows share a forward does not
change any row's draws; the tokens equal `generate`'s (tests/test_rollout.py). Decode steps of
Llama-shaped families call the layers directly (`direct_step.py`: the same logits, less Python).
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlpr.model.forward import cache_kwargs, position_ids_from_mask
from rlpr.rollout.direct_step import step_function


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values are views of buffers with room for `capacity` positions
    (grown by doubling if ever exceeded): one in-place write per token instead of a concatenation."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0
        self._k = self._v = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        shape = list(key_states.shape)
        shape[-2] = max(self.capacity, shape[-2])
        self._k = key_states.new_empty(shape)
        self._v = value_states.new_empty(shape[:-1] + [value_states.shape[-1]])
        self.is_initialized = True

    def _views(self) -> None:
        self.keys, self.values = self._k[:, :, :self.length], self._v[:, :, :self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.length, self.length + key_states.shape[-2]
        if end > self._k.shape[-2]:
            size = max(end, 2 * self._k.shape[-2])
            self._k, self._v = _grown(self._k, start, size), _grown(self._v, start, size)
        self._k[:, :, start:end].copy_(key_states)
        self._v[:, :, start:end].copy_(value_states)
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.is_initialized:
            self._k, self._v = self._k[indices], self._v[indices]
            self._views()

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self.batch_select_indices(beam_idx.to(self.device) if self.is_initialized else beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.is_initialized:
            self._k, self._v = self._k.repeat_interleave(repeats, 0), self._v.repeat_interleave(repeats, 0)
            self._views()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError("crop takes a negative number of tokens to remove")
        self.length = max(0, self.length + tokens_to_remove)
        if self.is_initialized:
            self._views()

    def reset(self) -> None:
        self.length = 0
        self.keys = self.values = self._k = self._v = None
        self.is_initialized = False


def _grown(buffer: torch.Tensor, keep: int, size: int) -> torch.Tensor:
    """A [B, H, size, d] buffer holding the first `keep` positions of `buffer`."""
    out = buffer.new_empty(*buffer.shape[:2], size, buffer.shape[-1])
    out[:, :, :keep] = buffer[:, :, :keep]
    return out


def preallocated_cache(config, capacity: int) -> DynamicCache:
    """The model's usual dynamic cache with every full-attention layer preallocated (sliding-window
    and other special layers are kept as transformers builds them)."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@torch.no_grad()
def sample(model, ids: torch.Tensor, attn: torch.Tensor, draw, *, max_new_tokens: int, eos: int, pad: int,
           cache=None, compact_every: int = 8, min_new_tokens: int = 0, ends: tuple[int, ...] = (),
           keep=None) -> torch.Tensor:
    """Sampled continuations [B, max_new_tokens] (pad after a row's EOS) of left-padded prompts.

    `draw(logits [b, V] fp32, rows [b] long) -> tokens [b]` picks the next token of the original
    rows `rows`. `cache`: the KV cache of every prompt but its last token (the shared prefill), or
    None to run the whole prompts first. Finished rows are dropped once they are at least
    1/`compact_every` of the rows still running. `min_new_tokens`: EOS's logit is -inf for the
    first that many tokens (every row has drawn the same number of tokens at each step), so no
    response ends before it (vLLM's min_tokens; one column written in place, no copy). `ends`: more
    tokens that end a row as EOS does (those holding a rollout.stop string), kept like it. `keep`: a
    `kept_cache.KeptCaches` that copies each row's cache out before the row leaves the batch.
    """
    batch, width = ids.shape
    device = ids.device
    out = torch.full((batch, max_new_tokens), pad, dtype=torch.long)
    if max_new_tokens <= 0:
        return out
    mask = torch.zeros((batch, width + max_new_tokens), dtype=attn.dtype, device=device)
    mask[:, :width] = attn
    positions = position_ids_from_mask(attn)
    if cache is None:
        cache = preallocated_cache(model.config, width + max_new_tokens)
        feed, pos = ids, positions
    else:
        feed, pos = ids[:, -1:], positions[:, -1:]
    stop = torch.tensor([eos, *ends], dtype=torch.long)
    direct = step_function(model)  # the same logits without transformers' forward machinery, where it allows
    rows = torch.arange(batch)  # the original row of every row still in the batch
    done = torch.zeros(batch, dtype=torch.bool)
    length = width
    for step in range(max_new_tokens):
        if direct is not None and feed.shape[1] == 1:
            logits = direct(feed, mask[:, :length], pos, cache)
        else:
            logits = model(input_ids=feed, attention_mask=mask[:, :length], position_ids=pos,
                           **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1).logits[:, -1]
        scores = logits.float()  # the model's fresh output (or its fp32 copy): free to write into
        if step < min_new_tokens:
            scores[:, eos] = float("-inf")
        tokens = draw(scores, rows).cpu()
        live = ~done
        out[rows[live], step] = tokens[live]
        done |= torch.isin(tokens, stop)
        if bool(done.all()) or step == max_new_tokens - 1:
            if keep is not None:
                keep.take(_layers(cache), range(len(rows)), rows, out)
            break
        mask[:, length] = 1
        length += 1
        pos = pos[:, -1:] + 1
        feed = tokens.to(device)[:, None]
        if int(done.sum()) * compact_every >= len(rows):
            if keep is not None:
                finished = done.nonzero()[:, 0]
                keep.take(_layers(cache), finished, rows[finished], out)
            stay = (~done).nonzero()[:, 0]
            rows, done = rows[stay], done[stay]
            stay = stay.to(device)
            cache.batch_select_indices(stay)
            mask, pos, feed = mask[stay], pos[stay], feed[stay]
    return out


def _layers(cache) -> list:
    """(keys, values) per layer of a dynamic cache."""
    return [(layer.keys, layer.values) for layer in cache.layers]
