"""The sections that only `rlpr train` reads: `data` (training and held-out prompts), `algorithm`
(advantages, the std filter, the policy loss), `opsd` (on-policy self-distillation's teacher) and
`trainer` (the loop: batch sizes, optimizer, parallelism, outputs). Apart from config/sampling.py
because the commands that do not train never check them; each field's docstring is its entry in
docs/config.md (rlpr/cli/config_reference.py reads them from this source); no rlpr import here.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
    """Demo task families to use (empty: all the short-answer ones; rlpr/data/demo_tasks.py FAMILIES, and the
    reasoning families with worked solutions, rlpr/data/reasoning_tasks.py: one kind per run)."""
    val_limit: int = 0
    """Evaluate on at most this many held-out examples (0: all)."""
    max_prompt_tokens: int = 1024
    """Longer prompts are skipped (and counted), never crash the run."""
    shuffle: bool = True
    """Shuffle the training prompts (by trainer.seed)."""


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
    """Rollout rounds per step for dynamic sampling (until prompts_per_step groups are kept): the
    bound on what filling the batch costs, at most this many rounds of rollouts per step."""
    refill: str = "estimate"
    """How many prompts each extra sampling round draws: estimate (the missing groups over the step's
    keep rate so far, at most prompts_per_step; surplus kept groups' prompts wait in the stream's
    cache for a later step), missing (exactly the missing groups: no rollout of a kept group goes
    unused, but a round fills only its keep rate of the gap) or full (prompts_per_step every round).
    Every round's responses count in rollout/responses (docs/training.md, "Filling the batch")."""
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
    early_stop_ratio: float = 0.0
    """Mini-batch early stop (RLinf's early_stop_imp_ratio; 0: off): a mini-batch whose mean
    importance ratio pi_theta / pi_old over the tokens its policy loss covers exceeds this bound is
    dropped (its gradient discarded, no optimizer step) instead of applied; counted in
    policy/dropped_updates. Only a step's later updates (trainer.epochs_per_step > 1, or
    mini_batch_prompts < prompts_per_step) can move the ratio off 1. RLinf's math recipes use 5."""


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
    template: str = "matched"
    """The teacher's user turn (docs/opsd.md lists each text): matched (the student's own turn after a
    block showing the reference, "Here is a reference answer to the question below:", or with
    context=solution the worked solution, "Here is a reference solution to the problem below:"; the
    rest of the chat and the pre-fill as the student's), reference_code (the reference code's fixed
    wording, which asks every student for step-by-step reasoning: the default before issue 58), or a
    text of its own with {reference} and {question} (the prompt's last user turn, instructions
    included)."""
    transition: str = "auto"
    """template=matched: whether the reference code's transition sentence ("After understanding the
    reference solution ..., now articulate your own step-by-step reasoning ...") follows the block:
    auto (only where the student's chat itself asks for reasoning: step by step, reason, think),
    always, or never. A teacher asked for something its student is not asked for distills that
    mismatch, not the reference."""
    jsd_token_clip: float = 0.0
    """loss=jsd: each response token's divergence is clipped at this value before averaging,
    min(JSD_t, c) (a token past c adds c and no gradient), so a few style tokens cannot carry the
    loss (the reference code's jsd_token_clip, 0.05 at 1.7B); 0: no clip."""
    recipe: str = ""
    """A named group of keys applied before the command line's overrides (which still win):
    authors_current (the reference code's recipe after its 2026 update: opsd.loss=jsd, opsd.beta=0,
    opsd.jsd_token_clip=0.05, rollout.temperature=1.1, rollout.top_p=0.95, opsd.teacher=initial,
    opsd.context=solution) or "" (none). Recorded in the run's config; a resumed run keeps the values."""
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
    pack_responses: str = "auto"
    """With the shared prompt prefix: a prompt's responses run packed into rows after its keys/values
    (a block-diagonal causal mask, positions restarting per response) instead of one padded row each,
    in the update, its log-prob passes and the scoring forwards that recompute (score B, A, the
    label-free statistics): no padding, fewer forwards, the same numbers up to float summation order.
    on | off | auto (on the CPU, for models with full or sliding-window attention through SDPA; rows
    capped near 0.1 x a layer's linear weights / hidden size tokens)."""
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
    eval_temperature: float = 0.0
    """The temperature of the held-out samples (eval_samples) (0: rollout.temperature), so that runs
    trained at other temperatures are evaluated alike."""
    eval_top_p: float = 0.0
    """The nucleus of the held-out samples (0: rollout.top_p)."""
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
