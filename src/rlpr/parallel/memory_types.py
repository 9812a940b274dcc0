"""The vocabulary of a memory plan: units, phases, and the four records every other part speaks in.

`rlpr plan`'s arithmetic (rlpr/parallel/memory_plan.py) is split by the memory it counts, and each
part needs the same few things: the byte sizes (GiB, FP32, BF16), the five PHASES of a training
step, an `Architecture` (the model's shapes and exact parameter counts, with the per-token KV bytes
derived from them), a `Setup` (the resolved settings that move memory), a `Term` (bytes held for one
reason in some phases) and a `Plan` (the terms, their phase totals, the peak and its verdict against
FIT_MARGIN). They live here, below every term module, so that no term module imports another one
for its types and the package root is never reached: pure data and arithmetic, no torch, no files,
no rlpr import.
"""

from __future__ import annotations

from dataclasses import dataclass, field

GiB = 1024 ** 3
FP32, BF16 = 4, 2
PHASES = ("sync", "rollout", "scoring", "update", "step")

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
    prepacked: bool = False  # rollout.prepacked_weights resolved on: the copy's Linear weights laid out a second time
    prompt_tokens: int = 1024  # data.max_prompt_tokens (the longest prompt kept)
    response_tokens: int = 256  # rollout.max_new_tokens
    responses_per_prompt: int = 8
    rollout_rows: int = 32  # sequences decoded together per process (training)
    round_rows: int = 64  # sequences one process rolls out and scores per rollout round
    eval_rows: int = 0  # sequences decoded together per process (held-out evaluation; 0: none)
    eval_questions: int = 0  # held-out questions per process (their greedy responses are scored)
    eval_samples: int = 0  # trainer.eval_samples (their pass starts from the greedy pass's prompt prefills)
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
