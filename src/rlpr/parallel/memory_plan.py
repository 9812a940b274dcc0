"""Memory per process of an rlpr training run, computed before the run (`rlpr plan`).

Pure arithmetic: no torch, no files. An `Architecture` (the model's shapes and exact parameter
counts, read from its config.json by `rlpr.model.architecture`) and a `Setup` (the settings of a
`Config` that move memory, resolved for a number of processes and a device) give a `Plan`: a list
of `Term`s, each the bytes one process holds for one reason, with the phases of a training step in
which it is held. A step passes through five phases, one after the other:

- ``sync``: the policy's weights (LoRA merged) are copied into the rollout engine;
- ``rollout``: responses are sampled (also the held-out evaluation's generation);
- ``scoring``: forwards without backward: score B and A, old and reference log-probs;
- ``update``: forwards and backwards over micro-batches (the activations);
- ``step``: the AdamW step (the activations are gone, the gradients and the step's temporaries not).

The peak of a process is the largest phase total, not the sum of every term (the KV cache is gone
before the update's activations exist). Each function below says why its term exists in rlpr's
implementation (docs/distributed.md) and its formula; B is bytes, P the model's parameters, T the
trainable ones (P under full fine-tuning, the LoRA adapter's otherwise), N the processes.

What is not modelled: allocator caching and fragmentation (PyTorch's CUDA caching allocator, glibc
arenas on CPU), kernels' workspaces, NCCL's buffers (one estimated `cuda runtime` line on GPUs) and
Python objects (one measured `runtime` line on CPU). docs/memory-plan.md holds the comparison with
measured peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

GiB = 1024 ** 3
FP32, BF16 = 4, 2
PHASES = ("sync", "rollout", "scoring", "update", "step")

# rlpr/model/forward.py: the output layer runs on LOGIT_CHUNK rows at a time, its fp32 softmax on
# SOFTMAX_ROWS rows (checkpointed under autograd)
LOGIT_CHUNK = 512
SOFTMAX_ROWS = 64
# DeepSpeed ZeRO-1/2's contiguous gradient bucket (its default reduce_bucket_size, in elements),
# allocated whole with torch.empty on a GPU
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000
# CPU: the process before any model (Python, torch, transformers, peft, the tokenizer, tensorboard,
# the grader): measured here as RSS after importing rlpr's trainer and loading the embedded
# tokenizer (benchmarks/memory_plan.py measures it again on each run of the benchmark)
CPU_RUNTIME_BYTES = int(0.45 * GiB)
# GPU: the CUDA context, cuBLAS/cuDNN workspaces and NCCL's buffers of one process: an estimate
# (no GPU was available to measure it), added on GPUs only
CUDA_RUNTIME_BYTES = int(1.0 * GiB)
# a plan FITS below this fraction of the device memory; between it and 1 it is TIGHT (the caching
# allocator's fragmentation and what is not modelled here decide). Measured on an H100 (torch 2.11,
# the default allocator; benchmarks/results/gpu_check.md): the allocated peaks came to 0.82-1.01 of
# the plan's phases, but the reserved memory plus the CUDA context to 1.14-1.17 of the plan's peak,
# so a plan at 0.85 of the device still leaves the allocator room (0.9 did not)
FIT_MARGIN = 0.85


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer's shapes (config.json) and exact parameter counts (the model
    built on the meta device, with its LoRA adapter when model.lora)."""

    name: str
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    max_position: int
    params: int  # every parameter of the causal LM, a tied output layer once (LoRA's excluded)
    layer_params: int  # one decoder layer (LoRA's excluded)
    lora_params: int = 0  # the LoRA adapter's trainable parameters (0 without model.lora)
    lora_base_params: int = 0  # the base weights under the adapters: merged at every sync
    frozen_linear_params: int = 0  # LoRA: frozen Linear weights but the input embedding (bf16 copies)
    largest_param: int = 0  # the largest trainable tensor (CPU AdamW's per-tensor temporaries)

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def root_params(self) -> int:
        """What is not in a decoder layer: embeddings, the output layer if untied, the final norm
        (FSDP's root group in rlpr/parallel/sharding.py)."""
        return self.params - self.layers * self.layer_params

    def trainable(self, lora: bool) -> int:
        return self.lora_params if lora else self.params

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.layers * self.kv_dim * dtype_bytes


