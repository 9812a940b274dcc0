"""`rlpr reward-quality`: how well each reward separates correct from wrong responses (ROC-AUC).

The paper's protocol: keep only groups (prompts) whose responses have mixed correctness, pool
their rows and compute one ROC-AUC per score; we also report the mean within-group AUC, which
ignores how scores compare across prompts (where debiasing matters, and all a group-normalised
advantage sees). Confidence intervals come from a bootstrap over groups, since rows of one prompt
are not independent; the same resamples give paired CIs of each score's difference to the
configured reward.

Every reward variant is scored from one pass of the model over the file (`score_rows`): the
per-token log-probabilities of y* after each response (B's texts) and after the prompt alone (A's),
from which each variant (`VARIANTS`: the configured reward, every aggregation of B and of B - A,
NOVER's rank, its efficiency term and its perplexity, the rule verifier) is arithmetic.

The statistics (AUC with ties, group filtering, bootstrap) are pure functions of lists.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import random
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlpr.config import RewardConfig, RolloutConfig
from rlpr.data.prompts import chat_text
from rlpr.errors import DataError, json_line, json_safe, write_atomic

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------- statistics

def roc_auc(scores: list[float], labels: list[bool]) -> float | None:
    """ROC-AUC = P(score of a random positive > that of a random negative), ties counting one
    half (the Mann-Whitney U statistic over n_pos * n_neg); None without both classes."""
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return None
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    rank_sum = 0.0  # sum of the (average, 1-based) ranks of the positives
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        average_rank = (i + j) / 2 + 1
        rank_sum += average_rank * sum(1 for k in order[i:j + 1] if labels[k])
        i = j + 1
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def mixed_groups(groups: list, labels: list[bool]) -> dict:
    """group id -> row indices, for the groups holding both correct and wrong rows (in order)."""
    members: dict = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    return {g: idx for g, idx in members.items()
            if any(labels[i] for i in idx) and not all(labels[i] for i in idx)}


def pooled_auc(scores: list[float], labels: list[bool], group_rows: list[list[int]]) -> float | None:
    """The AUC over all rows of the given groups together (the paper's number)."""
    rows = [i for idx in group_rows for i in idx]
    return roc_auc([scores[i] for i in rows], [labels[i] for i in rows])


def mean_group_auc(scores: list[float], labels: list[bool], group_rows: list[list[int]]) -> float | None:
    """The mean over groups of the AUC within each group (groups without both classes skipped)."""
    return _mean([roc_auc([scores[i] for i in idx], [labels[i] for i in idx]) for idx in group_rows])


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 1]) of a non-empty list."""
    v = sorted(values)
    pos = q * (len(v) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def bootstrap_ci(statistic, n_groups: int, n_boot: int = 1000, seed: int = 0,
                 level: float = 0.95) -> tuple[float, float] | None:
    """Percentile CI of statistic(group indices) over resamples of the groups with replacement
    (undefined resamples are skipped); None when there is nothing to resample."""
    if n_boot <= 0 or n_groups == 0:
        return None
    rng = random.Random(seed)
    values = []
    for _ in range(n_boot):
        value = statistic([rng.randrange(n_groups) for _ in range(n_groups)])
        if value is not None:
            values.append(value)
    if not values:
        return None
    alpha = (1 - level) / 2
    return percentile(values, alpha), percentile(values, 1 - alpha)


def _difference(a, b):
    """statistic a - statistic b over the same resample (None where either is undefined)."""
    def diff(picked):
        x, y = a(picked), b(picked)
        return None if x is None or y is None else x - y
    return diff


def auc_report(columns: dict[str, list[float]], labels: list[bool], groups: list, *,
               n_boot: int = 1000, seed: int = 0, baseline: str | None = None) -> dict:
    """AUCs of every score column over the mixed-correctness groups, with bootstrap CIs; with a
    `baseline` column, also each column's AUC minus the baseline's and its paired CI (the same
    resamples of groups for both: `bootstrap_ci` draws them from `seed` alone)."""
    mixed = mixed_groups(groups, labels)
    group_rows = list(mixed.values())
    report = {
        "n_rows": len(labels), "n_groups": len(set(groups)), "n_mixed_groups": len(group_rows),
        "n_mixed_rows": sum(len(r) for r in group_rows),
        "positive_rate": sum(labels) / len(labels) if labels else 0.0,
        "bootstrap": n_boot, "seed": seed, "baseline": baseline, "scores": {},
    }
    statistics = {}
    for name, scores in columns.items():
        per_group = [roc_auc([scores[i] for i in idx], [labels[i] for i in idx]) for idx in group_rows]

        def pooled(picked, s=scores):
            return pooled_auc(s, labels, [group_rows[g] for g in picked])

        def within(picked, per_group=per_group):  # per-group AUCs are computed once
            return _mean([per_group[g] for g in picked])

        statistics[name] = (pooled, within)
    everything = range(len(group_rows))
    for name, (pooled, within) in statistics.items():
        entry = {
            "auc": pooled(everything), "auc_ci": bootstrap_ci(pooled, len(group_rows), n_boot, seed),
            "mean_group_auc": within(everything),
            "mean_group_auc_ci": bootstrap_ci(within, len(group_rows), n_boot, seed),
        }
        if baseline is not None and name != baseline:
            base_pooled, base_within = statistics[baseline]
            for key, mine, base in (("auc", pooled, base_pooled), ("mean_group_auc", within, base_within)):
                diff = _difference(mine, base)
                entry[f"{key}_diff"] = diff(everything)
                entry[f"{key}_diff_ci"] = bootstrap_ci(diff, len(group_rows), n_boot, seed)
        report["scores"][name] = entry
    return report


def report_markdown(report: dict, labels: dict[str, str] | None = None) -> str:
    """The report as a Markdown table, one row per score (`labels`: display names)."""
    labels = labels or {}

    def fmt(x, signed=False):
        return "n/a" if x is None else (f"{x:+.3f}" if signed else f"{x:.3f}")

    def ci(c, signed=False):
        return "n/a" if c is None else f"[{fmt(c[0], signed)}, {fmt(c[1], signed)}]"

    base = report.get("baseline")
    lines = [f"Rows {report['n_rows']}, groups {report['n_groups']}; mixed-correctness groups "
             f"{report['n_mixed_groups']} ({report['n_mixed_rows']} rows). "
             f"95% CIs from {report['bootstrap']} bootstrap resamples of groups"
             + (f"; differences are paired (the same resamples) against `{base}`." if base else "."), ""]
    head = "| score | pooled AUC | 95% CI | mean within-group AUC | 95% CI |"
    rule = "|---|---|---|---|---|"
    if base:
        head += f" pooled - {base} | 95% CI | within - {base} | 95% CI |"
        rule += "---|---|---|---|"
    lines += [head, rule]
    for name, s in report["scores"].items():
        line = (f"| {labels.get(name, name)} | {fmt(s['auc'])} | {ci(s['auc_ci'])} | "
                f"{fmt(s['mean_group_auc'])} | {ci(s['mean_group_auc_ci'])} |")
        if base:
            line += (f" {fmt(s.get('auc_diff'), True)} | {ci(s.get('auc_diff_ci'), True)} | "
                     f"{fmt(s.get('mean_group_auc_diff'), True)} | {ci(s.get('mean_group_auc_diff_ci'), True)} |")
        lines.append(line)
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- labeled rows

def read_labeled(path: str | Path, template: str = "plain") -> list[dict]:
    """Validated rows {messages, response, reference, correct, group, ...}; one-line DataError."""
    from rlpr.data.loading import iter_jsonl
    from rlpr.evaluation.score_file import check_response_and_reference, messages_of

    rows = []
    for where, row in iter_jsonl(path):
        messages = messages_of(row, where, template)
        check_response_and_reference(row, where)
        if not isinstance(row.get("correct"), bool):
            raise DataError(f"{where}: field 'correct' must be true or false")
        group = row.get("group")
        group = json.dumps(messages) if group is None else json.dumps(group)  # hashable id
        rows.append({**row, "messages": messages, "group_id": group})
    if not rows:
        raise DataError(f"{path}: no rows")
    return rows


# --------------------------------------------------------------------------- the reward variants

@dataclass
class ScoredRows:
    """One pass of the model over a labeled file: what every reward variant is computed from."""

    reward: object  # the configured rlpr.reward.probability_reward.ProbabilityReward
    responses: list[str]
    items: list  # score B's texts (ScoredText, or None: the response has no o')
    b_logps: list  # per row, the log-probs of the scored tokens of o' (reward.score_span; None: unscored)
    a_logps: list  # per row, the log-probs of y*'s tokens after the prompt alone (score A's text)
    block_logps: list  # per row, the log-probs of the whole answer block of o' (VeriFree's span)
    verdicts: list[bool]  # the rule grader's verdicts
    groups: list  # group ids
    answers: list[list[str]]  # per row, the reference and then its acceptable forms


def _aggregated(logps: list, how: str) -> list[float | None]:
    from rlpr.reward.scoring import aggregate

    return [None if lp is None else aggregate(lp, how) for lp in logps]


def _group_aggregated(s: ScoredRows, how: str) -> list[float | None]:
    """A group-level aggregation (r3) of B within the file's groups (None: unscored)."""
    from rlpr.reward.scoring import GROUP_AGGREGATIONS

    scores = GROUP_AGGREGATIONS[how](s.b_logps, s.reward.reference_keys(s.items), s.groups)
    return [v if v is not None and math.isfinite(v) else None for v in scores]


