"""Log-probabilities of chosen tokens from any HF causal LM, without full-vocabulary logits for
every position.

Materialising [batch, length, vocab] logits dominates memory (fp32 32 x 400 x 49k = 2.5 GB per
copy), so we run the decoder once and project only the hidden states whose next token is wanted
through the output layer, in chunks. Position ids come from the attention mask, so left- and
right-padded batches give the same numbers as unpadded single sequences.
"""

from __future__ import annotations

import contextlib
import copy
import inspect

import torch


@contextlib.contextmanager
def eval_mode(model):
    """The model in eval mode (no dropout) for a no-grad pass over it, its own mode restored after."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def causal_lm(model):
    """The transformers model under a peft wrapper (LoRA layers stay injected and active)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def cache_kwargs(model, cache) -> dict:
    """The keyword that passes a KV cache to `model`'s forward: `cache` (transformers >= 5.20; it
    deprecates `past_key_values` with a FutureWarning on every call) or `past_key_values` (older 5.x,
    whose forward would take `cache` into **kwargs and silently ignore it)."""
    forward = type(model).forward
    name = _CACHE_KWARG.get(forward)
    if name is None:
        name = _CACHE_KWARG[forward] = "cache" if "cache" in inspect.signature(forward).parameters else "past_key_values"
    return {name: cache}


_CACHE_KWARG: dict = {}


def checkpointing_on(lm) -> bool:
    """Whether `lm` recomputes activations in backward (transformers renamed the property; the old
    name warns on every read)."""
    for name in ("is_activation_checkpointing", "is_gradient_checkpointing"):
        if hasattr(type(lm), name):
            return bool(getattr(lm, name))
    return False


def output_cache(output):
    """The KV cache a forward returned, under either transformers 5.x name."""
    return output["cache"] if "cache" in output else output["past_key_values"]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] positions counting only real tokens (padding anywhere gets position 0)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def hidden_states(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Final hidden states [B, T, H] (after the last norm) of the decoder."""
    lm = causal_lm(model)
    out = lm.get_decoder()(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids_from_mask(attention_mask),
        use_cache=False,
    )
    return out.last_hidden_state


FUSED_BACKWARD = True  # the projection's backward written out (`_LogprobEntropy`); False: autograd (tests, benchmarks)


def _scaled_log_softmax(logits: torch.Tensor, temperature: float, softcap=None) -> torch.Tensor:
    """fp32 log-softmax of output-layer logits [n, V], soft-capped (Gemma 2), then / temperature."""
    logits = logits.float()
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    if temperature != 1.0:  # x / 1.0 == x: skip a full-vocabulary copy
        logits = logits / temperature
    return torch.log_softmax(logits, dim=-1)


def _target_logp_entropy(logp_all: torch.Tensor, targets: torch.Tensor, with_entropy: bool):
    """(log-prob of `targets` [n], entropy [n] or an empty tensor) from a log-softmax [n, V]."""
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    if not with_entropy:
        return logp, logp.new_zeros(0)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


class _LogprobEntropy(torch.autograd.Function):
    """`_rows_logprobs` (no soft-capping) with its backward written out. Autograd keeps, or under a
    checkpoint recomputes, the fp32 log-softmax, its exp and their product per row and runs five
    full-vocabulary ops back through them; this keeps only the logits, recomputes the log-softmax
    once and forms the gradient in place:
        dL/dz = (g_logp * (onehot - p) - g_entropy * p * (log p + H)) / T.
    The forward is the same ops (the same bits); the gradients are as close to fp64 as autograd's
    (tests/test_logprob_backward.py). 0.21 s of a 6.4 s update at speed.py's settings (AMD EPYC, 2 cores;
    benchmarks/logprob_backward.py (retired; code in commit a0f9d4c))."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, with_entropy):
        logp, entropy = _target_logp_entropy(_scaled_log_softmax(logits, temperature), targets, with_entropy)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(logits, targets, entropy)
        ctx.temperature = temperature
        return logp, entropy

    @staticmethod
    def backward(ctx, g_logp, g_entropy):  # autograd materializes an unused output's gradient as zeros
        logits, targets, entropy = ctx.saved_tensors
        logp_all = _scaled_log_softmax(logits, ctx.temperature)
        p = logp_all.exp()
        coef = g_logp[:, None]
        if entropy.numel():
            coef = logp_all.add_(entropy[:, None]).mul_(g_entropy[:, None]).add_(coef)
        grad = p.mul_(coef).neg_().scatter_add_(-1, targets[:, None], g_logp[:, None])
        if ctx.temperature != 1.0:
            grad.div_(ctx.temperature)
        return grad.to(logits.dtype), None, None, None