@dataclass(frozen=True)
class Setup:
    """The settings that move memory, resolved (`setup_from_config`)."""

    processes: int = 1
    device: str = "cuda"  # cuda | cpu
    device_bytes: float = 80 * GiB  # memory per process (a GPU's, or the CPU's share)
    strategy: str = "ddp"  # effective: ddp whenever processes == 1 (rlpr's make_strategy)
    zero_stage: int = 2
    cpu_offload: bool = False
    lora: bool = True
    gradient_checkpointing: bool = False
    bf16: bool = False  # the update's autocast (trainer.mixed_precision resolved)
    fp32_attention: bool = True  # trainer.fp32_attention (applies under bf16 on CPU only)
    bf16_frozen_weights: bool = True
    engine: str = "hf"  # hf | vllm
    rollout_bytes: int = BF16  # model.rollout_dtype resolved
    prompt_tokens: int = 1024  # data.max_prompt_tokens (the longest prompt kept)
    response_tokens: int = 256  # rollout.max_new_tokens
    responses_per_prompt: int = 8
    rollout_rows: int = 32  # sequences decoded together per process (training)
    round_rows: int = 64  # sequences one process rolls out and scores per rollout round
    eval_rows: int = 0  # sequences decoded together per process (held-out evaluation; 0: none)
    eval_questions: int = 0  # held-out questions per process (their greedy responses are scored)
    keep_caches: bool = False  # reward.score_b_from_cache resolved on: the rollout's caches kept for score B
    eval_response_tokens: int = 256
    micro_rows: int = 8  # trainer.micro_batch_sequences
    mini_rows: int = 16  # sequences of one mini-batch on one process (bounds a micro-batch)
    micro_tokens: int = 0  # trainer.micro_batch_tokens (0: by micro_rows)
    share_prefix: bool = True  # the prompt runs once per micro-batch (no checkpointing)
    scoring_tokens: int = 8192  # padded tokens per no-grad scoring forward
    reference_copy: bool = False  # full fine-tuning with algorithm.kl_coef > 0 or reward.scorer=initial
    lagged_copy: bool = False  # reward.scorer / score_a = ema
    vllm_gpu_fraction: float = 0.3
    vllm_kv_cache_gb: float = 2.0
    vllm_sleep: bool = True
    runtime_bytes: float | None = None  # CPU baseline (None: CPU_RUNTIME_BYTES)

    @property
    def sharded(self) -> bool:
        return self.processes > 1 and self.strategy in ("fsdp", "deepspeed")

    @property
    def lockstep(self) -> bool:
        """fsdp and deepspeed run every process's micro-batches in step, one per forward/backward."""
        return self.processes > 1 and self.strategy in ("fsdp", "deepspeed")

    @property
    def offloaded(self) -> bool:
        """trainer.cpu_offload takes effect (fsdp or deepspeed over several processes)."""
        return self.cpu_offload and self.sharded

    @property
    def label(self) -> str:
        if self.processes == 1:
            return "ddp (1 process)"
        name = f"deepspeed ZeRO-{self.zero_stage}" if self.strategy == "deepspeed" else self.strategy
        return name + (" + cpu_offload" if self.offloaded else "")


@dataclass(frozen=True)
class Term:
    """Bytes one process holds for one reason, in the phases listed; `host` is what it keeps in CPU
    memory instead (offloaded states, vLLM asleep) on a GPU machine."""

    name: str
    bytes: float
    phases: tuple[str, ...]
    formula: str
    host: float = 0.0