def configured_reward(s: ScoredRows) -> list[float]:
    """The reward `rlpr train` gives with these reward.* settings (ProbabilityReward.__call__ with
    the rule verdicts and the file's groups), from the log-probs already computed."""
    reward, cfg = s.reward, s.reward.cfg
    if reward.kind.group_transform is not None:
        return [o.reward for o in reward.rank_outputs(s.responses, s.items, s.b_logps, s.groups, s.verdicts)]
    from rlpr.reward.scoring import GROUP_AGGREGATIONS

    n = len(s.responses)
    scored = reward.kind.needs_score_b
    by_group = cfg.aggregation in GROUP_AGGREGATIONS  # r3 (needs debias=false)
    b = [0.0] * n
    if scored:
        b = _group_aggregated(s, cfg.aggregation) if by_group else _aggregated(s.b_logps, cfg.aggregation)
        b = [v or 0.0 for v in b]
    a = [v or 0.0 for v in _aggregated(s.a_logps, cfg.aggregation)] if scored and cfg.debias else [0.0] * n
    verified = reward.verify(s.responses, [y[0] for y in s.answers], [y[1:] for y in s.answers],
                             s.verdicts)  # reward.verifier's verdicts (oracle: the rule verdicts)
    return [reward.combine(r, it is not None and not it.fallback, it is not None and it.fallback, b[i], a[i],
                           s.verdicts[i], verified=verified[i]).reward
            for i, (r, it) in enumerate(zip(s.responses, s.items))]


