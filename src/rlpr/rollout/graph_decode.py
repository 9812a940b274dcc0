"""A decode loop of fixed shapes, replayed as CUDA graphs on a GPU (rollout.decode_loop=graph).

rlpr's eager loop (decode.py) spends ~27 ms per token on a GPU launching the kernels of one step from
Python (benchmarks/results/gpu_check.md), while the weights of a 0.5B model stream from HBM in well
under 1 ms. Here every tensor a decode step touches has a fixed address and shape, so the step is
captured once as a CUDA graph and replayed:

- the KV cache is static: buffers [rows, kv heads, capacity, head dim] per layer, the new position
  written at a device index (`StaticLayer`), attention reading the first `span` positions, with an
  additive mask [rows, 1, 1, capacity] kept on the device;
- attention of the one new query runs over the grouped KV heads without repeating them
  (`grouped_decode_attention`; transformers' SDPA path copies every KV head per query head);
- finished rows are handled on the device (their outputs stay pad); the host looks at the rows'
  state once every `check_every` steps, to stop when all rows ended and to move the live rows into
  a smaller batch bucket (powers of two), so finished rows stop costing;
- sampling draws from the same per-row generators as the eager loop: each row's uniforms for the
  whole response are drawn up front (the same stream as one draw per token:
  tests/test_graph_decode.py), so a response does not depend on which loop produced it.

One graph per (batch bucket, attention span bucket) is captured when first needed and kept with the
engine's rollout copy (weights are synced in place, so graphs stay valid). On a CPU the same code
runs without graphs; tests there prove its tokens equal the eager loop's, for every family
(tests/test_graph_windows.py).

Sliding-window layers (Gemma 2 and 3, Mistral, Qwen2 with use_sliding_window) keep every position in
the same static buffers as full-attention layers; each step derives one more additive mask per window
size from the step's mask (the positions at or before `pos - window` hidden, transformers'
`kv_idx > q_idx - window`), and the attention of a sliding layer reads it instead of the step's mask.
Their attention therefore spans the whole bucket, not just the window: exact, and for a 270M model at
a few thousand tokens the extra reads are small beside the weights. Other special layers (chunked,
linear attention) take the eager loop.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer

from rlpr.model.forward import cache_kwargs, output_cache, position_ids_from_mask
from rlpr.model.packing import attention_windows
from rlpr.rollout.fused_step import fused_step
from rlpr.rollout.sampling import inverse_cdf

log = logging.getLogger(__name__)

DECODE_ATTENTION = "rlpr_decode"
SPAN_STEP = 256  # attention span buckets: a step attends over the smallest multiple of this that holds its length
CHECK_EVERY = 16  # decode steps between looks at the rows' state (one host synchronisation each)
# how a decode step attends: "matmul" (grouped matmuls, softmax in fp32: transformers' eager numerics)
# or "sdpa" (torch's scaled_dot_product_attention over the grouped heads, enable_gqa: one fused kernel
# where the GPU has one for a float mask); benchmarks/gpubench/decode.py measures both on a GPU
KERNEL = "matmul"


class _Windows:
    """The sliding windows of the step being run: per layer its window (None: full attention), and per
    window the step's additive mask with the positions outside it hidden (set by `_step`, read by
    `grouped_decode_attention`, which transformers calls with the layer's module only)."""

    layers: list = []
    masks: dict = {}


def grouped_decode_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, softcap=None,
                             sliding_window=None, **kwargs):
    """transformers' eager attention for a few new queries over a static cache, without `repeat_kv`.

    query [B, H, q, D], key/value [B, Hkv, L, D] (query head h reads KV head h // (H / Hkv), as
    `repeat_kv` maps them), attention_mask additive [B, 1, q, L]; a sliding-window layer reads its
    window's mask of the step instead (`_Windows`). Returns ([B, q, H, D], None). Softmax in fp32, as
    transformers' eager path."""
    window = _Windows.layers[module.layer_idx] if _Windows.layers else None
    if sliding_window is not None and sliding_window != window:
        raise ValueError(f"layer {getattr(module, 'layer_idx', '?')} slides over {sliding_window} positions, "
                         f"but the static decode loop set it up with {window}")
    if window is not None:
        attention_mask = _Windows.masks[window]
    if KERNEL == "sdpa" and softcap is None:
        out = torch.nn.functional.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask.to(query.dtype), scale=scaling, enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None
    b, h, q, d = query.shape
    hkv = key.shape[1]
    group = h // hkv
    scale = d ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query.reshape(b, hkv, group * q, d), key.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.view(b, hkv, group, q, -1) + attention_mask[:, :, None]
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    out = torch.matmul(probs.view(b, hkv, group * q, -1), value)  # [B, Hkv, group * q, D]
    return out.view(b, h, q, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_ATTENTION, grouped_decode_attention)


