"""Rollouts from a copy of the policy, behind the small `RolloutEngine` interface: rlpr's decode
loop (`decode.py`, the default) or Hugging Face `generate`, with the same per-row draws.

The engine samples from its own copy of the policy, by default in bf16 (about 1.7x faster than
fp32 on CPU); `sync` copies the current fp32 master weights (LoRA merged) into it before each
step. Old log-probs are recomputed by the training model, so the rollout dtype only changes which
responses are sampled, never the loss.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

import torch

from rlpr.model import prepacked
from rlpr.model.forward import cache_kwargs, causal_lm, output_cache, position_ids_from_mask
from rlpr.model.weights import merged_weights  # noqa: F401 (re-exported: the engines and tests use it here)
from rlpr.rollout.sampling import PerRowSampler, inverse_cdf, row_seed  # noqa: F401 (re-exported)

# decode.py, graph_decode.py and kept_cache.py import transformers' cache classes (3 s on a laptop core):
# imported where they run, so that the registry below (the config's choices: `rlpr config`, `rlpr plan`)
# loads without them
if TYPE_CHECKING:
    from rlpr.rollout.kept_cache import RowCache


@dataclass
class Rollout:
    """One sampled response: token ids (EOS included when the model stopped), and its text."""

    prompt_index: int
    token_ids: list[int]
    text: str
    finished: bool  # stopped at EOS (False: cut at max_new_tokens)
    logprobs: list[float] | None = None  # the engine's log-prob of each token, when it reports them (vllm)
    # the response's KV cache (rollout/kept_cache.py; vllm: its place in the engine's prefix cache,
    # rollout/vllm.py EngineCache) when the engine keeps them for score B; the trainer drops it once the
    # rewards are computed
    cache: RowCache | None = None


class RolloutEngine(Protocol):
    def sync(self, policy, weights=None) -> None: ...

    def sleep(self) -> None:
        """Give the device's memory to the update until the next `sync` or `generate` (vLLM's sleep
        mode; a no-op where the engine has nothing to give back)."""

    def generate(self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float,
                 top_p: float, seeds: list[int] | None = None, min_new_tokens: int | None = None) -> list[Rollout]:
        """`min_new_tokens`: EOS cannot end a response before this many tokens; None: the engine's
        configured value (rollout.min_new_tokens, meant for training rollouts), so other callers
        (held-out evaluation, rlpr eval, serve) pass 0."""


def plain_copy(lm, dtype: torch.dtype, device: torch.device | str = "cpu"):
    """A frozen, adapter-free model of the same architecture on `device` (weights are filled by
    `sync`). Its weights are not drawn at random first (`no_init_weights`: 2.3 s of a CPU demo's
    start for SmolLM2, all overwritten by `sync`); the buffers its modules compute when built
    (rotary frequencies, embedding scales) are kept, and tied weights are tied as `from_config`
    ties them (tests/test_model_families.py compares both builds on every family)."""
    from transformers import AutoModelForCausalLM
    from transformers.initialization import no_init_weights

    config = copy.deepcopy(lm.config)
    with torch.device(device), no_init_weights():  # built in place: no CPU copy of a GPU model's weights
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()  # init_weights, skipped above, also ties
    model.get_output_embeddings().register_forward_pre_hook(_contiguous_reduced_precision_input)
    return model.eval().requires_grad_(False)


def _contiguous_reduced_precision_input(module, args):
    """`generate` projects only the last position, `hidden[:, -1:, :]`: a strided [B, 1, H] view.
    On CPU a bf16/fp16 linear over such a view goes through a batched matmul that materialises
    the weight once per row ([B, H, vocab]: 1.7 GiB for 32 rows of SmolLM2's 49k vocabulary, at
    every prefill). A contiguous copy of the few hidden states gives bit-identical logits
    (tests/test_rollout.py) without that copy. fp32 takes another kernel and is left alone."""
    (hidden, *rest) = args
    if hidden.dim() > 2 and not hidden.is_contiguous() and hidden.dtype in (torch.bfloat16, torch.float16):
        return (hidden.contiguous(), *rest)
    return None


def _own_tensors(policy) -> dict:
    """The policy's parameters and buffers by (storage address, shape): `merged_weights` hands the
    un-merged ones out as views of these."""
    lm = causal_lm(policy)
    return {(t.data_ptr(), tuple(t.shape)): t for t in (*lm.parameters(), *lm.buffers())}


def stop_tokens(tokenizer, stop) -> tuple[int, ...]:
    """The vocabulary's tokens whose text holds one of the `stop` strings (rollout.stop), so that a
    decode loop ends a row there as at EOS (an early exit only: `engines.StopAt` cuts the text
    exactly, also where a stop string spans tokens)."""
    stop = [s for s in stop if s]
    if not stop:
        return ()
    texts = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    decoded = [tokenizer.convert_tokens_to_string([t]) if t is not None else "" for t in texts]
    return tuple(i for i, text in enumerate(decoded) if any(s in text for s in stop))


def rlpr_loop(model, ids, attn, sampler, *, max_new_tokens: int, eos: int, pad: int, cache, min_new_tokens: int = 0,
              ends: tuple[int, ...] = (), keep=None):
    """rlpr's decode loop (rollout/decode.py): a preallocated KV cache, finished rows leave the batch."""
    from rlpr.rollout.decode import sample

    draw = sampler.draw if sampler is not None else lambda logits, rows: logits.argmax(-1)
    return sample(model, ids, attn, draw, max_new_tokens=max_new_tokens, eos=eos, pad=pad, cache=cache,
                  min_new_tokens=min_new_tokens, ends=ends, keep=keep)


