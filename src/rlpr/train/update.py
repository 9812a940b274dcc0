"""The policy update of one step (spec section 5): old log-probs, mini-batches of whole groups,
micro-batches with gradient accumulation, PPO-clip + entropy (+ KL), clipping, optimizer step.

Every micro-batch loss is divided by counts of the WHOLE mini-batch (summed over ranks), so the
accumulated gradient is the same however the mini-batch is split.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from rlpr.parallel import distributed as dist
from rlpr.algorithms.losses import (ENTROPY_TOKENS, KL_ESTIMATORS, SFT_WEIGHTS, Normaliser, aggregate_loss,
                                   ppo_clip_token_loss, ref_sft_loss, rollout_is_weights)
from rlpr.algorithms.opsd import clip_token_divergence, jsd_from_logits
from rlpr.config import AlgorithmConfig
from rlpr.model.batching import similar_widths, split_batches
from rlpr.model.forward import (PrefixState, eval_mode, hidden_states, project_logprobs, project_rows,
                                token_logprobs)
from rlpr.model.memory import release_memory
from rlpr.model.packing import prefix_continuation_hidden
from rlpr.reward.parsing import answer_block_start
from rlpr.reward.sequence import pad_batch, reasoning_token_count
from rlpr.train.metrics import mean


@dataclass
class DistillTarget:
    """OPSD's teacher rows for one response (opsd.loss=jsd; rlpr/train/opsd.py fills them): the
    teacher's log-probs [T, K] over the full vocabulary (K = V, `indices` None) or over its top-k
    tokens (`indices` [T, k], renormalised), the JSD's beta and the term's weight."""

    logp: torch.Tensor
    indices: torch.Tensor | None
    beta: float
    weight: float
    token_clip: float = 0.0  # opsd.jsd_token_clip: each token's JSD clipped at it (0: none)


@dataclass
class Sample:
    """One response to train on: prompt + response token ids and its advantage.

    `loss_tokens` (algorithm.pg_tokens=reasoning): only the first this-many response tokens enter
    the policy loss (None: all). `sft` (algorithm.ref_sft_coef > 0): o' as (token ids, reference
    mask), trained with weight `sft_weight` by the reference-SFT term (None: no o').
    `token_advantages` [response tokens] are added to `advantage` per token and `distill` adds the
    JSD to a teacher (OPSD, rlpr/train/opsd.py, which reads `prompt_index` and `response`)."""

    input_ids: list[int]
    prompt_len: int
    advantage: float
    old_logp: torch.Tensor | None = None  # [response tokens], fp32 on the CPU (moved per micro-batch)
    ref_logp: torch.Tensor | None = None
    rollout_logp: torch.Tensor | None = None  # the rollout engine's own log-probs (vllm), for rollout/logprob_gap
    loss_tokens: int | None = None
    sft: tuple[list[int], list[bool]] | None = None
    sft_weight: float = 0.0
    token_advantages: torch.Tensor | None = None
    distill: DistillTarget | None = None
    prompt_index: int = -1  # the training prompt it answers
    response: str = ""  # its text as the reward read it (prefill included)

    @property
    def response_len(self) -> int:
        return len(self.input_ids) - self.prompt_len

    @property
    def loss_len(self) -> int:
        """Response tokens the policy loss covers."""
        n = self.response_len
        return n if self.loss_tokens is None else max(0, min(self.loss_tokens, n))

    @property
    def loss_mask(self) -> torch.Tensor:
        """[response tokens] bool: True where the policy loss applies."""
        return torch.arange(self.response_len) < self.loss_len


@dataclass
class MicroBatch:
    """Sequences processed in one forward/backward. With `prefix`, they all share that prompt,
    which then runs once (see `forward.continuation_hidden`); `packed` (with `prefix`): the
    responses run packed into rows after it (`model.packing`, trainer.pack_responses) instead of
    one padded row each."""

    samples: list[Sample]
    pad_id: int
    prefix: list[int] | None = None
    packed: bool = False
    seq: torch.Tensor = field(init=False)  # [N] sequence index of every response token (CPU)
    advantages: torch.Tensor = field(init=False)  # [N] (CPU; `micro_batch_loss` moves them to the model)
    mask: torch.Tensor | None = field(init=False)  # [N] bool, the tokens the loss covers (None: all)

    def __post_init__(self):
        lengths = torch.tensor([s.response_len for s in self.samples])
        self.seq = torch.repeat_interleave(torch.arange(len(self.samples)), lengths)
        self.advantages = torch.repeat_interleave(
            torch.tensor([s.advantage for s in self.samples], dtype=torch.float32), lengths)
        if any(s.token_advantages is not None for s in self.samples):  # OPSD: a signal per token
            self.advantages = self.advantages + torch.cat(
                [s.token_advantages if s.token_advantages is not None else torch.zeros(s.response_len)
                 for s in self.samples]).float()
        partial = any(s.loss_len < s.response_len for s in self.samples)
        self.mask = torch.cat([s.loss_mask for s in self.samples]) if partial else None

    def cat(self, attr: str, device: torch.device | None = None) -> torch.Tensor | None:
        parts = [getattr(s, attr) for s in self.samples]
        return None if any(p is None for p in parts) else torch.cat(parts).to(device)

    def logprobs(self, model, temperature: float, with_entropy: bool = False, state: PrefixState | None = None):
        """(logp [N], entropy [N] or None) of every response token, in sample order. `state`: the
        shared prefix's state when the caller computed it once for several micro-batches."""
        return project_logprobs(model, *self.hidden(model, state), temperature, with_entropy)

    def hidden(self, model, state: PrefixState | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states [N, H] before every response token, those tokens [N]), in sample order."""
        if self.prefix is not None:
            p = len(self.prefix)
            conts = [s.input_ids[p:] for s in self.samples]
            state = state if state is not None else PrefixState(model, self.prefix)
            return prefix_continuation_hidden(model, state, conts, pack=self.packed)
        ids, attn, target = self._padded(model)
        return hidden_states(model, ids, attn)[:, :-1][target[:, 1:]], ids[:, 1:][target[:, 1:]]

    def _padded(self, model) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(ids, attention mask, response-token mask) [S, width], right-padded, on the model's device."""
        width = max(len(s.input_ids) for s in self.samples)
        ids = torch.full((len(self.samples), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        target = torch.zeros_like(ids, dtype=torch.bool)
        for i, s in enumerate(self.samples):
            ids[i, :len(s.input_ids)] = torch.tensor(s.input_ids)
            attn[i, :len(s.input_ids)] = 1
            target[i, s.prompt_len:len(s.input_ids)] = True
        device = next(model.parameters()).device
        return ids.to(device), attn.to(device), target.to(device)


def distill_divergence(model, mb: MicroBatch, hidden: torch.Tensor, temperature: float
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """OPSD's JSD_beta(teacher, student) per response token [N] (0 where a response has no teacher rows;
    clipped at opsd.jsd_token_clip), its weight [N], which tokens have teacher rows [N] (bool) and which
    were past the clip [N] (bool), or None when no sample of `mb` has."""
    targets = [s.distill for s in mb.samples]
    if all(d is None for d in targets):
        return None
    lengths = [s.response_len for s in mb.samples]
    chosen = torch.cat([torch.full((n,), d is not None) for n, d in zip(lengths, targets)]).to(hidden.device)
    given = [d for d in targets if d is not None]
    rows = [torch.cat([d.logp for d in given]).to(hidden.device)]
    if given[0].indices is not None:
        rows.append(torch.cat([d.indices for d in given]).to(hidden.device))
    fn = functools.partial(jsd_from_logits, beta=given[0].beta)
    raw = project_rows(model, hidden[chosen], fn, *rows, temperature=temperature)
    clip = given[0].token_clip
    values = clip_token_divergence(raw, clip)
    jsd = torch.zeros(hidden.shape[0], dtype=values.dtype, device=hidden.device).masked_scatter(chosen, values)
    past = raw.detach() > clip if clip > 0 else torch.zeros_like(raw, dtype=torch.bool)
    at_clip = torch.zeros_like(chosen).masked_scatter(chosen, past)
    weight = torch.cat([torch.full((n,), d.weight if d is not None else 0.0) for n, d in zip(lengths, targets)])
    return jsd, weight.to(hidden.device), chosen, at_clip


def reasoning_tokens(tokenizer, token_ids: list[int], response: str, prefill_chars: int, mode: str) -> int | None:
    """algorithm.pg_tokens=reasoning: how many of the generated `token_ids` lie before the answer
    block of `response` (= prefill + their text; `prefill_chars` long), i.e. end at or before the
    start of `<answer>` (or `\\boxed{`); None (all of them) when the response has no answer block."""
    start = answer_block_start(response, mode)
    if start is None:
        return None
    return reasoning_token_count(tokenizer, token_ids, max(0, start - prefill_chars))


def training_sample(prompt, rollout, out, advantage: float, cfg, reward) -> Sample:
    """One response (`rollout`, rewarded `out`) to `prompt` as a training sample: with
    algorithm.pg_tokens=reasoning its loss covers its reasoning only; with algorithm.ref_sft_coef
    it carries o' (as `reward`, the ProbabilityReward, tokenizes it) for the reference-SFT term."""
    a = cfg.algorithm
    sample = Sample(prompt.token_ids + rollout.token_ids, len(prompt.token_ids), advantage)
    if rollout.logprobs is not None and len(rollout.logprobs) == len(rollout.token_ids):
        sample.rollout_logp = torch.tensor(rollout.logprobs, dtype=torch.float32)
    response = prompt.response_text(rollout.text)
    sample.prompt_index, sample.response = prompt.index, response
    if a.pg_tokens == "reasoning":
        sample.loss_tokens = reasoning_tokens(reward.tokenizer, rollout.token_ids, response, len(prompt.prefill),
                                              cfg.reward.format_mode)
    if a.ref_sft_coef:
        sample.sft = reward.scored_sequence(prompt.text, response, prompt.example.reference)
        sample.sft_weight = SFT_WEIGHTS[a.ref_sft_weight](out.reward, advantage)
    return sample


def prefix_runs(batches: list[MicroBatch]) -> list[list[MicroBatch]]:
    """Consecutive micro-batches that share one prefix (each alone when it has none)."""
    runs: list[list[MicroBatch]] = []
    for mb in batches:
        if runs and mb.prefix is not None and runs[-1][0].prefix == mb.prefix:
            runs[-1].append(mb)
        else:
            runs.append([mb])
    return runs


def micro_batches(samples: list[Sample], size: int, pad_id: int, share_prefix: bool = True,
                  max_tokens: int = 0, pack: bool = False) -> list[MicroBatch]:
    """Split into micro-batches of at most `size` sequences, or with `max_tokens` > 0 of at most
    that many tokens, padding included (`model.batching`; sums do not depend on the split).

    With `share_prefix`, a micro-batch holds responses to one prompt, whose prefix runs once
    (its keys/values are repeated per row, so a row counts its full length against the budget),
    and responses of similar lengths (`batching.similar_widths`: the prefix runs once for all of a
    prompt's micro-batches, so splitting costs only a forward call, and saves the padding);
    otherwise sequences are length-sorted to reduce padding. With `pack` (and `share_prefix`) a
    micro-batch's responses run packed into rows (`model.packing`): no padding, so no width split;
    the same count or budget (a budget counted as if padded: an upper bound of the packed size).
    """
    if not share_prefix:
        parts = split_batches([len(s.input_ids) for s in samples], size, max_tokens)
        return [MicroBatch([samples[i] for i in part], pad_id) for part in parts]
    groups: dict[tuple[int, ...], list[Sample]] = {}
    for s in samples:
        groups.setdefault(tuple(s.input_ids[:s.prompt_len]), []).append(s)
    out = []
    for prefix, members in groups.items():
        for part in split_batches([len(s.input_ids) for s in members], size, max_tokens, sort=False):
            if pack:
                out.append(MicroBatch([members[i] for i in part], pad_id, list(prefix), packed=True))
                continue
            for piece in similar_widths([members[i].response_len for i in part]):
                out.append(MicroBatch([members[part[j]] for j in piece], pad_id, list(prefix)))
    return out


@torch.no_grad()
def fill_logprobs(model, samples: list[Sample], attr: str, size: int, pad_id: int, temperature: float,
                  share_prefix: bool = True, max_tokens: int = 0, pack: bool = False) -> None:
    """Per-token log-probs of each response under `model`, stored in `sample.<attr>` on the CPU
    (one copy per micro-batch; they wait there for the update, off the GPU); micro-batches as
    the update's (`micro_batches`)."""
    with eval_mode(model):
        for run in prefix_runs(micro_batches(samples, size, pad_id, share_prefix, max_tokens, pack)):
            state = PrefixState(model, run[0].prefix) if run[0].prefix is not None else None
            for mb in run:
                logp, _ = mb.logprobs(model, temperature, state=state)
                for s, piece in zip(mb.samples, torch.split(logp.cpu(), [s.response_len for s in mb.samples])):
                    setattr(s, attr, piece.clone())


def fill_step_logprobs(policy, samples: list[Sample], cfg, pad_id: int, old: bool, reference=None,
                       pack: bool = False) -> None:
    """The no-grad passes of a step before its updates: the policy's old log-probs (`old`: the step has
    several updates, or OPSD reads them), then, with `reference` (a context manager that gives the KL's
    reference model, algorithm.kl_coef), its log-probs; micro-batches as the update's (`pack`: the
    resolved trainer.pack_responses)."""
    t = cfg.trainer
    args = (t.micro_batch_sequences, pad_id, cfg.rollout.temperature, shares_prefix(cfg), t.micro_batch_tokens, pack)
    if old:
        fill_logprobs(policy, samples, "old_logp", *args)
    if reference is not None:
        with reference as model:
            fill_logprobs(model, samples, "ref_logp", *args)


def shares_prefix(cfg) -> bool:
    """Whether the update runs each prompt once for its responses (trainer.share_prompt_prefix; not
    under model.gradient_checkpointing)."""
    return cfg.trainer.share_prompt_prefix and not cfg.model.gradient_checkpointing


def normaliser(samples: list[Sample]) -> Normaliser:
    """Tokens the policy loss covers and sequences, over the whole mini-batch (all ranks)."""
    tokens, seqs = dist.sum_values([sum(s.loss_len for s in samples), len(samples)])
    return Normaliser(tokens=max(int(tokens), 1), sequences=max(int(seqs), 1))


def micro_batch_loss(model, mb: MicroBatch, norm: Normaliser, cfg: AlgorithmConfig,
                     temperature: float, state: PrefixState | None = None) -> tuple[torch.Tensor, dict]:
    """The loss of one micro-batch (already divided by the mini-batch normaliser) and token sums."""
    hidden, targets = mb.hidden(model, state)
    logp, entropy = project_logprobs(model, hidden, targets, temperature, with_entropy=True)
    distill = distill_divergence(model, mb, hidden, temperature)  # OPSD's JSD to the teacher, per token
    device = logp.device
    old = mb.cat("old_logp", device)
    old = logp.detach() if old is None else old
    ref = mb.cat("ref_logp", device) if cfg.kl_coef else None
    engine = mb.cat("rollout_logp", device)  # vs the trainer's log-probs of the sampling policy
    gap = {"logprob_gap": (old - engine).abs().sum().item(), "gap_tokens": float(engine.numel())} \
        if engine is not None else {}
    advantages, seq = mb.advantages.to(device), mb.seq.to(device)
    n_seq = len(mb.samples)
    rho = outside = None
    if cfg.rollout_is != "none" and engine is not None:  # over every sampled token, before the mask below
        rho, outside = rollout_is_weights(old, engine, seq, n_seq, cfg.rollout_is, cfg.rollout_is_min,
                                          cfg.rollout_is_max)
    if mb.mask is not None:  # algorithm.pg_tokens=reasoning: the answer's tokens leave the loss
        keep = mb.mask.to(device)
        logp, entropy, old, advantages, seq = logp[keep], entropy[keep], old[keep], advantages[keep], seq[keep]
        ref = ref[keep] if ref is not None else None
        rho, outside = (rho[keep], outside[keep]) if rho is not None else (None, None)
        distill = tuple(t[keep] for t in distill) if distill is not None else None
    pg, clipped = ppo_clip_token_loss(logp, old, advantages, cfg.clip_low, cfg.clip_high)
    if rho is not None:  # algorithm.rollout_is: the sampling engine's mismatch, corrected
        pg = pg * rho
        gap.update(is_weight=rho.sum().item(), is_outside=outside.sum().item())

    def agg(values):
        return aggregate_loss(values, seq, n_seq, norm, cfg.loss_agg)

    weight = ENTROPY_TOKENS[cfg.entropy_tokens](advantages)  # algorithm.entropy_tokens (None: every token)
    loss = agg(pg) - cfg.entropy_coef * agg(entropy if weight is None else entropy * weight)
    kl_sum = 0.0
    if cfg.kl_coef:
        kl = KL_ESTIMATORS[cfg.kl_estimator](logp, ref)
        loss = loss + cfg.kl_coef * agg(kl)
        kl_sum = kl.detach().sum().item()
    if distill is not None:  # opsd.loss=jsd: the teacher's distribution, distilled token by token
        jsd, jsd_weight, chosen, at_clip = distill
        loss = loss + agg(jsd * jsd_weight)
        gap.update(opsd_jsd=jsd.detach().sum().item(), opsd_tokens=float(chosen.sum().item()),
                   opsd_clipped=float(at_clip.sum().item()))
    stats = {"pg_loss": pg.detach().sum().item(), "clipped": clipped.sum().item(),
             "adv_abs": advantages.abs().sum().item(), "ratio": torch.exp(logp.detach() - old).sum().item(),
             "entropy": entropy.detach().sum().item(), "kl": kl_sum, "tokens": float(logp.numel()),
             "ratio_gap": (logp.detach() - old).abs().sum().item(), **gap}
    return loss, stats


# The per-token and per-sequence sums an update reports (summed over micro-batches, then ranks).
UPDATE_SUMS = ("pg_loss", "clipped", "entropy", "kl", "tokens", "ratio_gap", "sft_logp", "sft_seqs", "logprob_gap",
               "gap_tokens", "is_weight", "is_outside", "micro_batches", "opsd_jsd", "opsd_tokens",
               "opsd_clipped", "adv_abs", "groups", "ratio")


def optional_metrics(sums: dict, tokens: float, ref_sft: bool, rollout_is: bool = False) -> dict:
    """The update's metrics that exist only in some runs: the reference-SFT log-prob, the mean
    |engine log-prob - trainer log-prob| per sampled token when the engine reports its own (vllm),
    and with algorithm.rollout_is the mean weight and the fraction of tokens clipped or masked."""
    out = {"policy/ref_sft_logp": sums["sft_logp"] / max(sums["sft_seqs"], 1.0)} if ref_sft else {}
    if sums.get("gap_tokens"):
        out["rollout/logprob_gap"] = sums["logprob_gap"] / sums["gap_tokens"]
    if rollout_is and sums.get("gap_tokens"):  # over the tokens the policy loss covers
        out["rollout/is_weight_mean"] = sums["is_weight"] / tokens
        out["rollout/is_outside_frac"] = sums["is_outside"] / tokens
    if sums.get("opsd_tokens"):  # opsd.loss=jsd: the mean JSD to the teacher per token, before the step
        out["opsd/jsd"] = sums["opsd_jsd"] / sums["opsd_tokens"]  # after opsd.jsd_token_clip
        out["opsd/jsd_clip_frac"] = sums.get("opsd_clipped", 0.0) / sums["opsd_tokens"]
    return out


def mini_batch_ratio(stats: dict) -> float:
    """A mini-batch's mean importance ratio pi_theta / pi_old over the tokens its policy loss covered
    (every rank's; every rank calls it), from `accumulate_gradients`' sums: what
    algorithm.early_stop_ratio bounds (RLinf's early_stop_imp_ratio, the same statistic). 1 where it
    covered no token."""
    ratio, tokens = dist.sum_values([stats.get("ratio", 0.0), stats.get("tokens", 0.0)])
    return ratio / tokens if tokens else 1.0


def early_stop(stats: dict, bound: float) -> tuple[bool, float]:
    """(drop the mini-batch, its mean ratio): drop when `bound` (algorithm.early_stop_ratio) is set
    and the mean ratio exceeds it; the same answer on every rank (the sums are global)."""
    ratio = mini_batch_ratio(stats)
    return bool(bound) and ratio > bound, ratio


def step_or_drop(strategy, stats: dict, bound: float, totals: dict, grad_norms: list, ratios: list) -> bool:
    """After a mini-batch's backward passes: the optimizer step (the strategy's: reduce, clip, AdamW),
    its gradient norm into `grad_norms` and its sums into `totals`; or, when its mean ratio exceeds
    `bound` (algorithm.early_stop_ratio, `early_stop`), its gradient discarded with no step. Its mean
    ratio goes into `ratios` either way. True when the step was taken."""
    drop, ratio = early_stop(stats, bound)
    ratios.append(ratio)
    if drop:
        strategy.discard()
        return False
    grad_norms.append(strategy.step())
    for k, v in stats.items():
        totals[k] = totals.get(k, 0.0) + v
    return True


def update_metrics(totals: dict, grad_norms: list[float], lr: float, cfg: AlgorithmConfig,
                   dropped: int = 0, ratios: tuple[float, ...] = ()) -> dict:
    """One step's policy metrics from its updates' summed statistics (summed over ranks here: every
    rank calls it). A step with no update (every group filtered out) has no per-token values: NaN.
    `totals` holds the applied mini-batches' sums; `dropped` counts those algorithm.early_stop_ratio
    dropped and `ratios` is every mini-batch's mean importance ratio (applied or dropped)."""
    sums = dict(zip(UPDATE_SUMS, dist.sum_values([totals.get(k, 0.0) for k in UPDATE_SUMS])))
    tokens = sums["tokens"] or float("nan")
    return {**optional_metrics(sums, tokens, bool(cfg.ref_sft_coef), cfg.rollout_is != "none"),
            "policy/pg_loss": sums["pg_loss"] / tokens, "policy/clip_frac": sums["clipped"] / tokens,
            "policy/entropy": sums["entropy"] / tokens, "policy/kl": sums["kl"] / tokens,
            "policy/ratio_gap": sums["ratio_gap"] / tokens, "policy/grad_norm": mean(grad_norms),
            "policy/updates": len(grad_norms), "policy/lr": lr, "policy/tokens": sums["tokens"],
            # the advantage's scale: mean |A| over the tokens the policy loss covered (OPSD's per-token
            # signal included); the groups the update trained on (kept groups with a non-empty response)
            "policy/adv_abs_mean": sums["adv_abs"] / tokens, "policy/groups": sums["groups"],
            # the largest mini-batch mean importance ratio of the step (what early_stop_ratio bounds)
            "policy/ratio_max": max(ratios, default=float("nan")), "policy/dropped_updates": dropped,
            "perf/micro_batches": sums["micro_batches"]}


def sft_batches(samples: list[Sample], size: int, max_tokens: int = 0) -> list[list[Sample]]:
    """The samples that carry an o' (reference-SFT term), longest first, `size` per forward (or
    `max_tokens` per forward, padding included)."""
    todo = [s for s in samples if s.sft is not None]
    return [[todo[i] for i in part] for part in split_batches([len(s.sft[0]) for s in todo], size, max_tokens)]


def sft_micro_batch_loss(model, batch: list[Sample], norm: Normaliser, cfg: AlgorithmConfig, temperature: float,
                         pad_id: int) -> tuple[torch.Tensor, dict]:
    """The reference-SFT term (`losses.ref_sft_loss`) of some o' sequences: one forward over them
    (padded), log-probs of their reference tokens at the rollout temperature, as score B takes them."""
    ids, attn, target = pad_batch([s.sft[0] for s in batch], [s.sft[1] for s in batch], pad_id)
    device = next(model.parameters()).device
    logp, _ = token_logprobs(model, ids.to(device), attn.to(device), target.to(device), temperature)
    seq = torch.repeat_interleave(torch.arange(len(batch)), target[:, 1:].sum(-1)).to(device)
    weights = torch.tensor([s.sft_weight for s in batch], dtype=torch.float32)
    loss, means = ref_sft_loss(logp.float(), seq, len(batch), weights, cfg.ref_sft_coef, norm, cfg.ref_sft_norm)
    return loss, {"sft_logp": means.sum().item(), "sft_seqs": float(len(batch))}


def padding_micro_batch(pad_id: int, share_prefix: bool) -> MicroBatch:
    """A one-token prompt and response: the same module calls as a real micro-batch (so the same
    FSDP collectives); its log-prob times 0 gives a zero gradient and no statistics."""
    return MicroBatch([Sample([pad_id, pad_id], 1, 0.0)], pad_id, [pad_id] if share_prefix else None)


def accumulate_gradients(model, samples: list[Sample], cfg: AlgorithmConfig, micro_size: int, pad_id: int,
                         temperature: float, share_prefix: bool = True, lockstep: bool = False,
                         backward=torch.Tensor.backward, max_tokens: int = 0, pack: bool = False) -> dict:
    """Backward over all micro-batches of one mini-batch; returns summed token statistics.
    Called on every rank for every update, even with no samples (the normaliser is global).

    With `share_prefix`, a prompt whose responses span several micro-batches runs forward once:
    each micro-batch's backward stops at the prompt's keys/values (detached leaves that sum the
    gradients) and one backward through the prompt follows its last micro-batch. The same
    gradient as running the prompt per micro-batch, up to float summation order, for a prompt's
    activations more in memory. With `lockstep` (FSDP, DeepSpeed), every rank runs as many
    single-micro-batch forward/backward passes as the busiest one instead. Every loss goes
    through `backward`: the strategy's (DeepSpeed's engine must run each backward itself).
    `max_tokens` > 0: micro-batches by that token budget instead of `micro_size` sequences.
    `pack`: each micro-batch's responses packed into rows (`micro_batches`).
    With `cfg.ref_sft_coef`, the reference-SFT term follows, over the samples' o' sequences."""
    norm = normaliser(samples)
    totals: dict[str, float] = {}
    batches = micro_batches(samples, micro_size, pad_id, share_prefix, max_tokens, pack)
    sft = sft_batches(samples, micro_size, max_tokens) if cfg.ref_sft_coef else []
    runs = [[mb] for mb in batches] if lockstep else prefix_runs(batches)
    # agreed before any forward: a collective after them would meet other ranks' FSDP gathers
    passes = len(batches) + len(sft)
    padding = int(dist.max_value(passes)) - passes if lockstep else 0
    def accumulate(loss, stats: dict) -> None:
        backward(loss)
        for k, v in {**stats, "micro_batches": 1.0}.items():
            totals[k] = totals.get(k, 0.0) + v

    for run in runs:
        shared = len(run) > 1
        state = PrefixState(model, run[0].prefix) if shared else None
        leaf = state.detached() if shared else None
        for mb in run:
            accumulate(*micro_batch_loss(model, mb, norm, cfg, temperature, leaf))
        if shared:
            state.backward_from(leaf)
            del state, leaf
    for batch in sft:
        accumulate(*sft_micro_batch_loss(model, batch, norm, cfg, temperature, pad_id))
    for _ in range(padding):
        mb = padding_micro_batch(pad_id, share_prefix)
        logp, _ = mb.logprobs(model, temperature)
        backward(logp.sum() * 0.0)  # finite, unlike a loss whose KL term could overflow
    release_memory()  # once per update, where the machine needs the memory (model/memory.py)
    return totals