@dataclass
class Plan:
    arch: Architecture
    setup: Setup
    terms: list[Term] = field(default_factory=list)

    def total(self, phase: str) -> float:
        return sum(t.bytes for t in self.terms if phase in t.phases)

    @property
    def peak_phase(self) -> str:
        return max(PHASES, key=self.total)

    @property
    def peak(self) -> float:
        return self.total(self.peak_phase)

    @property
    def host(self) -> float:
        return sum(t.host for t in self.terms)

    def verdict(self) -> str:
        return verdict(self.peak, self.setup.device_bytes)


ALL = PHASES


def gib(n: float) -> str:
    return f"{n / GiB:.2f} GiB"


def _count(n: float) -> str:
    """A parameter or token count, short: 7.62e9, 135M, 4096."""
    if n >= 1e9:
        return f"{n / 1e9:.2f}e9"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    return f"{int(n)}"


def verdict(peak: float, device_bytes: float) -> str:
    """FITS below FIT_MARGIN of the device, TIGHT up to all of it, DOES NOT FIT above."""
    if peak <= FIT_MARGIN * device_bytes:
        return "FITS"
    return "TIGHT" if peak <= device_bytes else "DOES NOT FIT"


# -- states that live through the whole step ----------------------------------------------------

def weights(arch: Architecture, s: Setup) -> Term:
    """The policy's fp32 master weights, 4 B x P: ddp and deepspeed keep all of them on every process
    (DeepSpeed ZeRO-1/2 shards states, not weights); fsdp keeps a 1/N shard (4 B x P / N), which
    trainer.cpu_offload moves to CPU memory (FSDP2's CPUOffloadPolicy). LoRA's base weights are
    frozen fp32 and sharded the same way; the adapter is counted with them."""
    total = FP32 * (arch.params + (arch.lora_params if s.lora else 0))
    if s.strategy == "fsdp" and s.processes > 1:
        shard = total / s.processes
        if s.offloaded:
            return Term("weights (fp32, fsdp shard)", 0.0, ALL, f"4 B x {_count(total / 4)} / {s.processes} on the CPU",
                        host=shard)
        return Term("weights (fp32, fsdp shard)", shard, ALL, f"4 B x {_count(total / 4)} params / {s.processes}")
    return Term("weights (fp32)", total, ALL, f"4 B x {_count(total / 4)} params")


def optimizer_states(arch: Architecture, s: Setup) -> list[Term]:
    """AdamW's two fp32 moments, 8 B x T, kept between steps: whole under ddp, 1/N under fsdp and
    DeepSpeed ZeRO-1/2; DeepSpeed also keeps an fp32 master copy of its partition (4 B x T / N,
    `single_partition_of_fp32_groups`). trainer.cpu_offload keeps them in CPU memory (0 on the GPU;
    on a CPU device they stay in the same memory)."""
    t = arch.trainable(s.lora)
    n = s.processes if s.sharded else 1
    states = 2 * FP32 * t / n
    share = f" / {n}" if n > 1 else ""
    out = []
    if s.offloaded and s.device == "cuda":
        out.append(Term("optimizer states (AdamW, 2 x fp32)", 0.0, ALL, f"8 B x {_count(t)}{share} on the CPU",
                        host=states))
    else:
        out.append(Term("optimizer states (AdamW, 2 x fp32)", states, ALL, f"8 B x {_count(t)} trainable{share}"))
    if s.strategy == "deepspeed" and s.processes > 1:
        master = FP32 * t / n
        on_gpu = not (s.offloaded and s.device == "cuda")
        out.append(Term("DeepSpeed fp32 master partition", master if on_gpu else 0.0, ALL,
                        f"4 B x {_count(t)} / {n}" + ("" if on_gpu else " on the CPU"), host=0.0 if on_gpu else master))
    return out