class NoEOSBefore:
    """A `generate` logits processor: EOS's score is -inf until `min_new_tokens` new tokens (in place:
    `generate` hands processors its own fp32 copy of the last position's logits)."""

    def __init__(self, prompt_length: int, min_new_tokens: int, eos: int):
        self.prompt_length, self.min_new_tokens, self.eos = prompt_length, min_new_tokens, eos

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if input_ids.shape[-1] - self.prompt_length < self.min_new_tokens:
            scores[:, self.eos] = float("-inf")
        return scores


def generate_loop(model, ids, attn, sampler, *, max_new_tokens: int, eos: int, pad: int, cache,
                  min_new_tokens: int = 0, ends: tuple[int, ...] = ()):
    """Hugging Face `generate` (the plain path), drawing with the same per-row sampler."""
    from transformers import GenerationConfig, LogitsProcessorList

    # argmax over our processor's output = the token it sampled (greedy when temperature is 0)
    gen_config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=[eos, *ends] if ends else eos,
                                  pad_token_id=pad, do_sample=False)
    processors = [NoEOSBefore(ids.shape[1], min_new_tokens, eos)] if min_new_tokens > 0 else []
    processors = LogitsProcessorList(processors + ([sampler] if sampler is not None else []))
    return model.generate(input_ids=ids, attention_mask=attn, **cache_kwargs(model, cache),
                          generation_config=gen_config, logits_processor=processors)[:, ids.shape[1]:]


def graph_loop(model, ids, attn, sampler, *, max_new_tokens: int, eos: int, pad: int, cache, min_new_tokens: int = 0,
               ends: tuple[int, ...] = (), keep=None):
    """The static-shape loop (rollout/graph_decode.py): CUDA graphs on a GPU, the same code eagerly elsewhere."""
    from rlpr.rollout.graph_decode import static_sample

    return static_sample(model, ids, attn, sampler, max_new_tokens=max_new_tokens, eos=eos, pad=pad, cache=cache,
                         min_new_tokens=min_new_tokens, ends=ends, keep=keep)


@dataclass(frozen=True)
class DecodeLoop:
    """A decode loop: `run(model, ids, attn, sampler, max_new_tokens=, eos=, pad=, cache=,
    min_new_tokens=)` returns the new tokens [rows, <= max_new_tokens] (no EOS among the first
    min_new_tokens); `preallocated`: the shared-prefill cache is allocated
    for the whole response up front (else the loop grows its own); `keeps`: `run` takes `keep=`, a
    `KeptCaches` that the rows' caches are copied into (score B from the rollout's cache)."""

    run: Callable
    preallocated: bool
    keeps: bool = False


