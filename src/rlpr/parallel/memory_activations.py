"""The memory terms of the forward passes: an update micro-batch's activations and the no-grad forwards.

The update's activations grow with the micro-batch and are the hardest term to count: they follow
the shape of one micro-batch (`MicroBatch`: rows, the shared prompt prefix, response length), what
an HF Llama/Qwen2 decoder layer saves for its backward per token and per key position (checked
against torch's saved tensors in tests/test_memory_plan.py), the output layer's chunked logits, bf16
autocast's weight casts and fsdp's gathered layers. The no-grad forwards of the scoring phase (and
the rollout's prefill) hold one layer's temporaries at a time (`_no_grad_bytes`). This is the
per-layer arithmetic of rlpr/model/forward.py's passes, kept apart from the states and the rollout
engine (rlpr/parallel/memory_plan.py puts the terms together); pure arithmetic on
rlpr.parallel.memory_types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from rlpr.parallel.memory_types import BF16, FP32, Architecture, Setup, Term, _count

# rlpr/model/forward.py: the output layer runs on LOGIT_CHUNK rows at a time, its fp32 softmax on
# SOFTMAX_ROWS rows (checkpointed under autograd)
LOGIT_CHUNK = 512
SOFTMAX_ROWS = 64


@dataclass(frozen=True)
class MicroBatch:
    """The shape of one update micro-batch: `rows` sequences of `length` tokens each run through the
    decoder in this forward; with a shared prefix the prompt (`prefix` tokens, one row) ran once
    before and each row is a response continuing it (attending to prefix + length key positions);
    `targets`: tokens per row whose log-prob is computed (the response's)."""

    rows: int
    prefix: int
    length: int
    targets: int

    @property
    def query_tokens(self) -> int:
        return self.rows * self.length

    @property
    def key_positions(self) -> int:
        return self.rows * (self.prefix + self.length)

    @property
    def target_tokens(self) -> int:
        return self.rows * self.targets

    def describe(self) -> str:
        if self.prefix:
            return f"{self.rows} x ({self.prefix} + {self.length}) tok"
        return f"{self.rows} x {self.length} tok"


def micro_batch(s: Setup) -> MicroBatch:
    """Rows of one update micro-batch: trainer.micro_batch_tokens // (prompt + response) when set
    (every row full length: the worst case; a longer sequence goes alone), else
    trainer.micro_batch_sequences; at most the process's share of a mini-batch. With the shared
    prefix (trainer.share_prompt_prefix, not with checkpointing) a micro-batch holds one prompt's
    responses, so at most responses_per_prompt rows, and its forward runs the responses only."""
    length = s.prompt_tokens + s.response_tokens
    rows = max(1, s.micro_tokens // length) if s.micro_tokens else s.micro_rows
    rows = max(1, min(rows, s.mini_rows))
    if s.share_prefix and not s.gradient_checkpointing:
        return MicroBatch(min(rows, s.responses_per_prompt), s.prompt_tokens, s.response_tokens, s.response_tokens)
    return MicroBatch(rows, 0, length, s.response_tokens)


def _layer_saved_per_token(arch: Architecture, s: Setup) -> float:
    """Bytes one decoder layer saves for backward per query token (HF Llama/Qwen2 decoder layer,
    SDPA attention; counted with torch's saved-tensor hooks, tests/test_memory_plan.py):

    - two RMSNorms in fp32: input, rsqrt, normalised input: 2 x (2H + 1) x 4 B;
    - the projections' inputs: fp32, the normed hidden once for q/k/v and once for gate/up (2H x 4 B);
      under bf16 autocast one bf16 cast per projection (5H x 2 B);
    - attention (keys and values counted per key position, `_layer_saved_per_kv`): the query and the
      output (2 x q_dim, in the attention's dtype), the log-sum-exp (heads x 4 B); under rlpr's fp32
      attention on CPU autocast, also the output's bf16 cast for o_proj (q_dim x 2 B);
    - the MLP: gate, act(gate), up and their product, 4 x intermediate x (4 B, or 2 B under bf16)."""
    h, i = arch.hidden, arch.intermediate
    m = BF16 if s.bf16 else FP32
    attn = FP32 if (not s.bf16 or (s.device == "cpu" and s.fp32_attention)) else BF16
    norms = 2 * (2 * h + 1) * FP32
    inputs = 5 * h * BF16 if s.bf16 else 2 * h * FP32
    attention = 2 * arch.q_dim * attn + arch.heads * FP32
    if s.bf16 and attn == FP32:
        attention += arch.q_dim * BF16
    mlp = 4 * i * m
    return norms + inputs + attention + mlp


def _layer_saved_per_kv(arch: Architecture, s: Setup) -> float:
    """Keys and values saved by SDPA per key position and layer: with a padding mask (RL batches
    always have one) transformers repeats the kv heads to the query heads (`repeat_kv`), so
    2 x q_dim x the attention's bytes."""
    attn = FP32 if (not s.bf16 or (s.device == "cpu" and s.fp32_attention)) else BF16
    return 2 * arch.q_dim * attn


def _mask_bytes(s: Setup) -> int:
    """The 4-D attention mask's element: fp32 on CPU (SDPA's CPU path), bool on CUDA."""
    return FP32 if s.device == "cpu" else 1


def _full_layer_bytes(arch: Architecture, s: Setup, query: int, kv_positions: int) -> float:
    return query * _layer_saved_per_token(arch, s) + kv_positions * _layer_saved_per_kv(arch, s)


def weight_casts(arch: Architecture, s: Setup) -> Term | None:
    """Under bf16 autocast the bf16 copies of weights that the backward needs. Autocast caches the cast
    of a trainable weight for the whole update (ddp, deepspeed): 2 B x T; fsdp turns that cache off
    (rlpr/parallel/sharding.py) so every layer's casts are saved with its activations (all layers, or
    one under checkpointing). With LoRA under ddp the frozen weights are held in bf16 for the update
    (trainer.bf16_frozen_weights, 2 B x the frozen Linear weights); under fsdp/deepspeed they are cast
    per forward and saved like fsdp's."""
    if not s.bf16:
        return None
    t = arch.trainable(s.lora)
    layers_kept = 1 if s.gradient_checkpointing else arch.layers
    per_forward = BF16 * (layers_kept * arch.layer_params + (0 if arch.tied else arch.root_params))
    if s.strategy == "fsdp" and s.processes > 1:
        return Term("bf16 weight casts (fsdp: per forward)", per_forward, ("update",),
                    f"2 B x {layers_kept} layers' weights")
    if s.lora:
        if s.bf16_frozen_weights and not s.lockstep:
            return Term("bf16 copies of frozen weights", BF16 * arch.frozen_linear_params, ("update",),
                        f"2 B x {_count(arch.frozen_linear_params)}")
        return Term("bf16 weight casts (per forward)", per_forward, ("update",), f"2 B x {layers_kept} layers' weights")
    return Term("bf16 weight casts (autocast cache)", BF16 * t, ("update",), f"2 B x {_count(t)}")


def activations(arch: Architecture, s: Setup, checkpointing: bool | None = None) -> list[Term]:
    """What one update micro-batch keeps for its backward, and the backward's own working set.

    Without gradient checkpointing every layer's saved tensors stay until the backward reaches it:
    layers x (query tokens x `_layer_saved_per_token` + key positions x `_layer_saved_per_kv`). With
    it (HF's non-reentrant checkpoint per decoder layer), each layer keeps only its fp32 input,
    query tokens x hidden x 4 B, and one layer's saved tensors exist at a time, while it is
    recomputed. With the shared prefix the prompt's own activations (prefix tokens, one row) stay
    until the last of its micro-batches is done. Outside the layers: the final norm, the output
    layer's input, the 4-D attention mask (rows x query x key positions), and without checkpointing
    the logits of every response token (targets x vocab x 4 B, 2 B under bf16), which rlpr's forward
    keeps for its checkpointed fp32 softmax; under checkpointing the output layer is recomputed per
    64 rows in the backward and no logits are kept (rlpr/model/forward.py, recompute_head). The
    backward's working set: the gradient of one 512-row chunk of logits (two copies in the logits'
    dtype: its 64-row pieces' gradients and their concatenation; under checkpointing one 64-row
    piece's recomputed logits), one 64-row piece's recomputed fp32 softmax with its gradients (about
    six [64, vocab] fp32 tensors) and, in the layer being differentiated, the gradients of its
    hidden and MLP tensors (query tokens x (2 x hidden + 3 x intermediate)); under full fine-tuning
    of a model with tied embeddings, the second gradient of the embedding (vocab x hidden x 4 B)."""
    s = replace(s, gradient_checkpointing=s.gradient_checkpointing if checkpointing is None else checkpointing)
    mb = micro_batch(s)
    h, v = arch.hidden, arch.vocab
    m = BF16 if s.bf16 else FP32
    layer = _full_layer_bytes(arch, s, mb.query_tokens, mb.key_positions)
    shape = mb.describe()
    out = []
    if s.gradient_checkpointing:
        kept = arch.layers * mb.query_tokens * h * FP32
        out.append(Term("activations: layer inputs (checkpointed)", kept, ("update",),
                        f"{arch.layers} layers x {shape} x {h} x 4 B"))
        out.append(Term("activations: one layer recomputed", layer, ("update",), f"1 layer, {shape}"))
    else:
        out.append(Term("activations: all layers", arch.layers * layer, ("update",), f"{arch.layers} layers x {shape}"))
        if mb.prefix:
            prompt = arch.layers * _full_layer_bytes(arch, s, mb.prefix, mb.prefix)
            out.append(Term("activations: shared prompt", prompt, ("update",),
                            f"{arch.layers} layers x {mb.prefix} tok"))
    targets = mb.target_tokens
    outside = mb.query_tokens * (2 * h + 1) * FP32 + targets * h * m
    mask = mb.rows * mb.length * (mb.prefix + mb.length) * _mask_bytes(s)
    if s.gradient_checkpointing:  # forward.project_logprobs(recompute_head): the output layer is recomputed too
        out.append(Term("logits kept for backward", 0.0, ("update",), "none: recomputed per 64 rows"))
    else:
        out.append(Term("logits kept for backward", targets * v * m, ("update",), f"{targets} tok x {v} x {m} B"))
    out.append(Term("final norm, head input, attention mask", outside + mask, ("update",),
                    f"{mb.query_tokens} tok x (2H+1) x 4 B + mask"))
    rows = min(SOFTMAX_ROWS, targets)
    softmax = (6 + (m == BF16)) * rows * v * FP32  # under bf16 also the piece's fp32 copy (logits.float())
    logits = rows * v * m if s.gradient_checkpointing else 2 * min(LOGIT_CHUNK, targets) * v * m
    backward = logits + softmax + mb.query_tokens * (2 * h + 3 * arch.intermediate) * m
    if arch.tied and not s.lora:  # the shared embedding gets two gradients (lookup and output layer), summed
        backward += FP32 * arch.vocab * h
    out.append(Term("backward working set", backward, ("update",),
                    (f"{rows} x {v} x {m} B" if s.gradient_checkpointing
                     else f"2 x {min(LOGIT_CHUNK, targets)} x {v} x {m} B")
                    + f" + {6 + (m == BF16)} x {rows} x {v} x 4 B + one layer's grads"))
    return out


def _no_grad_bytes(arch: Architecture, tokens: int, length: int, rows: int, dtype_bytes: int, device: str,
                   targets: int = 0) -> float:
    """A forward without backward holds one layer's temporaries at a time: the residual stream in and
    out (2 x tokens x H x 4 B), q/k/v (kv heads repeated) and the output (4 x q_dim), the MLP's gate or
    act, up and their product (3 x intermediate), in dtype bytes; the attention mask (rows x length^2);
    the final hidden states of the targets; and the output layer's 512-row chunk of logits (fp32) with
    the softmax pieces of 64 rows (two fp32 copies)."""
    layer = tokens * (2 * arch.hidden * FP32 + (4 * arch.q_dim + 3 * arch.intermediate) * dtype_bytes)
    mask = rows * length * length * (FP32 if device == "cpu" else 1)
    head = min(LOGIT_CHUNK, max(targets, 1)) * arch.vocab * FP32 + 2 * SOFTMAX_ROWS * arch.vocab * FP32
    return layer + mask + head + targets * arch.hidden * FP32


def scoring(arch: Architecture, s: Setup) -> list[Term]:
    """The no-grad phase: reward scoring (score B and A) in padded batches of reward.max_batch_tokens
    (trainer.micro_batch_tokens when smaller; at most the sequences of one rollout round), and the
    old/reference log-probs in the update's micro-batches; the larger working set (`_no_grad_bytes`). Under fsdp every process gathers the full
    fp32 weights for the whole phase (`FullySharded.gathered`): 4 B x P beside its shard."""
    length = s.prompt_tokens + s.response_tokens
    rows = max(1, min(s.scoring_tokens // length, s.round_rows))
    tokens = rows * length
    reward = _no_grad_bytes(arch, tokens, length, rows, FP32, s.device, targets=LOGIT_CHUNK)
    mb = micro_batch(s)
    m = BF16 if s.bf16 else FP32
    logp = _no_grad_bytes(arch, mb.query_tokens, mb.prefix + mb.length, mb.rows, m, s.device,
                          targets=mb.target_tokens)
    out = [Term("scoring working set", max(reward, logp), ("scoring",),
                f"max(reward: {rows} x {length} tok, log-probs: a micro-batch)")]
    if s.strategy == "fsdp" and s.processes > 1:
        full = FP32 * (arch.params + (arch.lora_params if s.lora else 0))
        out.append(Term("fsdp: full weights gathered (no-grad phases)", full, ("scoring",),
                        f"4 B x {_count(full / 4)}"))
    return out


def fsdp_update_gathers(arch: Architecture, s: Setup) -> list[Term]:
    """fsdp's update: the root group (embeddings, output layer, final norm) stays gathered for the
    whole update and the decoder layers are gathered per forward/backward (the current one and one
    prefetched): 4 B x (root + 2 layers); their unsharded gradients exist until reduce-scattered
    (the root's until the end of the backward): 4 B x their trainable part."""
    if not (s.strategy == "fsdp" and s.processes > 1):
        return []
    gathered = FP32 * (arch.root_params + 2 * arch.layer_params)
    if s.lora:
        per_layer = arch.lora_params / arch.layers
        grads = FP32 * 2 * per_layer
    else:
        grads = FP32 * (arch.root_params + 2 * arch.layer_params)
    return [Term("fsdp: root + 2 layers gathered (update)", gathered, ("update",),
                 f"4 B x ({_count(arch.root_params)} + 2 x {_count(arch.layer_params)})"),
            Term("fsdp: unsharded gradients (update)", grads, ("update",), "4 B x their trainable part")]