def gradients(arch: Architecture, s: Setup) -> list[Term]:
    """fp32 gradients of the trainable parameters, 4 B x T, from the first backward of an update to
    its optimizer step (rlpr zeroes them with set_to_none). ddp and ZeRO-1 hold them whole (ZeRO-1
    adds its reduced 1/N partition); fsdp and ZeRO-2 keep a 1/N shard (reduce-scattered in every
    backward). ZeRO-1/2 allocate a contiguous reduction bucket of 5e8 elements (fp32: 1.86 GiB) on
    a GPU; on a CPU only the pages written count, at most 4 B x T. With trainer.cpu_offload the
    shards move to CPU memory (ZeRO-1 still accumulates whole gradients on the GPU)."""
    t = arch.trainable(s.lora)
    n = s.processes
    upd = ("update", "step")
    if not s.sharded:
        return [Term("gradients (fp32)", FP32 * t, upd, f"4 B x {_count(t)} trainable")]
    out = []
    if s.strategy == "fsdp":
        shard = FP32 * t / n
        if s.offloaded and s.device == "cuda":
            out.append(Term("gradients (fp32, fsdp shard)", 0.0, upd, f"4 B x {_count(t)} / {n} on the CPU",
                            host=shard))
        else:
            out.append(Term("gradients (fp32, fsdp shard)", shard, upd, f"4 B x {_count(t)} / {n}"))
        return out
    offload_gpu = s.offloaded and s.device == "cuda"
    if s.zero_stage == 1:
        out.append(Term("gradients (fp32, ZeRO-1: whole)", FP32 * t, upd, f"4 B x {_count(t)} trainable"))
        part = FP32 * t / n
        out.append(Term("gradients (ZeRO-1 reduced partition)", 0.0 if offload_gpu else part, upd,
                        f"4 B x {_count(t)} / {n}", host=part if offload_gpu else 0.0))
    else:
        part = FP32 * t / n
        out.append(Term("gradients (fp32, ZeRO-2 partition)", 0.0 if offload_gpu else part, upd,
                        f"4 B x {_count(t)} / {n}" + (" on the CPU" if offload_gpu else ""),
                        host=part if offload_gpu else 0.0))
    bucket = FP32 * (DEEPSPEED_BUCKET_ELEMENTS if s.device == "cuda" else min(DEEPSPEED_BUCKET_ELEMENTS, t))
    out.append(Term("DeepSpeed gradient bucket", bucket, upd,
                    "4 B x 5e8 (reduce_bucket_size)" if s.device == "cuda" else f"4 B x min(5e8, {_count(t)})"))
    return out


def optimizer_step(arch: Architecture, s: Setup) -> Term:
    """The AdamW step's temporaries: on a GPU torch's foreach implementation builds the square roots
    of all second moments at once (4 B x T, over the process's shard); on a CPU it steps tensor by
    tensor (two temporaries of the largest trainable tensor). With trainer.cpu_offload the step runs
    in CPU memory."""
    t = arch.trainable(s.lora)
    n = s.processes if s.sharded else 1
    if s.device == "cpu":
        return Term("AdamW step temporaries", 2 * FP32 * arch.largest_param, ("step",),
                    f"2 x 4 B x {_count(arch.largest_param)} (largest tensor)")
    if s.offloaded:
        return Term("AdamW step temporaries", 0.0, ("step",), "on the CPU", host=FP32 * t / n)
    return Term("AdamW step temporaries", FP32 * t / n, ("step",), f"4 B x {_count(t)}" + (f" / {n}" if n > 1 else ""))


def reference_copy(arch: Architecture, s: Setup) -> Term | None:
    """Full fine-tuning with algorithm.kl_coef > 0 or reward.scorer=initial keeps a frozen fp32 copy of
    the initial policy, whole on every process (rlpr/train/setup.py reference_copy; with LoRA the
    reference is the adapter-off base and costs nothing): 4 B x P."""
    if not s.reference_copy:
        return None
    return Term("reference copy (fp32)", FP32 * arch.params, ALL, f"4 B x {_count(arch.params)}")


def lagged_copy(arch: Architecture, s: Setup) -> Term | None:
    """reward.scorer=ema or score_a=ema: an EMA of the trainable weights (rlpr/reward/lagged.py), 4 B x T."""
    if not s.lagged_copy:
        return None
    t = arch.trainable(s.lora)
    return Term("EMA-lagged weights (fp32)", FP32 * t, ALL, f"4 B x {_count(t)}")