def supports_static_decode(model) -> bool:
    """Whether the static loop can decode `model`: its cache layers are full-attention or sliding-window
    ones (`packing.attention_windows`; not chunked or linear attention)."""
    return attention_windows(model) is not None


class StaticLayer(DynamicLayer):
    """One layer's keys/values in fixed buffers [B, Hkv, C, D]. A forward of one new position writes
    it at `state.pos` (a device tensor) in the first `state.rows` rows and attends over the first
    `state.span` positions: shapes and addresses that a CUDA graph can replay."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, state: "DecodeState"):
        super().__init__()
        self.k_buf, self.v_buf, self.state = keys, values, state
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        rows, span = self.state.rows, self.state.span
        keys, values = self.k_buf[:rows], self.v_buf[:rows]
        keys.index_copy_(2, self.state.pos, key_states)
        values.index_copy_(2, self.state.pos, value_states)
        return keys[:, :, :span], values[:, :, :span]

    def get_seq_length(self) -> int:
        return self.state.length


@dataclass
class DecodeState:
    """The device tensors one decode step reads and writes (rows = the batch capacity + 1 spare row
    that the padding rows of a bucket write their outputs to)."""

    tokens: torch.Tensor  # [R] long: each row's last token (the next step's input)
    positions: torch.Tensor  # [R, 1] long: each row's position of that token
    mask: torch.Tensor  # [R, 1, 1, C] additive attention mask over the cache positions
    done: torch.Tensor  # [R] bool: the row has ended (EOS or a stop token)
    rows_of: torch.Tensor  # [R] long: the output row of each batch row (the spare row for padding)
    uniforms: torch.Tensor  # [R_out + 1, T] float64: each output row's uniform draw per step
    out: torch.Tensor  # [R_out + 1, T] long: the new tokens of each output row (pad after its end)
    pos: torch.Tensor  # [1] long: the cache position the next step writes
    slots: torch.Tensor  # [C] long: 0..C-1, the cache positions (sliding windows' masks compare them with pos)
    step: torch.Tensor  # [1] long: the next step's index
    rows: int = 0  # the batch bucket the next step runs (host side)
    span: int = 0  # the attention span the next step reads (host side)
    length: int = 0  # cache positions filled (host side, = pos)


@dataclass
class StaticDecoder:
    """The static buffers and captured graphs of one rollout copy, kept across `generate` calls."""

    capacity: int = 0  # cache positions
    batch: int = 0  # rows
    steps: int = 0  # max new tokens the output buffers hold
    keys: list = field(default_factory=list)
    values: list = field(default_factory=list)
    state: DecodeState | None = None
    graphs: dict = field(default_factory=dict)
    pool: object = None
    capture_s: float = 0.0  # seconds spent warming up and capturing graphs (all calls)
    shapes: set = field(default_factory=set)  # the (rows, span) pairs steps ran with (all calls)
    failed: str = ""  # why graphs are off for this copy (a capture failed), else ""


_DECODERS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def decoder_for(model) -> StaticDecoder:
    """The static decoder kept with the rollout copy `model` (one per copy)."""
    dec = _DECODERS.get(model)
    if dec is None:
        dec = _DECODERS[model] = StaticDecoder()
    return dec


def buckets(batch: int) -> list[int]:
    """Batch sizes graphs are captured for: powers of two below `batch`, and `batch`."""
    sizes, b = {batch}, 1
    while b < batch:
        sizes.add(b)
        b *= 2
    return sorted(sizes)


def _span(length: int, capacity: int) -> int:
    return min(capacity, -(-length // SPAN_STEP) * SPAN_STEP)


def _kv_shape(model, first_layer) -> tuple[int, int]:
    if first_layer is not None:
        return first_layer.shape[1], first_layer.shape[-1]
    c = model.config
    return c.num_key_value_heads, getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads


def _ensure_buffers(dec: StaticDecoder, model, batch: int, capacity: int, steps: int, kv_heads: int, head_dim: int):
    """(Re)allocate the static buffers when this call needs more rows, positions or steps (graphs of
    the old buffers are dropped)."""
    p = next(model.parameters())
    need = (batch > dec.batch or capacity > dec.capacity or steps > dec.steps
            or not dec.keys or dec.keys[0].shape[1] != kv_heads or dec.keys[0].shape[-1] != head_dim)
    if not need:
        return
    batch, capacity, steps = max(batch, dec.batch), max(capacity, dec.capacity), max(steps, dec.steps)
    # the graphs read the old buffers: dropped, and their memory pool with them (the allocator frees a
    # pool once no graph uses it, and a capture into a freed pool's handle fails an internal assert)
    dec.graphs.clear()
    dec.pool = None
    dec.keys = dec.values = []  # free the old buffers before the new ones are taken
    layers = len(DynamicCache(config=model.config).layers)
    shape = (batch + 1, kv_heads, capacity, head_dim)
    dec.keys = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in range(layers)]
    dec.values = [torch.zeros(shape, dtype=p.dtype, device=p.device) for _ in range(layers)]
    dev = p.device
    dec.state = DecodeState(
        tokens=torch.zeros(batch + 1, dtype=torch.long, device=dev),
        positions=torch.zeros(batch + 1, 1, dtype=torch.long, device=dev),
        mask=torch.zeros(batch + 1, 1, 1, capacity, dtype=p.dtype, device=dev),
        done=torch.ones(batch + 1, dtype=torch.bool, device=dev),
        rows_of=torch.full((batch + 1,), batch, dtype=torch.long, device=dev),
        uniforms=torch.zeros(batch + 1, steps, dtype=torch.float64, device=dev),
        out=torch.zeros(batch + 1, steps, dtype=torch.long, device=dev),
        pos=torch.zeros(1, dtype=torch.long, device=dev),
        slots=torch.arange(capacity, device=dev),
        step=torch.zeros(1, dtype=torch.long, device=dev))
    dec.batch, dec.capacity, dec.steps = batch, capacity, steps


@dataclass(frozen=True)
class StepSpec:
    """What a captured step bakes in besides the buffers."""

    eos: int
    pad: int
    stops: tuple[int, ...]
    min_new_tokens: int
    temperature: float  # 0: greedy
    top_p: float
    windows: tuple = ()  # the distinct sliding windows of the model's layers


def _step(model, cache, s: DecodeState, spec: StepSpec, stop: torch.Tensor, probabilities, forward=None):
    """One decode step on the first `s.rows` rows, device tensors only (no host synchronisation).
    `forward`: a `fused_step` of the model (None: the model's own forward)."""
    b = s.rows
    s.mask[:b].index_fill_(-1, s.pos, 0.0)  # the position written now becomes visible
    mask = s.mask[:b, :, :, :s.span]
    # a sliding layer sees the positions after pos - window (transformers: kv_idx > q_idx - window)
    _Windows.masks = {w: mask.masked_fill(s.slots[:s.span] <= s.pos - w, torch.finfo(mask.dtype).min)
                      for w in spec.windows}
    if forward is not None:
        logits = forward(s.tokens[:b, None], mask, s.positions[:b], cache)
    else:
        logits = model(input_ids=s.tokens[:b, None], attention_mask=mask, position_ids=s.positions[:b],
                       **cache_kwargs(model, cache), use_cache=True, logits_to_keep=1).logits[:, -1]
    scores = logits.float()
    if spec.min_new_tokens > 0:
        blocked = torch.where(s.step < spec.min_new_tokens, float("-inf"), scores[:, spec.eos])
        scores[:, spec.eos] = blocked
    rows = s.rows_of[:b]
    if spec.temperature > 0:
        u = s.uniforms[rows, s.step.expand(b)]
        tokens = inverse_cdf(probabilities(scores), u)
    else:
        tokens = scores.argmax(-1)
    done = s.done[:b]
    s.out.index_put_((rows, s.step.expand(b)), torch.where(done, spec.pad, tokens))
    done |= (tokens[:, None] == stop).any(-1)
    s.tokens[:b].copy_(tokens)
    s.positions[:b] += 1
    s.pos += 1
    s.step += 1


@torch.no_grad()
def static_sample(model, ids: torch.Tensor, attn: torch.Tensor, sampler, *, max_new_tokens: int, eos: int, pad: int,
                  cache=None, min_new_tokens: int = 0, ends: tuple[int, ...] = (), graphs: bool | None = None,
                  check_every: int | None = None, keep=None) -> torch.Tensor:
    """The new tokens [B, max_new_tokens] (pad after a row's end) of left-padded prompts, as
    `decode.sample` returns them, from the static loop (CUDA graphs on a GPU unless `graphs` is False).

    `sampler`: a `PerRowSampler` (None: greedy). `cache`: the shared prefill's cache of every prompt
    but its last token, or None (the loop prefills them). `keep`: a `kept_cache.KeptCaches` that copies
    each row's cache out before compaction overwrites it, and at the end."""
    batch, width = ids.shape
    if max_new_tokens <= 0:
        return torch.full((batch, max(max_new_tokens, 0)), pad, dtype=torch.long)
    windows = attention_windows(model)
    if windows is None:
        raise ValueError(f"the static decode loop cannot decode {type(model).__name__}: a cache layer is neither "
                         "full attention nor a sliding window")
    device = ids.device
    use_graphs = device.type == "cuda" if graphs is None else graphs
    check_every = check_every or CHECK_EVERY
    dec = decoder_for(model)
    if width > 1 and cache is None:  # prefill every prompt but its last token
        head = attn[:, :-1]
        cache = output_cache(model(input_ids=ids[:, :-1], attention_mask=head, position_ids=position_ids_from_mask(head),
                                   **cache_kwargs(model, DynamicCache(config=model.config)), use_cache=True,
                                   logits_to_keep=1))
    prefilled = cache.layers if cache is not None and width > 1 else []
    kv_heads, head_dim = _kv_shape(model, prefilled[0].keys if prefilled else None)
    capacity = _span(width + max_new_tokens, 1 << 62)
    _ensure_buffers(dec, model, batch, capacity, max_new_tokens, kv_heads, head_dim)
    s = dec.state
    full = dec.batch
    # -- the state of the first step: prompts' KV, masks, positions, the rows' draws
    for k, v, layer in zip(dec.keys, dec.values, prefilled):
        kept = layer.keys.shape[2]  # width - 1, or a sliding layer's last window - 1 positions
        k[:batch, :, width - 1 - kept:width - 1].copy_(layer.keys)
        v[:batch, :, width - 1 - kept:width - 1].copy_(layer.values)
    neg = torch.finfo(s.mask.dtype).min
    s.mask.fill_(neg)
    s.mask[:batch, 0, 0, :width] = torch.where(attn.bool(), 0.0, neg).to(s.mask.dtype)
    s.mask[batch:, 0, 0, 0] = 0.0  # padding rows see one position: no row's softmax is empty
    s.tokens.zero_()
    s.tokens[:batch] = ids[:, -1]
    s.positions.zero_()
    s.positions[:batch] = position_ids_from_mask(attn)[:, -1:]
    s.done.fill_(True)
    s.done[:batch] = False
    s.rows_of.fill_(full)
    s.rows_of[:batch] = torch.arange(batch, device=device)
    s.out.fill_(pad)
    if sampler is not None:
        s.uniforms[:batch, :max_new_tokens] = sampler.uniforms(max_new_tokens).to(device)
    s.pos.fill_(width - 1)
    s.step.zero_()
    s.length = width - 1
    spec = StepSpec(eos, pad, tuple(ends), min_new_tokens, sampler.temperature if sampler is not None else 0.0,
                    sampler.top_p if sampler is not None else 1.0, tuple(sorted({w for w in windows if w})))
    stop = torch.tensor([eos, *ends], dtype=torch.long, device=device)
    probabilities = sampler.probabilities if sampler is not None else None
    forward = fused_step(model, DECODE_ATTENTION)  # q/k/v and gate/up in one product each (Llama's shape), or None
    static = DynamicCache(config=model.config)
    static.layers = [StaticLayer(k, v, s) for k, v in zip(dec.keys, dec.values)]
    live = batch
    s.rows = min(b for b in buckets(full) if b >= batch)
    previous = model.config._attn_implementation
    model.config._attn_implementation = DECODE_ATTENTION
    _Windows.layers = windows if spec.windows else []
    try:
        for step in range(max_new_tokens):
            s.span = _span(s.length + 1, dec.capacity)
            dec.shapes.add((s.rows, s.span))
            graphed = use_graphs and not dec.failed
            run = _graph(dec, model, static, spec, stop, probabilities, forward) if graphed else None
            if run is not None:
                run.replay()
            else:
                _step(model, static, s, spec, stop, probabilities, forward)
            s.length += 1
            if step == max_new_tokens - 1:
                break
            if (step + 1) % check_every == 0:
                live = int((~s.done[:s.rows]).sum())
                if live == 0:
                    break
                smaller = min(b for b in buckets(full) if b >= live)
                if smaller < s.rows:
                    if keep is not None:
                        _keep(dec, s, keep, s.done[:s.rows].nonzero()[:, 0], max_new_tokens)
                    _compact(dec, s, smaller)
    finally:
        model.config._attn_implementation = previous
        _Windows.layers, _Windows.masks = [], {}
    if keep is not None:
        _keep(dec, s, keep, torch.arange(s.rows, device=device), max_new_tokens)
    return s.out[:batch, :max_new_tokens].clone()


def _keep(dec: StaticDecoder, s: DecodeState, keep, batch_rows: torch.Tensor, steps: int) -> None:
    """Hand the caches of batch rows `batch_rows` (the spare padding rows left out) to `keep`."""
    out_rows = s.rows_of[batch_rows]
    real = out_rows < dec.batch
    keep.take(list(zip(dec.keys, dec.values)), batch_rows[real].tolist(), out_rows[real].tolist(),
              s.out[:, :steps])


def _compact(dec: StaticDecoder, s: DecodeState, rows: int) -> None:
    """Move the live rows of the current bucket to the front and run the next steps on `rows` rows."""
    keep = (~s.done[:s.rows]).nonzero()[:, 0]
    n = keep.numel()
    for buf in (*dec.keys, *dec.values):
        buf[:n] = buf.index_select(0, keep)
    for t in (s.tokens, s.positions, s.mask, s.rows_of):
        t[:n] = t.index_select(0, keep)
    s.done[:n] = False
    s.done[n:rows] = True
    s.rows_of[n:rows] = dec.batch  # padding rows write to the spare output row
    s.mask[n:rows] = torch.finfo(s.mask.dtype).min
    s.mask[n:rows, 0, 0, 0] = 0.0
    s.rows = rows


def _graph(dec: StaticDecoder, model, cache, spec: StepSpec, stop, probabilities, forward=None):
    """The CUDA graph of one step for the state's (rows, span) and `spec`: captured the first time
    (after a warm-up step whose effects are undone), replayed after. None when capture failed: the
    loop then runs the same step eagerly (logged once)."""
    s = dec.state
    key = (s.rows, s.span, spec, forward is not None, KERNEL)
    graph = dec.graphs.get(key)
    if graph is not None:
        return graph
    start = time.perf_counter()
    saved = [t.clone() for t in (s.tokens, s.positions, s.mask, s.done, s.out, s.pos, s.step)]
    try:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _step(model, cache, s, spec, stop, probabilities, forward)  # warm-up: cuBLAS handles, allocator
        torch.cuda.current_stream().wait_stream(side)
        for t, old in zip((s.tokens, s.positions, s.mask, s.done, s.out, s.pos, s.step), saved):
            t.copy_(old)
        if dec.pool is None:
            dec.pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=dec.pool):
            _step(model, cache, s, spec, stop, probabilities, forward)
    except Exception as exc:  # a model whose step cannot be captured: the same step, eagerly
        torch.cuda.synchronize()
        for t, old in zip((s.tokens, s.positions, s.mask, s.done, s.out, s.pos, s.step), saved):
            t.copy_(old)
        dec.failed = f"{type(exc).__name__}: {exc}"
        log.warning("rollout: CUDA graph capture failed (%s); decoding without graphs", dec.failed)
        return None
    dec.capture_s += time.perf_counter() - start
    dec.graphs[key] = graph
    return graph