def score_b(how: str) -> Callable[[ScoredRows], list[float | None]]:
    def column(s: ScoredRows):
        return _aggregated(s.b_logps, how)
    return column


def group_score_b(how: str) -> Callable[[ScoredRows], list[float | None]]:
    def column(s: ScoredRows):
        return _group_aggregated(s, how)
    return column


def debiased(how: str) -> Callable[[ScoredRows], list[float | None]]:
    def column(s: ScoredRows):
        return [None if b is None else b - a
                for b, a in zip(_aggregated(s.b_logps, how), _aggregated(s.a_logps, how))]
    return column


def nover_outputs(s: ScoredRows, efficiency_weight: float = 0.0) -> list:
    """NOVER's per-row outputs (rlpr/reward/nover.py) from B's log-probs, ranked within the file's groups."""
    from rlpr.reward.probability_reward import ProbabilityReward

    cfg = dataclasses.replace(s.reward.cfg, kind="nover", debias=False, efficiency_weight=efficiency_weight)
    nover = ProbabilityReward(cfg, s.reward.tokenizer, s.reward.temperature, s.reward.max_length)
    return nover.rank_outputs(s.responses, s.items, s.b_logps, s.groups, s.verdicts)


@dataclass(frozen=True)
class Variant:
    label: str
    column: Callable[[ScoredRows], list[float | None]]  # a score per row; None: unscored (ranks lowest)