def runtime(s: Setup) -> Term | None:
    """CPU only: the process before any model (Python, torch, transformers, the tokenizer), measured;
    on GPUs an estimate of the CUDA context, library workspaces and NCCL buffers."""
    if s.device == "cpu":
        b = CPU_RUNTIME_BYTES if s.runtime_bytes is None else s.runtime_bytes
        return Term("runtime (CPU process baseline)", b, ALL, "measured: imports + tokenizer")
    b = CUDA_RUNTIME_BYTES if s.runtime_bytes is None else s.runtime_bytes
    return Term("cuda runtime (context, NCCL; estimate)", b, ALL, "estimate, not measured")


# -- the rollout engine ---------------------------------------------------------------------------

def rollout_copy(arch: Architecture, s: Setup) -> Term | None:
    """The hf engine samples from its own copy of the policy (rlpr/rollout/hf.py), whole on every
    process in model.rollout_dtype, for the whole run: P x dtype bytes (LoRA merged into it)."""
    if s.engine != "hf":
        return None
    return Term("rollout copy (hf engine)", s.rollout_bytes * arch.params, ALL,
                f"{s.rollout_bytes} B x {_count(arch.params)}")


def rollout_kv_rows(s: Setup) -> list[tuple[int, int]]:
    """(rows, positions per row) of the decode batches: training rollouts and the evaluation's."""
    out = [(s.rollout_rows, s.prompt_tokens + s.response_tokens)]
    if s.eval_rows:
        out.append((s.eval_rows, s.prompt_tokens + s.eval_response_tokens))
    return out


def kv_cache(arch: Architecture, s: Setup) -> Term | None:
    """The hf engine's KV cache, preallocated for a decode batch (rlpr/rollout/decode.py): rows x
    (prompt + response tokens) x 2 x layers x kv_heads x head_dim x dtype bytes, plus the shared
    prefill's cache of the distinct prompts (1 / responses_per_prompt of it) while it is copied to
    their rows. The larger of the training and evaluation batches."""
    if s.engine != "hf":
        return None
    per = arch.kv_bytes_per_token(s.rollout_bytes)
    rows, positions = max(rollout_kv_rows(s), key=lambda rp: rp[0] * rp[1])
    b = rows * positions * per * (1 + 1 / max(s.responses_per_prompt, 1))
    return Term("KV cache (hf rollout)", b, ("rollout",),
                f"{rows} rows x {positions} tok x {per / 1024:.0f} KiB/tok x (1 + 1/{s.responses_per_prompt})")


def kept_caches(arch: Architecture, s: Setup) -> list[Term]:
    """reward.score_b_from_cache: the hf engine copies each finished response's keys and values out of
    the decode batch (rlpr/rollout/kept_cache.py) and keeps them until score B has continued them: the
    sequences of one rollout round (or the evaluation's greedy responses) x (prompt + response
    tokens) x 2 x layers x kv_heads x head_dim x the rollout dtype's bytes, in the rollout and scoring
    phases. Score B pads each batch's pasts into one cache in the scorer's dtype: reward.max_batch_tokens
    x the same in fp32, while it scores. (At run time rows beyond half the memory free when a rollout
    starts keep nothing and are recomputed.)"""
    if not s.keep_caches or s.engine != "hf":
        return []
    per = arch.kv_bytes_per_token(s.rollout_bytes)
    train = s.round_rows * (s.prompt_tokens + s.response_tokens)
    held_out = s.eval_questions * (s.prompt_tokens + s.eval_response_tokens)
    rows, tokens = (s.round_rows, s.prompt_tokens + s.response_tokens) if train >= held_out else \
        (s.eval_questions, s.prompt_tokens + s.eval_response_tokens)
    past = arch.kv_bytes_per_token(FP32)
    return [Term("kept KV caches (score B from the cache)", rows * tokens * per, ("rollout", "scoring"),
                 f"{rows} rows x {tokens} tok x {per / 1024:.0f} KiB/tok"),
            Term("score B's padded past (fp32)", s.scoring_tokens * past, ("scoring",),
                 f"{s.scoring_tokens} tok x {past / 1024:.0f} KiB/tok")]


