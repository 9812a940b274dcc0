"""On-policy self-distillation in the training loop (spec section 10; docs/opsd.md): the teacher's
context, weights and pass, the per-token signal of every trained response, and the identity check.
The arithmetic is rlpr/algorithms/opsd.py; the update applies the signal (rlpr/train/update.py:
`Sample.token_advantages`, `Sample.distill`).

The teacher pass runs once per step, after the std filter and beside the old log-probs, over the
responses the step trains on: teacher prompt (the template with the reference before the question)
+ the response's own token ids, each prompt's tokens run once for its responses. It keeps, per
response token, the teacher's log-prob of the sampled token and, for opsd.loss=jsd, its row: the
full vocabulary (4 V bytes per token: 200 MB for the CPU demo's ~1000 tokens of SmolLM2, V = 49152;
1 GB with Gemma 3's V = 262144) or the top-k (8 k bytes per token with opsd.top_k=k), on the CPU
until the update.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import contextmanager

import torch

from rlpr.algorithms.opsd import (identity_stats, no_teacher_advantages, sampled_token_advantage, top_k_rows)
from rlpr.config import Config
from rlpr.data.prompts import Prompt, chat_text
from rlpr.data.records import Example
from rlpr.data.templates import teacher_messages
from rlpr.errors import TrainingError
from rlpr.model.forward import PrefixState, causal_lm, eval_mode, head_logits
from rlpr.parallel import distributed as dist
from rlpr.reward.kinds import REWARD_KINDS
from rlpr.reward.lagged import LaggedWeights, NoLagged
from rlpr.reward.score_a import initial_policy
from rlpr.train.update import DistillTarget, Sample, micro_batches, prefix_runs, shares_prefix

log = logging.getLogger("rlpr.train")


class Distiller:
    """OPSD for one run: inactive (`active` false, every method a no-op) unless reward.kind has a
    per-token signal. `targets[i]`: the example whose reference (or solution) the teacher of training
    prompt i is shown (another prompt's under reward.shuffle_references: OP2SD)."""

    def __init__(self, cfg: Config, policy, tokenizer, reward, prompts: list[Prompt], targets: list[Example],
                 reference=None):
        self.cfg, self.o = cfg, cfg.opsd
        kind = REWARD_KINDS[cfg.reward.kind]
        self.signal = kind.token_signal  # None, "teacher" or "no_teacher"
        self.weight = self.o.hybrid_lambda if kind.sequence_reward else 1.0  # opsd_hybrid: lambda
        self.policy, self.tokenizer, self.reward, self.reference = policy, tokenizer, reward, reference
        self.prompts, self.targets = prompts, targets
        self.ema = (LaggedWeights(policy, self.o.ema_decay) if self.signal == "teacher" and self.o.teacher == "ema"
                    else NoLagged())
        self.max_length = getattr(causal_lm(policy).config, "max_position_embeddings", None)
        self._teacher_ids: dict[int, list[int]] = {}
        self.warned_skipped = False
        # a list to collect the identity's (step, OPSD sum, RLPR's log reward) of every response (a benchmark)
        self.pairs: list[tuple[int, float, float]] | None = None

    @property
    def active(self) -> bool:
        """The run has a per-token signal: every trained response needs its old log-probs."""
        return self.signal is not None

    # -- the teacher ---------------------------------------------------------------------------
    def teacher_prompt_ids(self, index: int) -> list[int]:
        """Training prompt `index`'s teacher prompt (text + prefill) as token ids (cached)."""
        if index not in self._teacher_ids:
            prompt, target = self.prompts[index], self.targets[index]
            shown = {"reference": target.reference, "none": "",
                     "solution": target.extra_info.get(self.o.solution_column, "")}[self.o.context]
            text = chat_text(self.tokenizer, teacher_messages(prompt.example.prompt, self.o.template, shown,
                                                              context=self.o.context, transition=self.o.transition))
            self._teacher_ids[index] = self.tokenizer(text + prompt.prefill, add_special_tokens=False)["input_ids"]
        return self._teacher_ids[index]

    @contextmanager
    def teacher_model(self):
        """The teacher's weights: the initial model (LoRA's adapter-off base, or the frozen copy), the
        policy as it sampled the step, or the policy carrying the EMA weights."""
        if self.o.teacher == "current":
            yield self.policy
        elif self.o.teacher == "ema":
            with self.ema.swapped():
                yield self.policy
        else:
            with initial_policy(self.policy, self.cfg.model.lora, self.reference) as model:
                yield model

    def _passes(self, model, probes: list[Sample], rows: bool) -> list[tuple]:
        """Per probe (prompt + response ids), no grad: (log-prob of each response token [T], and with
        `rows` the teacher's rows for the JSD: (top-k indices [T, k] or None, log-probs [T, K])); micro-batches
        as the update's, packed where the reward's forwards are (trainer.pack_responses, resolved)."""
        t = self.cfg.trainer
        temperature, k = self.cfg.rollout.temperature, self.o.top_k
        out: dict[int, tuple] = {}
        with torch.no_grad(), eval_mode(model):
            for run in prefix_runs(micro_batches(probes, t.micro_batch_sequences, self.tokenizer.pad_token_id,
                                                 shares_prefix(self.cfg), t.micro_batch_tokens, self.reward.pack)):
                state = PrefixState(model, run[0].prefix) if run[0].prefix is not None else None
                for mb in run:
                    hidden, targets = mb.hidden(model, state)
                    sampled, indices, logps = [], [], []
                    for h, y in zip(hidden.split(64), targets.split(64)):
                        logits = head_logits(model, h) / temperature
                        full = torch.log_softmax(logits, dim=-1)
                        sampled.append(full.gather(-1, y[:, None]).squeeze(-1).cpu())
                        if rows and k:
                            top = top_k_rows(logits, k)
                            indices.append(top[0].cpu())
                            logps.append(top[1].cpu())
                        elif rows:
                            logps.append(full.cpu())
                    lengths = [s.response_len for s in mb.samples]
                    pieces = [torch.cat(sampled).split(lengths)]
                    if rows:
                        pieces.append(torch.cat(indices).split(lengths) if k else [None] * len(lengths))
                        pieces.append(torch.cat(logps).split(lengths))
                    for s, *values in zip(mb.samples, *pieces):
                        out[id(s)] = tuple(values)
        return [out[id(p)] for p in probes]

    # -- the step's signal ---------------------------------------------------------------------
    def prepare(self, samples: list[Sample], step: int) -> dict:
        """Give each trained response its per-token signal (every rank calls it: the no-teacher
        threshold and the metrics are over all ranks); returns the step's opsd/ metrics."""
        if not self.active:
            return {}
        tick = time.perf_counter()
        if self.signal == "no_teacher":
            return self._no_teacher(samples)
        metrics = self._teacher(samples, step)
        metrics["perf/teacher_s"] = time.perf_counter() - tick - metrics.get("perf/identity_s", 0.0)
        return metrics

    def _no_teacher(self, samples: list[Sample]) -> dict:
        """-delta on the step's lowest-probability tokens (all ranks' tokens ranked together)."""
        everyone = dist.gather_objects([s.old_logp for s in samples])
        start = sum(len(r) for r in everyone[:dist.rank()])
        advantages = no_teacher_advantages([t for r in everyone for t in r], self.o.no_teacher_rho,
                                           self.o.no_teacher_delta)
        for s, a in zip(samples, advantages[start:start + len(samples)]):
            s.token_advantages = a
        marked = sum(int((a != 0).sum()) for a in advantages)
        tokens = sum(len(a) for a in advantages)
        return {"opsd/no_teacher_frac": marked / tokens if tokens else float("nan"),
                "opsd/adv_mean": sum(float(a.sum()) for a in advantages) / tokens if tokens else float("nan")}

    def _teacher(self, samples: list[Sample], step: int) -> dict:
        probes, owners = [], []
        for i, s in enumerate(samples):
            ids = self.teacher_prompt_ids(s.prompt_index)
            if self.max_length is None or len(ids) + s.response_len <= self.max_length:
                probes.append(Sample(ids + s.input_ids[s.prompt_len:], len(ids), 0.0))
                owners.append(i)
        jsd = self.o.loss == "jsd"
        with self.teacher_model() as model:
            teacher = self._passes(model, probes, rows=jsd)
        sums = {"u": 0.0, "ratio": 0.0, "adv": 0.0, "clipped": 0.0, "tokens": 0.0}
        for i, (u, *rows) in zip(owners, teacher):
            s = samples[i]
            ratio = u - s.old_logp
            if jsd:
                s.distill = DistillTarget(rows[1], rows[0], self.o.beta, self.weight, self.o.jsd_token_clip)
            else:
                a = sampled_token_advantage(u, s.old_logp, self.o.clip)
                s.token_advantages = self.weight * a
                sums["adv"] += float(s.token_advantages.sum())
                sums["clipped"] += float((a != ratio).sum())
            sums["u"] += float(u.sum())
            sums["ratio"] += float(ratio.sum())
            sums["tokens"] += len(u)
        keys = list(sums)
        total = dict(zip(keys + ["responses", "skipped"], dist.sum_values(
            [sums[k] for k in keys] + [len(samples), len(samples) - len(probes)])))
        self._check_skipped(int(total["skipped"]), int(total["responses"]), step)
        n = total["tokens"] or float("nan")
        metrics = {"opsd/teacher_logp_mean": total["u"] / n, "opsd/log_ratio_mean": total["ratio"] / n,
                   "opsd/skipped_frac": total["skipped"] / max(total["responses"], 1)}
        if not jsd:
            metrics.update({"opsd/adv_mean": total["adv"] / n, "opsd/clip_frac": total["clipped"] / n})
        every = self.o.identity_every
        if every and step % every == 0:
            tick = time.perf_counter()
            metrics.update(self.identity([samples[i] for i in owners], [t[0] for t in teacher], step))
            metrics["perf/identity_s"] = time.perf_counter() - tick
        return metrics

    def _check_skipped(self, skipped: int, responses: int, step: int) -> None:
        """Responses whose teacher prompt plus response exceed the model's context get no teacher
        signal: one warning the first time (as the probability reward's too-long responses), and a
        stop when a step has none left to distill (it would train on nothing, issue 60 S2)."""
        if not skipped:
            return
        if skipped == responses:
            raise TrainingError(
                f"step {step}: none of the {responses} responses fits the model's context ({self.max_length} tokens) "
                f"after its teacher prompt (the {self.o.context} block, the question and the response): OPSD has "
                f"nothing to distill; shorten data.max_prompt_tokens, rollout.max_new_tokens or the references")
        if not self.warned_skipped:
            self.warned_skipped = True
            log.warning("%d of %d responses do not fit the model's context (%d tokens) after their teacher prompt: "
                        "they get no teacher signal (opsd/skipped_frac counts them each step)", skipped, responses,
                        self.max_length)

    # -- the identity --------------------------------------------------------------------------
    def identity(self, samples: list[Sample], teacher_logps: list[torch.Tensor], step: int) -> dict:
        """The OPSD sum sum_t [log T(o_t | c, o_<t) - log T(o_t | q, o_<t)] against RLPR's log-form
        debiased reward log T(y* | q, o) - log T(y* | q) (score B's and score A's texts, the run's cue
        conventions; the reference the teacher saw), per response, all with the teacher's weights T:
        the check measures one model's consistency (with teacher=current, T is the policy that
        sampled; then its student term is the old log-probs already computed)."""
        reward = self.reward
        prompts = [self.prompts[s.prompt_index] for s in samples]
        references = [self.targets[s.prompt_index].reference for s in samples]
        b_items = [reward.score_b_text(p.text, s.response, y) for p, s, y in zip(prompts, samples, references)]
        a_items = [None if b is None else reward.score_a_text(p.text, y, b.fallback)
                   for p, y, b in zip(prompts, references, b_items)]
        with self.teacher_model() as model:
            if self.o.teacher == "current":
                student = [s.old_logp for s in samples]
            else:
                student = [t[0] for t in self._passes(model, [Sample(s.input_ids, s.prompt_len, 0.0)
                                                              for s in samples], rows=False)]
            b = reward.reference_logprobs(model, b_items)
            a = reward.reference_logprobs(model, a_items)
        nan = float("nan")
        lhs = [float((u - v).double().sum()) for u, v in zip(teacher_logps, student)]
        rhs = [nan if x is None or y is None else float(x.double().sum() - y.double().sum()) for x, y in zip(b, a)]
        pairs = [(step, x, y) for x, y in zip(lhs, rhs) if math.isfinite(y)]
        everyone = [p for r in dist.gather_objects(pairs) for p in r]
        if self.pairs is not None:
            self.pairs.extend(everyone)
        return identity_stats([x for _, x, _ in everyone], [y for _, _, y in everyone]).metrics()

    # -- the teacher's EMA weights -------------------------------------------------------------
    def update(self) -> None:
        """After an optimizer step: fold the policy's weights into the EMA teacher (opsd.teacher=ema)."""
        self.ema.update()

    def state_dict(self) -> dict:
        return {"ema": self.ema.state_dict()}

    def load_state_dict(self, state: dict | None) -> None:
        self.ema.load_state_dict((state or {}).get("ema"))