# The registry of decode loops: its keys are the allowed values of rollout.decode_loop.
DECODE_LOOPS: dict[str, DecodeLoop] = {
    "rlpr": DecodeLoop(rlpr_loop, preallocated=True, keeps=True),
    "generate": DecodeLoop(generate_loop, preallocated=False),
    "graph": DecodeLoop(graph_loop, preallocated=False, keeps=True),
}
AUTO = "auto"  # rollout.decode_loop's default: graph on a GPU where the model allows it, else rlpr


def resolve_loop(name: str, model) -> str:
    """The decode loop `name` means for the rollout copy `model`: `auto` is `graph` on CUDA and `rlpr`
    elsewhere; `graph` on a model with cache layers other than full attention and sliding windows
    (chunked or linear attention) is `rlpr`."""
    from rlpr.rollout.graph_decode import supports_static_decode

    device = next(model.parameters()).device
    if name == AUTO:
        name = "graph" if device.type == "cuda" else "rlpr"
    if name == "graph" and not supports_static_decode(model):
        return "rlpr"
    return name


def decode_loop(name: str) -> DecodeLoop:
    try:
        return DECODE_LOOPS[name]
    except KeyError:
        raise ValueError(f"unknown rollout.decode_loop {name!r}; choose one of {', '.join(loop_names())}") from None


def loop_names() -> tuple[str, ...]:
    """The allowed values of rollout.decode_loop."""
    return (AUTO, *DECODE_LOOPS)


# cuDNN's attention (one of torch's SDPA kernels on Hopper GPUs) builds an execution plan for every
# new sequence length, and a decode loop meets a new length at every token: on an H100 the first
# 512-token rollout of a model ran 10-13x slower than the second, and as fast as the second with
# cuDNN attention off (benchmarks/results/gpu_check.md). The other kernels are as fast once warm.
DECODE_SDPA = ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def decode_attention(device: torch.device):
    """The SDPA kernels a rollout on `device` may use: all but cuDNN's on CUDA; unchanged elsewhere."""
    if torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([getattr(SDPBackend, name) for name in DECODE_SDPA])