def _variants() -> dict[str, Variant]:
    from rlpr.reward.scoring import AGGREGATIONS, GROUP_AGGREGATIONS

    # "reward": shaping(B - A) + alpha * format under the defaults; B, B - A: one aggregation of y*'s
    # token log-probs (the group-level ones, r3, have no B - A); VeriFree: p(answer block | x, z);
    # NOVER: the rank of P within the group (0 off-format), with its efficiency term (weight 1, as
    # the reference code), and -P itself (off-format: unscored)
    variants = {"reward": Variant("configured reward (default: RLPR)", configured_reward)}
    for how in AGGREGATIONS:
        variants[f"B:{how}"] = Variant(f"B, {how}", score_b(how))
    for how in GROUP_AGGREGATIONS:
        variants[f"B:{how}"] = Variant(f"B, {how} (within the group)", group_score_b(how))
    for how in AGGREGATIONS:
        variants[f"B-A:{how}"] = Variant(f"B - A, {how}", debiased(how))
    variants["verifree"] = Variant("VeriFree p(answer block)",
                                   lambda s: _aggregated(s.block_logps, "seq_likelihood"))
    variants["nover:rank"] = Variant("NOVER rank R_r",
                                     lambda s: [o.delta for o in nover_outputs(s)])
    variants["nover:rank+efficiency"] = Variant("NOVER R_r + R_e (efficiency)",
                                                lambda s: [o.delta for o in nover_outputs(s, 1.0)])
    variants["nover:-perplexity"] = Variant("NOVER -P (perplexity)",
                                            lambda s: [None if o.perplexity is None else -o.perplexity
                                                       for o in nover_outputs(s)])
    variants["verifier"] = Variant("rule verifier", lambda s: [float(v) for v in s.verdicts])
    return variants


# The reward variants `rlpr reward-quality` compares, one row each: name -> label and column.
VARIANTS: dict[str, Variant] = _variants()


def _group_chunks(groups: list, size: int) -> list[list[int]]:
    """Row indices in chunks of whole groups (in order of first appearance), about `size` rows each:
    a group's texts then share one scoring call, as in training, so equal texts score equally."""
    members: dict = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    chunks, current = [], []
    for idx in members.values():
        current += idx
        if len(current) >= size:
            chunks.append(current)
            current = []
    return chunks + ([current] if current else [])