def _fused(logits: torch.Tensor, softcap) -> bool:
    return FUSED_BACKWARD and not softcap and torch.is_grad_enabled() and logits.requires_grad


def _rows_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float, softcap,
                   with_entropy: bool):
    """fp32 log-prob of `targets` [n] (and entropy [n]) from output-layer logits [n, V]."""
    if _fused(logits, softcap):
        return _LogprobEntropy.apply(logits, targets, temperature, with_entropy)
    return _target_logp_entropy(_scaled_log_softmax(logits, temperature, softcap), targets, with_entropy)


def _head_rows_logprobs(head, hidden: torch.Tensor, targets: torch.Tensor, temperature: float, softcap,
                        with_entropy: bool):
    """`_rows_logprobs` of the output layer's logits for `hidden` [n, H] (recomputed in backward)."""
    return _rows_logprobs(head(hidden), targets, temperature, softcap, with_entropy)


def project_logprobs(model, hidden: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0,
                     with_entropy: bool = False, chunk: int = 512, softmax_rows: int | None = 64,
                     recompute_head: bool | None = None):
    """Log-prob of `targets` [N] given hidden states [N, H]; logits / temperature, fp32 softmax.

    The output layer runs on `chunk` rows at a time; the fp32 softmax part on `softmax_rows` rows
    at a time, and under autograd only the output layer's logits are kept for backward, which
    recomputes each piece's log-softmax there (`_LogprobEntropy`; with soft-capped logits a
    checkpoint of the plain ops), instead of keeping several fp32 [chunk, vocab] tensors per chunk
    (400 MB at 512 rows of a 49k vocabulary). Every softmax op works row by row, so the values and
    gradients are bit-identical to `softmax_rows=None` (one piece per chunk; tests/test_forward.py).

    `recompute_head` (default: when the model has gradient checkpointing on) checkpoints the output
    layer too, per `softmax_rows` piece: backward keeps no logits at all and recomputes them, one
    extra output-layer matmul per token. The kept logits are otherwise the largest activation under
    checkpointing (a response token's [vocab] row: 196 KB in fp32 for a 49k vocabulary, against
    its decoder checkpoints of 69 KB for the 30 layers of SmolLM2-135M), and they grow with the
    tokens of a micro-batch.

    Returns (logp [N], entropy [N] or None).
    """
    from torch.utils.checkpoint import checkpoint

    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    if recompute_head is None:
        recompute_head = checkpointing_on(lm)
    if recompute_head and torch.is_grad_enabled() and hidden.requires_grad and softmax_rows:
        logps, ents = [], []
        for piece, tgt in zip(hidden.split(softmax_rows), targets.split(softmax_rows)):
            logp, ent = checkpoint(_head_rows_logprobs, head, piece, tgt, temperature, softcap, with_entropy,
                                   use_reentrant=False)
            logps.append(logp)
            ents.append(ent)
        empty = hidden.new_zeros(0, dtype=torch.float32)
        logp = torch.cat(logps) if logps else empty
        return logp, ((torch.cat(ents) if ents else empty) if with_entropy else None)
    logps, ents = [], []
    for start in range(0, hidden.shape[0], chunk):
        logits = head(hidden[start:start + chunk])
        rows = softmax_rows or logits.shape[0]
        for piece, tgt in zip(logits.split(rows), targets[start:start + chunk].split(rows)):
            if torch.is_grad_enabled() and piece.requires_grad and softmax_rows and not _fused(piece, softcap):
                logp, ent = checkpoint(_rows_logprobs, piece, tgt, temperature, softcap, with_entropy,
                                       use_reentrant=False)
            else:
                logp, ent = _rows_logprobs(piece, tgt, temperature, softcap, with_entropy)
            logps.append(logp)
            ents.append(ent)
        del logits
    empty = hidden.new_zeros(0, dtype=torch.float32)
    logp = torch.cat(logps) if logps else empty
    entropy = (torch.cat(ents) if ents else empty) if with_entropy else None
    return logp, entropy


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   target_mask: torch.Tensor, temperature: float = 1.0, with_entropy: bool = False,
                   chunk: int = 512):
    """Log-probs of the tokens marked in `target_mask` [B, T] (bool), each given all tokens before it.

    Position 0 cannot be a target. Returns (logp [N], entropy [N] or None) in row-major order of
    the marked positions.
    """
    if target_mask[:, 0].any():
        raise ValueError("the first token of a sequence has no context and cannot be scored")
    hidden = hidden_states(model, input_ids, attention_mask)
    pred = target_mask[:, 1:]
    return project_logprobs(model, hidden[:, :-1][pred], input_ids[:, 1:][pred], temperature,
                            with_entropy, chunk)