def decode_working_set(arch: Architecture, s: Setup) -> Term | None:
    """Decoding's temporaries: the prefill of the distinct prompts (a no-grad forward, see
    `no_grad_working_set`) or, per new token, its logits and the sampler's fp32 copies (softmax,
    blocked CDF): about 4 x rows x vocab x 4 B. The larger of the two."""
    if s.engine != "hf":
        return None
    rows = max(r for r, _ in rollout_kv_rows(s))
    sampler = 4 * rows * arch.vocab * FP32
    unique = max(1, math.ceil(s.rollout_rows / max(s.responses_per_prompt, 1)))
    prefill = _no_grad_bytes(arch, unique * s.prompt_tokens, s.prompt_tokens, 1, s.rollout_bytes, s.device)
    b = max(sampler, prefill)
    return Term("decode working set", b, ("rollout",),
                f"max(4 x {rows} rows x {arch.vocab} x 4 B, prefill of {unique} x {s.prompt_tokens} tok)")


def vllm_engine(arch: Architecture, s: Setup) -> list[Term]:
    """rollout.engine=vllm, colocated in the process. On a GPU vLLM takes
    rollout.vllm_gpu_memory_utilization x the GPU's memory (its weights, P x dtype bytes, then the KV
    cache in what is left after its own activations); with rollout.vllm_sleep it frees the KV cache
    and moves its weights to CPU memory once the rewards are computed, so the update does not see it.
    On a CPU: its weights plus rollout.vllm_kv_cache_gb (an integer number of GiB, at least 1), held
    throughout (sleep does nothing there)."""
    if s.engine != "vllm":
        return []
    w = s.rollout_bytes * arch.params
    if s.device == "cpu":
        kv = max(1, round(s.vllm_kv_cache_gb)) * GiB
        return [Term("vLLM weights", w, ALL, f"{s.rollout_bytes} B x {_count(arch.params)}"),
                Term("vLLM KV cache", kv, ALL, f"rollout.vllm_kv_cache_gb -> {kv / GiB:.0f} GiB")]
    share = s.vllm_gpu_fraction * s.device_bytes
    awake = ("sync", "rollout", "scoring") if s.vllm_sleep else ALL
    kv = max(0.0, share - w)
    tokens = kv / arch.kv_bytes_per_token(s.rollout_bytes)
    return [Term("vLLM weights", w, awake, f"{s.rollout_bytes} B x {_count(arch.params)}",
                 host=w if s.vllm_sleep else 0),
            Term("vLLM KV cache + activations", kv, awake,
                 f"{s.vllm_gpu_fraction:g} x {s.device_bytes / GiB:.0f} GiB - weights (~{_count(tokens)} tokens)")]


def sync_transient(arch: Architecture, s: Setup) -> Term:
    """The weight sync into the rollout engine (`merged_weights`): with LoRA every adapted weight is
    merged into a new fp32 tensor (4 B x the adapted base weights; under fsdp one decoder layer's at a
    time); fsdp also gathers the root group (embeddings, output layer) and one layer. Each tensor is
    then cast to the engine's dtype (one tensor's worth)."""
    lora = FP32 * arch.lora_base_params if s.lora else 0.0
    if s.strategy == "fsdp" and s.processes > 1:
        gathered = FP32 * (arch.root_params + arch.layer_params)
        merged = lora / arch.layers
        return Term("sync: gathered root + 1 layer" + (", merged LoRA" if s.lora else ""), gathered + merged,
                    ("sync",), f"4 B x ({_count(arch.root_params)} + {_count(arch.layer_params)})")
    return Term("sync: merged LoRA weights" if s.lora else "sync: cast of one tensor",
                lora + s.rollout_bytes * arch.vocab * arch.hidden, ("sync",),
                (f"4 B x {_count(arch.lora_base_params)} adapted" if s.lora
                 else f"{s.rollout_bytes} B x vocab x hidden"))