class HFRollout:
    """Sampling with `model.generate` on a (possibly lower-precision) copy of the policy, on the
    policy's device."""

    def __init__(self, policy, tokenizer, dtype: torch.dtype = torch.bfloat16, batch_sequences: int = 32,
                 share_prefill: bool = True, loop: str = AUTO, min_new_tokens: int = 0, stop: list[str] = (),
                 prepacked_weights: str = AUTO):
        from rlpr.rollout.kept_cache import full_attention_cache

        self.tokenizer = tokenizer
        self.ends = stop_tokens(tokenizer, stop)  # rollout.stop: tokens that end a row early
        self.min_new_tokens = min_new_tokens  # rollout.min_new_tokens: generate's default (training rollouts)
        if loop != AUTO:
            decode_loop(loop)  # an unknown name fails before the rollout copy is made
        self.batch_sequences = batch_sequences
        self.share_prefill = share_prefill
        lm = causal_lm(policy)
        device = next(lm.parameters()).device
        # rollout.prepacked_weights resolved for this copy (model/prepacked.py): its Linear layers on
        # weights laid out once for oneDNN, laid out again by `sync` where they change
        self.prepacked = prepacked.resolve(prepacked_weights, device, dtype)
        self.model = plain_copy(lm, dtype, device)
        # rollout.decode_loop resolved for this copy: "rlpr" (rollout/decode.py), "generate"
        # (transformers') or "graph" (rollout/graph_decode.py)
        self.loop = resolve_loop(loop, self.model)
        self._decode = decode_loop(self.loop)
        # keep each response's KV cache on its Rollout (score B from the cache): set by the trainer
        # when reward.score_b_from_cache resolves on; `can_keep`: this loop and model support it
        self.keep_caches = False
        self.full_attention = full_attention_cache(self.model)  # every cache layer holds every position
        self.can_keep = self._decode.keeps and self.full_attention
        self._prompts = None  # `reusing_prompts`: the prompt prefills kept across generate calls
        self._stamps: dict = {}  # `sync`: per weight, the policy tensor it was copied from and its version then
        self.sync(policy)
        if self.prepacked:
            prepacked.prepack(self.model)

    def sleep(self) -> None:
        """Nothing to give back: the rollout copy is a plain module beside the policy."""

    @contextlib.contextmanager
    def keeping(self, on: bool = True):
        """Within the block, `generate` keeps each response's KV cache on its Rollout (`Rollout.cache`,
        rollout/kept_cache.py) where this decode loop and model allow it (`can_keep`)."""
        before = self.keep_caches
        self.keep_caches = on and self.can_keep
        try:
            yield
        finally:
            self.keep_caches = before

    @contextlib.contextmanager
    def reusing_prompts(self, budget_bytes: int | None = None):
        """Within the block, each prompt's prefill is computed once and reused by later `generate`
        calls on the same prompt (rollout/prompt_prefill.py: the held-out evaluation's greedy pass,
        then its sampled one), up to `budget_bytes` of keys and values (default BUDGET_BYTES).
        Nothing changes where the prefill is not shared (rollout.share_prefill=false) or the model's
        cache is not plain full attention. Leaving the block frees them; `sync` does too."""
        from rlpr.rollout.prompt_prefill import BUDGET_BYTES, PromptPrefills

        before = self._prompts
        on = self.share_prefill and self.full_attention
        self._prompts = PromptPrefills(BUDGET_BYTES if budget_bytes is None else budget_bytes) if on else None
        try:
            yield
        finally:
            self._prompts = before

    @torch.no_grad()
    def sync(self, policy, weights=None) -> None:
        """Copy the current policy weights (LoRA merged) into the sampling model, and lay out again the
        prepacked weights written. A weight that is one of the policy's own frozen tensors, unchanged
        since it was last copied (the same tensor, storage and in-place version: under LoRA the
        embedding, norms and a tied output layer), is not copied again; a change made through `.data`
        bypasses the version and would be missed (rlpr makes none: the update's bf16 swap of frozen
        weights restores the very tensors). `weights`: the (name, tensor) pairs to copy instead,
        consumed one at a time (a sharded policy's, gathered layer by layer:
        `sharding.FullySharded.full_weights`), all copied."""
        if self._prompts is not None:  # computed by the weights being replaced
            self._prompts = type(self._prompts)(self._prompts.budget)
        target = self.model.state_dict()
        own = {} if weights is not None else _own_tensors(policy)
        seen, written = set(), []
        for name, tensor in (merged_weights(policy).items() if weights is None else weights):
            seen.add(name)
            source = own.get((tensor.data_ptr(), tuple(tensor.shape)))  # trainable ones are always copied
            stamp = None if source is None or source.requires_grad else (source, source._version, source.data_ptr())
            last = self._stamps.get(name)
            if stamp is not None and last is not None and last[0] is source and last[1:] == stamp[1:]:
                continue
            target[name].copy_(tensor.to(target[name].dtype))
            written.append(target[name])
            self._stamps[name] = stamp  # None: copied at every sync
        missing = set(target) - seen
        if missing:
            raise RuntimeError(f"rollout model has weights the policy lacks: {sorted(missing)[:3]}")
        if self.prepacked:
            prepacked.repack(self.model, written)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, *, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seeds: list[int] | None = None,
                 min_new_tokens: int | None = None) -> list[Rollout]:
        """n responses per prompt, grouped by prompt (prompt 0's n first).

        Response j of prompt i is sampled from its own RNG seeded by (seeds[i], j), so it does not
        depend on which other prompts share the batch or the process. Temperature 0 is greedy.
        `min_new_tokens`: EOS cannot end a response before this many tokens (None: the configured
        rollout.min_new_tokens, for training rollouts; evaluation and serving pass 0).
        """
        min_new = self.min_new_tokens if min_new_tokens is None else min_new_tokens
        eos = self.tokenizer.eos_token_id
        pad = self.tokenizer.pad_token_id
        seeds = list(range(len(prompts))) if seeds is None else seeds
        flat = [(i, j, p) for i, p in enumerate(prompts) for j in range(n)]
        out: list[Rollout] = []
        with decode_attention(self.model.device):
            for start in range(0, len(flat), self.batch_sequences):
                out += self._generate_chunk(flat[start:start + self.batch_sequences], seeds, max_new_tokens,
                                            temperature, top_p, min_new, eos, pad)
        return out

    def _generate_chunk(self, chunk, seeds, max_new_tokens, temperature, top_p, min_new, eos, pad) -> list[Rollout]:
        """One batch of rows (prompt index, response index, prompt ids) of `generate`."""
        from rlpr.rollout.kept_cache import KeptCaches

        out: list[Rollout] = []
        width = max(len(p) for _, _, p in chunk)
        ids = torch.full((len(chunk), width), pad, dtype=torch.long)
        attn = torch.zeros_like(ids)
        for r, (_, _, p) in enumerate(chunk):
            ids[r, width - len(p):] = torch.tensor(p)
            attn[r, width - len(p):] = 1
        sampler = PerRowSampler([row_seed(seeds[i], j) for i, j, _ in chunk], temperature, top_p) \
            if temperature > 0 else None
        ids, attn = ids.to(self.model.device), attn.to(self.model.device)
        capacity = width + max_new_tokens if self._decode.preallocated else 0
        cache = self._shared_prefill(ids, attn, [i for i, _, _ in chunk], capacity, [p for _, _, p in chunk]) \
            if self.share_prefill else None
        keep = KeptCaches.for_batch([len(p) for _, _, p in chunk], width, (eos, *self.ends), self.model) \
            if self.keep_caches and self.can_keep else None
        more = {"keep": keep} if keep is not None else {}
        new = self._decode.run(self.model, ids, attn, sampler, max_new_tokens=max_new_tokens, eos=eos, pad=pad,
                               cache=cache, min_new_tokens=min_new, ends=self.ends, **more).cpu()
        ends = {eos, *self.ends}
        for r, (i, _, p) in enumerate(chunk):
            tokens = new[r].tolist()
            end = next((k for k, t in enumerate(tokens) if t in ends), None)
            finished = end is not None
            if finished:
                tokens = tokens[:end + 1]
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            out.append(Rollout(i, tokens, text, finished, cache=keep.row(r, p, tokens) if keep is not None else None))
        return out

    def _shared_prefill(self, ids: torch.Tensor, attn: torch.Tensor, prompt_of_row: list[int], capacity: int = 0,
                        prompts: list[list[int]] | None = None):
        """The KV cache of every prompt but its last token, computed once per distinct prompt and
        repeated for its rows (None when no prompt repeats). The decode loop (or `generate`) then
        runs only the last prompt token, for all rows, and samples as usual.

        Every response of a group shares its prompt, so a plain prefill repeats the same work n
        times (32 x 93 tokens: 1.5 s of a 7-10 s demo rollout; 4 x 93: 0.25 s). The rows keep their
        padding and positions, so the result equals the plain path up to float rounding of
        different matmul shapes (tests/test_rollout.py). With `capacity`, the cache is preallocated
        for that many positions (`decode.preallocated_cache`). Within `reusing_prompts` (`prompts`:
        each row's token ids) the prefill is split also where no prompt repeats, its prompts are
        kept, and a batch of prompts all kept starts from them without a forward."""
        from rlpr.rollout.decode import preallocated_cache

        firsts: dict[int, int] = {}
        for r, i in enumerate(prompt_of_row):
            firsts.setdefault(i, r)
        kept = self._prompts if prompts is not None else None
        if (len(firsts) == len(prompt_of_row) and kept is None) or ids.shape[1] < 2:
            return None
        slot = {i: k for k, i in enumerate(firsts)}  # prompt -> its row in the prefill batch
        unique = torch.tensor(list(firsts.values()), device=ids.device)
        rows = torch.tensor([slot[i] for i in prompt_of_row], device=ids.device)
        head_ids, head_mask = ids[unique, :-1], attn[unique, :-1]
        heads = [prompts[r] for r in firsts.values()] if kept is not None else []
        if kept is not None and kept.has(heads):
            cache = kept.cache(self.model.config, heads, head_ids.shape[1], capacity)
        else:
            cache = preallocated_cache(self.model.config, capacity) if capacity else None
            out = self.model(input_ids=head_ids, attention_mask=head_mask,
                             position_ids=position_ids_from_mask(head_mask), **cache_kwargs(self.model, cache),
                             use_cache=True, logits_to_keep=1)
            cache = output_cache(out)
            if kept is not None:
                kept.keep(cache, heads)
        cache.reorder_cache(rows)  # an index_select per layer: row r gets its prompt's keys/values
        return cache