class PrefixState:
    """A prefix's decoder state: per-layer keys/values [1, heads, P, d] and its last hidden state
    [1, 1, H] (the state before the first continuation token)."""

    def __init__(self, model, prefix: list[int]):
        lm = causal_lm(model)
        self.config = lm.config
        self.length = len(prefix)
        device = next(lm.parameters()).device
        head = lm.get_decoder()(input_ids=torch.tensor([prefix], device=device), use_cache=True)
        self.kv = [(layer.keys, layer.values) for layer in output_cache(head).layers]
        self.last_hidden = head.last_hidden_state[:, -1:]

    def tensors(self) -> list[torch.Tensor]:
        return [t for kv in self.kv for t in kv] + [self.last_hidden]

    def detached(self) -> "PrefixState":
        """A copy whose tensors are autograd leaves: backward passes through continuations stop
        there and sum their gradients in `.grad`, for one later backward through the prefix
        (`backward_from`)."""
        leaf = copy.copy(self)
        leaf.kv = [(k.detach().requires_grad_(k.requires_grad), v.detach().requires_grad_(v.requires_grad))
                   for k, v in self.kv]
        leaf.last_hidden = self.last_hidden.detach().requires_grad_(self.last_hidden.requires_grad)
        return leaf

    def backward_from(self, leaf: "PrefixState") -> None:
        """Backward through the prefix with the gradients summed at `leaf` (a `detached()` copy)."""
        pairs = [(t, g.grad) for t, g in zip(self.tensors(), leaf.tensors()) if g.grad is not None]
        if pairs:
            torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])

    def cache(self, n: int):
        from transformers import DynamicCache

        return DynamicCache([(k.repeat_interleave(n, 0), v.repeat_interleave(n, 0)) for k, v in self.kv],
                            config=self.config)


def continuation_hidden(model, state: PrefixState, continuations: list[list[int]], targets: list[list[bool]]):
    """(hidden states [N, H] before each marked continuation token, those tokens [N]), in row-major
    order, the prefix run once (`state`) and its KV cache repeated for the continuations.

    In RL every prompt has n responses, and the prompt is often most of the tokens: this does the
    same arithmetic on about (P + n C) instead of n (P + C) tokens. `targets[i][j]` marks
    continuation token j (the hidden state given prefix + continuation[:j]). Gradients flow through
    the shared prefix. `model.packing` runs the continuations packed into rows instead."""
    lm = causal_lm(model)
    n, width = len(continuations), max(len(c) for c in continuations)
    ids = torch.full((n, width), 0, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    target = torch.zeros((n, width), dtype=torch.bool)
    for i, (c, t) in enumerate(zip(continuations, targets)):
        ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, :len(c)] = 1
        target[i, :len(c)] = torch.tensor(t, dtype=torch.bool)
    device = next(lm.parameters()).device
    ids, mask, target = ids.to(device), mask.to(device), target.to(device)
    p = state.length
    decoder = lm.get_decoder()
    out = decoder(input_ids=ids, attention_mask=torch.cat([mask.new_ones(n, p), mask], dim=1),
                  position_ids=p + position_ids_from_mask(mask), **cache_kwargs(decoder, state.cache(n)),
                  use_cache=True)
    # the hidden state before continuation token j: the prefix's last one for j = 0
    before = torch.cat([state.last_hidden.expand(n, 1, -1), out.last_hidden_state[:, :-1]], dim=1)
    return before[target], ids[target]