# -- activations ----------------------------------------------------------------------------------

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


# -- the plan -------------------------------------------------------------------------------------

def plan(arch: Architecture, s: Setup) -> Plan:
    """Every term of one process's memory for this architecture and setup."""
    terms: list[Term | None] = [runtime(s), weights(arch, s), *optimizer_states(arch, s), reference_copy(arch, s),
                                lagged_copy(arch, s), rollout_copy(arch, s), *vllm_engine(arch, s),
                                sync_transient(arch, s), kv_cache(arch, s), *kept_caches(arch, s),
                                decode_working_set(arch, s),
                                *scoring(arch, s), *gradients(arch, s), optimizer_step(arch, s),
                                *fsdp_update_gathers(arch, s), weight_casts(arch, s), *activations(arch, s)]
    return Plan(arch, s, [t for t in terms if t is not None])


# the alternatives `rlpr plan` compares, least communication first (the order of preference)
STRATEGY_CHOICES: tuple[tuple[str, int, bool], ...] = (
    ("ddp", 2, False), ("deepspeed", 1, False), ("deepspeed", 2, False), ("fsdp", 2, False),
    ("deepspeed", 2, True), ("fsdp", 2, True),
)


def alternatives(arch: Architecture, s: Setup) -> list[tuple[Setup, Plan, Plan]]:
    """(setup, plan without checkpointing, plan with it) for each strategy of STRATEGY_CHOICES; one
    row (ddp) with a single process, where every strategy runs as ddp."""
    choices = STRATEGY_CHOICES if s.processes > 1 else (("ddp", 2, False),)
    out = []
    for strategy, stage, offload in choices:
        alt = replace(s, strategy=strategy, zero_stage=stage, cpu_offload=offload)
        off = replace(alt, gradient_checkpointing=False, share_prefix=s.share_prefix or s.gradient_checkpointing)
        on = replace(alt, gradient_checkpointing=True)
        out.append((alt, plan(arch, off), plan(arch, on)))
    return out


def recommend(rows: list[tuple[Setup, Plan, Plan]]) -> tuple[Setup, bool, Plan] | None:
    """The first setting that FITS, in STRATEGY_CHOICES order, without checkpointing before with it
    (each costs time: sharding in communication and lock-step micro-batches, checkpointing a second
    forward); else the first that is TIGHT; None when nothing fits."""
    for wanted in ("FITS", "TIGHT"):
        for setup, off, on in rows:
            for ckpt, p in ((False, off), (True, on)):
                if p.verdict() == wanted:
                    return setup, ckpt, p
    return None