def score_rows(model, tokenizer, rows: list[dict], reward_cfg: RewardConfig | None = None, batch_rows: int = 64,
               advance=lambda n=1: None) -> ScoredRows:
    """One pass of `model` over `read_labeled` rows with the reward settings `reward_cfg` (default:
    the documented defaults): the log-probs of B's scored tokens, of the answer block (VeriFree's
    span; a second forward over o' unless reward.score_span is block), of A's, and the rule verdicts."""
    from rlpr.grading import grade, grader_for
    from rlpr.reward.probability_reward import ProbabilityReward

    reward = ProbabilityReward(reward_cfg or RewardConfig(), tokenizer,
                               max_length=getattr(model.config, "max_position_embeddings", None))
    prompts = [chat_text(tokenizer, r["messages"]) for r in rows]
    responses = [r["response"] for r in rows]
    references = [r["reference"].strip() for r in rows]
    items = [reward.score_b_text(p, resp, ref) for p, resp, ref in zip(prompts, responses, references)]
    block = ProbabilityReward(dataclasses.replace(reward.cfg, score_span="block"), tokenizer,
                              max_length=reward.max_length)
    blocks = [block.score_b_text(p, resp, ref) for p, resp, ref in zip(prompts, responses, references)]
    b_logps: list = [None] * len(rows)
    block_logps: list = [None] * len(rows)
    for chunk in _group_chunks([r["group_id"] for r in rows], batch_rows):  # a group's rows in one forward
        for i, lp in zip(chunk, reward.reference_logprobs(model, [items[i] for i in chunk])):
            b_logps[i] = lp
        if reward.cfg.score_span != "block":  # VeriFree's span, unless B already scores it
            for i, lp in zip(chunk, block.reference_logprobs(model, [blocks[i] for i in chunk])):
                block_logps[i] = lp
        advance(len(chunk))
    if reward.cfg.score_span == "block":
        block_logps = b_logps
    # A once per (prompt, reference, cue): the plain form for format-valid and unscored rows
    a_texts: dict = {}
    for p, y, it in zip(prompts, references, items):
        a_texts.setdefault(reward.score_a.key(p, y, it is not None and it.fallback),
                           reward.score_a_text(p, y, it is not None and it.fallback))
    a_by_key = dict(zip(a_texts, reward.reference_logprobs(model, list(a_texts.values()))))
    a_logps = [a_by_key[reward.score_a.key(p, y, it is not None and it.fallback)]
               for p, y, it in zip(prompts, references, items)]
    verdicts = []
    for r in rows:
        name = grader_for(str(r.get("data_source") or ""), str(r.get("ability") or ""), bool(r.get("choices")))
        verdicts.append(grade(name, r["response"], r["reference"], choices=r.get("choices") or None,
                              acceptable=r.get("acceptable") or None).correct)
    return ScoredRows(reward, responses, items, b_logps, a_logps, block_logps, verdicts,
                      [r["group_id"] for r in rows],
                      [[y, *(r.get("acceptable") or [])] for y, r in zip(references, rows)])


def variant_columns(scored: ScoredRows) -> dict[str, list[float | None]]:
    """Every variant's column (None: unscored)."""
    return {name: v.column(scored) for name, v in VARIANTS.items()}


def _ranked(column: list[float | None]) -> list[float]:
    """A column for the AUC: an unscored row ranks below every scored one."""
    return [-math.inf if v is None else v for v in column]


