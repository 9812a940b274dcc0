"""`rlpr reward-quality`: how well each reward separates correct from wrong responses (ROC-AUC).

The paper's protocol: keep only groups (prompts) whose responses have mixed correctness, pool
their rows and compute one ROC-AUC per score; we also report the mean within-group AUC, which
ignores how scores compare across prompts (where debiasing matters). Confidence intervals come
from a bootstrap over groups, since rows of one prompt are not independent.

The statistics (AUC with ties, group filtering, bootstrap) are pure functions of lists.
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections import defaultdict
from pathlib import Path

from rlpr.config import RewardConfig, RolloutConfig
from rlpr.errors import DataError

log = logging.getLogger(__name__)

SCORES = ("reward", "debiased", "score_b", "seq_likelihood", "rule")
ROW_EXTRAS = ("score_a", "format")  # written per row, not ranked
SCORE_LABELS = {
    "reward": "RLPR reward (shaped B - A + format)",
    "debiased": "debiased probability B - A",
    "score_b": "mean token probability B",
    "seq_likelihood": "sequence likelihood",
    "rule": "rule-based verifier",
}


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


def auc_report(columns: dict[str, list[float]], labels: list[bool], groups: list, *,
               n_boot: int = 1000, seed: int = 0) -> dict:
    """AUCs of every score column over the mixed-correctness groups, with bootstrap CIs."""
    mixed = mixed_groups(groups, labels)
    group_rows = list(mixed.values())
    report = {
        "n_rows": len(labels), "n_groups": len(set(groups)), "n_mixed_groups": len(group_rows),
        "n_mixed_rows": sum(len(r) for r in group_rows),
        "positive_rate": sum(labels) / len(labels) if labels else 0.0,
        "bootstrap": n_boot, "seed": seed, "scores": {},
    }
    for name, scores in columns.items():
        per_group = [roc_auc([scores[i] for i in idx], [labels[i] for i in idx]) for idx in group_rows]

        def pooled(picked, s=scores):
            return pooled_auc(s, labels, [group_rows[g] for g in picked])

        def within(picked, per_group=per_group):  # per-group AUCs are computed once
            return _mean([per_group[g] for g in picked])

        everything = range(len(group_rows))
        report["scores"][name] = {
            "auc": pooled(everything), "auc_ci": bootstrap_ci(pooled, len(group_rows), n_boot, seed),
            "mean_group_auc": within(everything),
            "mean_group_auc_ci": bootstrap_ci(within, len(group_rows), n_boot, seed),
        }
    return report


def report_markdown(report: dict) -> str:
    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}"

    def ci(c):
        return "n/a" if c is None else f"[{c[0]:.3f}, {c[1]:.3f}]"

    lines = [f"Rows {report['n_rows']}, groups {report['n_groups']}; mixed-correctness groups "
             f"{report['n_mixed_groups']} ({report['n_mixed_rows']} rows). "
             f"95% CIs from {report['bootstrap']} bootstrap resamples of groups.", "",
             "| score | pooled AUC | 95% CI | mean within-group AUC | 95% CI |", "|---|---|---|---|---|"]
    for name, s in report["scores"].items():
        lines.append(f"| {SCORE_LABELS.get(name, name)} | {fmt(s['auc'])} | {ci(s['auc_ci'])} | "
                     f"{fmt(s['mean_group_auc'])} | {ci(s['mean_group_auc_ci'])} |")
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


def score_rows(model, tokenizer, rows: list[dict], reward_cfg: RewardConfig | None = None, batch_rows: int = 32,
               advance=lambda n=1: None) -> dict[str, list[float]]:
    """Every score column (and the extras) for every row, in row order, with the reward settings
    `reward_cfg` (default: the documented defaults)."""
    from rlpr.evaluation.graders import grade, grader_for
    from rlpr.reward.probability_reward import ProbabilityReward
    from rlpr.reward.scoring import score_texts

    reward = ProbabilityReward(reward_cfg or RewardConfig(), tokenizer,
                               max_length=getattr(model.config, "max_position_embeddings", None))
    columns: dict[str, list[float]] = {name: [] for name in (*SCORES, *ROW_EXTRAS)}
    for start in range(0, len(rows), batch_rows):
        batch = rows[start:start + batch_rows]
        prompts = [tokenizer.apply_chat_template(r["messages"], tokenize=False, add_generation_prompt=True)
                   for r in batch]
        responses = [r["response"] for r in batch]
        references = [r["reference"].strip() for r in batch]
        outputs = reward(model, prompts, responses, references)
        items = [reward.score_b_text(p, resp, ref) for p, resp, ref in zip(prompts, responses, references)]
        likelihoods = score_texts(model, tokenizer, items, aggregation="seq_likelihood",
                                  max_length=reward.max_length, max_batch_tokens=reward.cfg.max_batch_tokens)
        for r, o, lik in zip(batch, outputs, likelihoods):
            name = grader_for(str(r.get("data_source") or ""), str(r.get("ability") or ""),
                              bool(r.get("choices")))
            verdict = grade(name, r["response"], r["reference"], choices=r.get("choices") or None,
                            acceptable=r.get("acceptable") or None)
            columns["reward"].append(o.reward)
            columns["debiased"].append(o.score_b - o.score_a)
            columns["score_b"].append(o.score_b)
            columns["seq_likelihood"].append(lik)
            columns["rule"].append(float(verdict.correct))
            columns["score_a"].append(o.score_a)
            columns["format"].append(o.format)
        advance(len(batch))
    return columns


def reward_quality(model, tokenizer, rows: list[dict], output_dir: str | Path, *,
                   reward_cfg: RewardConfig | None = None, n_boot: int = 1000, seed: int = 0, source: str = "",
                   progress: bool | None = None) -> dict:
    """Score `read_labeled` rows with the reward settings `reward_cfg` (the config's `reward.*`;
    default: the documented defaults); write reward_quality.json, reward_quality.md and scores.jsonl."""
    from rlpr.train.progress import progress_bar

    reward_cfg = reward_cfg or RewardConfig()
    fallback = reward_cfg.invalid_fallback
    with progress_bar(len(rows), "scoring", progress) as advance:
        columns = score_rows(model, tokenizer, rows, reward_cfg, advance=advance)
    labels = [r["correct"] for r in rows]
    report = auc_report({name: columns[name] for name in SCORES}, labels, [r["group_id"] for r in rows],
                        n_boot=n_boot, seed=seed)
    report.update({"input": source, "fallback": fallback})
    if report["n_mixed_groups"] == 0:
        log.warning("no group has both correct and wrong responses: every AUC is undefined")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "reward_quality.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (out / "reward_quality.md").write_text(report_markdown(report), encoding="utf-8")
    with open(out / "scores.jsonl", "w", encoding="utf-8") as f:
        for i, r in enumerate(rows):
            record = {k: v for k, v in r.items() if k not in ("messages", "group_id")}
            record.update({name: values[i] for name, values in columns.items()})
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return report


# --------------------------------------------------------------------------- building a labeled file

def build_labeled(engine, tokenizer, data_file: str | Path, output: str | Path, *, samples: int,
                  rollout: RolloutConfig | None = None, limit: int = 0, seed: int = 0,
                  progress: bool | None = None) -> int:
    """Sample `samples` responses per question with the rollout settings (max_new_tokens,
    temperature, top_p, batch_sequences; default: the documented defaults) and label them with
    the rule graders; returns rows.

    The labels are the rule verdicts, so the rule verifier's AUC on such a file is 1 by
    construction; relabel (by hand or a judge) to measure the verifier itself.
    """
    from rlpr.data.loading import load_examples
    from rlpr.evaluation.benchmark import sample_and_grade
    from rlpr.train.progress import progress_bar

    if samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    rollout = rollout or RolloutConfig()
    examples = load_examples(data_file)
    if limit:
        examples = examples[:limit]
    with progress_bar(len(examples), "sampling", progress) as advance:
        groups = sample_and_grade(engine, tokenizer, examples, samples, max_new_tokens=rollout.max_new_tokens,
                                  temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                                  questions_per_call=max(1, rollout.batch_sequences // samples),
                                  advance=advance)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with open(out, "w", encoding="utf-8") as f:
        for e, group in zip(examples, groups):
            for s in group:
                row = {"prompt": e.prompt, "response": s.response, "reference": e.reference,
                       "correct": s.correct, "group": e.uid, "data_source": e.data_source,
                       "ability": e.ability, "extracted": s.extracted}
                if e.choices:
                    row["choices"] = e.choices
                if e.acceptable:
                    row["acceptable"] = e.acceptable
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
                n += 1
    return n