def _halvings(value: int, floor: int) -> list[int]:
    out = [value]
    while out[-1] // 2 >= floor:
        out.append(out[-1] // 2)
    return out


def smaller_batches(arch: Architecture, s: Setup) -> tuple[dict, tuple[Setup, bool, Plan]] | None:
    """When no strategy fits as configured: the largest rollout batch (rollout.batch_sequences,
    halved) and then the largest update token budget (trainer.micro_batch_tokens, halved, down to one
    full-length sequence) with which one does; ({key: value}, `recommend`'s answer), or None."""
    length = s.prompt_tokens + s.response_tokens
    budgets = _halvings(s.micro_tokens, length) if s.micro_tokens else [0]
    for rows in _halvings(s.rollout_rows, 1):
        for budget in budgets:
            alt = replace(s, rollout_rows=rows, eval_rows=min(s.eval_rows, rows), micro_tokens=budget)
            best = recommend(alternatives(arch, alt))
            if best is not None and best[2].verdict() == "FITS":
                changes = {}
                if rows != s.rollout_rows:
                    changes["rollout.batch_sequences"] = rows
                if budget != s.micro_tokens:
                    changes["trainer.micro_batch_tokens"] = budget
                return changes, best
    return None


def keeps_caches(cfg, rollout_bytes: int) -> bool:
    """Whether a run of `cfg` keeps the rollout's caches for score B (reward.score_b_from_cache, as the
    trainer resolves it: rlpr/reward/from_cache.py), with the rollout copy in `rollout_bytes`."""
    from rlpr.reward.from_cache import uses_cache
    from rlpr.reward.kinds import REWARD_KINDS

    r, ro = cfg.reward, cfg.rollout
    kind = REWARD_KINDS.get(r.kind)
    return (ro.engine == "hf" and ro.decode_loop != "generate" and kind is not None
            and uses_cache(r.score_b_from_cache, kind.needs_score_b, r.scorer, rollout_bytes, FP32))


def setup_from_config(cfg, processes: int, device: str, device_bytes: float, fast_bf16: bool = True,
                      runtime_bytes: float | None = None) -> Setup:
    """The Setup of a validated rlpr Config for `processes` processes on `device` ("cuda" or "cpu")
    with `device_bytes` each. `fast_bf16`: whether `auto` precisions pick bf16 there (always on GPUs;
    on CPUs with AVX512-BF16/AMX: rlpr.model.precision.fast_bf16)."""
    m, d, ro, t, r, a = cfg.model, cfg.data, cfg.rollout, cfg.trainer, cfg.reward, cfg.algorithm
    rollout_bytes = {"bfloat16": BF16, "float32": FP32}.get(m.rollout_dtype, BF16 if fast_bf16 else FP32)
    bf16 = t.mixed_precision == "bf16" or (t.mixed_precision == "auto" and fast_bf16)
    strategy = t.strategy if processes > 1 else "ddp"
    n = ro.responses_per_prompt
    per_rank_prompts = max(1, math.ceil(t.prompts_per_step / processes))
    rollout_rows = min(ro.batch_sequences, per_rank_prompts * n)
    eval_rows = eval_questions = 0
    if d.val:
        questions = d.val_limit or (d.demo_val_size if d.val == "demo" else ro.batch_sequences)
        eval_questions = max(1, math.ceil(questions / processes))
        eval_rows = min(ro.batch_sequences, eval_questions * max(1, t.eval_samples))
    mini_rows = max(1, t.mini_batch_prompts // processes) * n
    share = t.share_prompt_prefix and not m.gradient_checkpointing
    return Setup(
        processes=processes, device=device, device_bytes=device_bytes, strategy=strategy, zero_stage=t.zero_stage,
        cpu_offload=t.cpu_offload, lora=m.lora, gradient_checkpointing=m.gradient_checkpointing, bf16=bf16,
        fp32_attention=t.fp32_attention, bf16_frozen_weights=t.bf16_frozen_weights, engine=ro.engine,
        rollout_bytes=rollout_bytes, prompt_tokens=d.max_prompt_tokens, response_tokens=ro.max_new_tokens,
        responses_per_prompt=n, rollout_rows=rollout_rows, round_rows=per_rank_prompts * n, eval_rows=eval_rows,
        eval_questions=eval_questions, keep_caches=keeps_caches(cfg, rollout_bytes),
        eval_response_tokens=t.eval_max_new_tokens or ro.max_new_tokens,
        micro_rows=t.micro_batch_sequences, mini_rows=mini_rows, micro_tokens=t.micro_batch_tokens, share_prefix=share,
        scoring_tokens=min(r.max_batch_tokens, t.micro_batch_tokens) if t.micro_batch_tokens else r.max_batch_tokens,
        reference_copy=(a.kl_coef > 0 or r.scorer == "initial") and not m.lora,
        lagged_copy="ema" in (r.scorer, r.score_a), vllm_gpu_fraction=ro.vllm_gpu_memory_utilization,
        vllm_kv_cache_gb=ro.vllm_kv_cache_gb, vllm_sleep=ro.vllm_sleep, runtime_bytes=runtime_bytes)