def reward_quality(model, tokenizer, rows: list[dict], output_dir: str | Path, *,
                   reward_cfg: RewardConfig | None = None, n_boot: int = 1000, seed: int = 0, source: str = "",
                   progress: bool | None = None) -> dict:
    """Score `read_labeled` rows with every reward variant (`VARIANTS`; the configured one from
    `reward_cfg`, the config's `reward.*`, default the documented defaults); write
    reward_quality.json, reward_quality.md and scores.jsonl (a column per variant, null: unscored)."""
    from rlpr.reward.parsing import format_reward
    from rlpr.train.progress import progress_bar

    reward_cfg = reward_cfg or RewardConfig()
    with progress_bar(len(rows), "scoring", progress) as advance:
        scored = score_rows(model, tokenizer, rows, reward_cfg, advance=advance)
    columns = variant_columns(scored)
    labels = [r["correct"] for r in rows]
    report = auc_report({name: _ranked(c) for name, c in columns.items()}, labels, scored.groups,
                        n_boot=n_boot, seed=seed, baseline="reward")
    report.update({"input": source, "fallback": reward_cfg.invalid_fallback,
                   "reward": dataclasses.asdict(reward_cfg),
                   "labels": {name: v.label for name, v in VARIANTS.items()},
                   "labels_are_rule_verdicts": labels == scored.verdicts})
    if report["n_mixed_groups"] == 0:
        log.warning("no group has both correct and wrong responses: every AUC is undefined")
    extras = {"score_a": [v or 0.0 for v in _aggregated(scored.a_logps, reward_cfg.aggregation)],
              "format": [format_reward(r, reward_cfg.format_mode) for r in scored.responses]}
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "reward_quality.json", json.dumps(json_safe(report), indent=2, allow_nan=False) + "\n")
    note = ("\nThe labels are the rule verifier's verdicts (a file built with --build-from), so its AUC is 1 "
            "by construction.\n" if report["labels_are_rule_verdicts"] else "")
    write_atomic(out / "reward_quality.md", report_markdown(report, report["labels"]) + note)
    lines = []
    for i, r in enumerate(rows):
        record = {k: v for k, v in r.items() if k not in ("messages", "group_id")}
        record.update({name: values[i] for name, values in {**columns, **extras}.items()})
        lines.append(json_line(record, ensure_ascii=False))
    write_atomic(out / "scores.jsonl", "".join(lines))
    return report


# --------------------------------------------------------------------------- building a labeled file

def build_examples(data_file: str | Path, limit: int = 0) -> list:
    """The questions of a --build-from data file (the first `limit`; 0: all). Their ids become the
    labeled file's groups, so two questions sharing an id are refused with one line naming it
    (issue 29: they used to merge into one group, pooling two questions' responses). Refusing,
    rather than renaming, keeps each group's id the id in the user's data."""
    from rlpr.data.loading import load_examples

    examples = load_examples(data_file)
    if limit:
        examples = examples[:limit]
    first: dict[str, int] = {}
    for i, e in enumerate(examples):
        if e.uid in first:
            raise DataError(f"{data_file}: rows {first[e.uid] + 1} and {i + 1} share the id {e.uid!r}; "
                            f"ids must be unique (they name the groups of the labeled file)")
        first[e.uid] = i
    return examples


def build_labeled(engine, tokenizer, data_file, output: str | Path, *, samples: int,
                  rollout: RolloutConfig | None = None, limit: int = 0, seed: int = 0,
                  progress: bool | None = None) -> int:
    """Sample `samples` responses per question with the rollout settings (max_new_tokens,
    temperature, top_p, batch_sequences; default: the documented defaults) and label them with
    the rule graders; returns rows. `data_file`: a data file (read by `build_examples`, with
    `limit`) or the examples it already gave.

    The labels are the rule verdicts, so the rule verifier's AUC on such a file is 1 by
    construction; relabel (by hand or a judge) to measure the verifier itself.
    """
    from rlpr.evaluation.benchmark import sample_and_grade
    from rlpr.train.progress import progress_bar

    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    rollout = rollout or RolloutConfig()
    examples = data_file if isinstance(data_file, list) else build_examples(data_file, limit)
    with progress_bar(len(examples), "sampling", progress) as advance:
        groups = sample_and_grade(engine, tokenizer, examples, samples, max_new_tokens=rollout.max_new_tokens,
                                  temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                                  questions_per_call=max(1, rollout.batch_sequences // samples),
                                  advance=advance)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for e, group in zip(examples, groups):
        for s in group:
            row = {"prompt": e.prompt, "response": s.response, "reference": e.reference,
                   "correct": s.correct, "group": e.uid, "data_source": e.data_source,
                   "ability": e.ability, "extracted": s.extracted}
            if e.choices:
                row["choices"] = e.choices
            if e.acceptable:
                row["acceptable"] = e.acceptable
            lines.append(json_line(row, ensure_ascii=False))
    write_atomic(out, "".join(lines))
    return len(lines)