def past_continuation_hidden(model, pasts: list[torch.Tensor], continuations: list[list[int]],
                             targets: list[list[bool]]):
    """`continuation_hidden` for rows that each continue their own past: `pasts[i]` [layers, 2, kv
    heads, L_i, head dim] holds the keys and values of a sequence's first L_i tokens (positions
    0..L_i-1, rotary applied; a rollout's kept cache, rollout/kept_cache.py), and continuation i runs
    on top of it. The pasts are left-padded to the longest in one cache (in the model's dtype), the
    attention mask covers past + new, and position ids are L_i + j. The hidden state before a row's
    first continuation token is not computed: `targets[i][0]` must be False."""
    if any(t and t[0] for t in targets):
        raise ValueError("a continuation's first token has no hidden state before it here; start it a token earlier")
    lm = causal_lm(model)
    param = next(lm.parameters())
    n, width = len(continuations), max(len(c) for c in continuations)
    lengths = [p.shape[-2] for p in pasts]
    longest = max(lengths)
    layers, _, heads, _, dim = pasts[0].shape
    past = torch.zeros(layers, 2, n, heads, longest, dim, dtype=param.dtype, device=param.device)
    ids = torch.zeros((n, width), dtype=torch.long)
    mask = torch.zeros((n, longest + width), dtype=torch.long)
    target = torch.zeros((n, width), dtype=torch.bool)
    for i, (p, c, t) in enumerate(zip(pasts, continuations, targets)):
        past[:, :, i, :, longest - lengths[i]:] = p.to(device=param.device, dtype=param.dtype)
        ids[i, :len(c)] = torch.tensor(c, dtype=torch.long)
        mask[i, longest - lengths[i]:longest + len(c)] = 1
        target[i, :len(c)] = torch.tensor(t, dtype=torch.bool)
    ids, mask, target = ids.to(param.device), mask.to(param.device), target.to(param.device)
    positions = torch.tensor(lengths, device=param.device)[:, None] + torch.arange(width, device=param.device)
    from transformers import DynamicCache

    cache = DynamicCache([(past[layer, 0], past[layer, 1]) for layer in range(layers)], config=lm.config)
    decoder = lm.get_decoder()
    out = decoder(input_ids=ids, attention_mask=mask, position_ids=positions, **cache_kwargs(decoder, cache),
                  use_cache=True)
    pred = target[:, 1:]
    return out.last_hidden_state[:, :-1][pred], ids[:, 1:][pred]


def head_logits(model, hidden: torch.Tensor) -> torch.Tensor:
    """fp32 output-layer logits [n, V] of hidden states [n, H], after the model's logit soft-capping
    (no temperature)."""
    lm = causal_lm(model)
    logits = lm.get_output_embeddings()(hidden).float()
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    return torch.tanh(logits / softcap) * softcap if softcap else logits


def _rows_value(model, hidden: torch.Tensor, fn, temperature: float, *per_row: torch.Tensor) -> torch.Tensor:
    logits = head_logits(model, hidden)
    return fn(logits / temperature if temperature != 1.0 else logits, *per_row)


def project_rows(model, hidden: torch.Tensor, fn, *per_row: torch.Tensor, temperature: float = 1.0,
                 rows: int = 64) -> torch.Tensor:
    """fn(logits / temperature [n, V], *pieces of `per_row`) -> [n] over the hidden states [N, H],
    `rows` at a time: a per-token value of the whole next-token distribution (OPSD's divergence to the
    teacher). Under autograd each piece is checkpointed, output layer included: backward keeps no
    [n, V] logits and recomputes them (one more output-layer matmul per token). Returns [N]."""
    from torch.utils.checkpoint import checkpoint

    out = []
    for start in range(0, hidden.shape[0], rows):
        piece = hidden[start:start + rows]
        extra = [t[start:start + rows] for t in per_row]
        if torch.is_grad_enabled() and piece.requires_grad:
            out.append(checkpoint(_rows_value, model, piece, fn, temperature, *extra, use_reentrant=False))
        else:
            out.append(_rows_value(model, piece, fn, temperature, *extra))
    return torch.cat(out) if out else hidden.new_zeros(0, dtype=torch.float32)


@torch.no_grad()
def distribution_stats(model, hidden: torch.Tensor, rows: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """The next-token distribution p_t after each of the hidden states [N, H] (temperature 1, fp32,
    after the model's logit soft-capping): (entropy H(p_t) [N], mean over the vocabulary of
    log p_t(v) [N]). The label-free rewards read these (entropy: EM-RL / RENT; self-certainty:
    INTUITOR). The output layer runs on `rows` positions at a time, so a 262k vocabulary costs
    rows x V floats, not N x V."""
    lm = causal_lm(model)
    head = lm.get_output_embeddings()
    softcap = getattr(lm.config, "final_logit_softcapping", None)
    ents, means = [], []
    for piece in hidden.split(rows):
        logits = head(piece).float()
        if softcap:
            logits = torch.tanh(logits / softcap) * softcap
        logp = torch.log_softmax(logits, dim=-1)
        ents.append(-(logp.exp() * logp).sum(-1))
        means.append(logp.mean(-1))
    empty = hidden.new_zeros(0, dtype=torch.float32)
    return (torch.cat(ents) if ents else empty), (torch.cat(means) if means else empty)
