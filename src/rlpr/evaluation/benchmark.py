"""`rlpr eval`: Avg@k accuracy of a policy on benchmark files (spec section 7).

The arithmetic (Avg@k, the General/All means, the markdown table) is pure and separate from the
sampling and the file I/O, so it can be tested without a model. Rule graders run in the main
thread (math-verify's timeouts only work there); only the optional judge runs concurrently.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlpr.config import RolloutConfig
from rlpr.config.ranges import temperature_problem
from rlpr.seeding import SEED_MIX
from rlpr.data.prompts import chat_text
from rlpr.data.records import Example
from rlpr.errors import json_line, json_safe, write_atomic
from rlpr.evaluation.metrics import avg_at_k
from rlpr.grading import grade_example, grader_for, question_text
from rlpr.reward.parsing import format_reward
from rlpr.train.progress import progress_bar

log = logging.getLogger(__name__)

# The paper's benchmarks, keyed by a lowercase alphanumeric fragment of the file name.
GENERAL_BENCHMARKS = ("mmlupro", "gpqa", "theoremqa", "webinstruct")
MATH_BENCHMARKS = ("math500", "minerva", "aime")
PAPER_BENCHMARKS = GENERAL_BENCHMARKS + MATH_BENCHMARKS
_AVG_SUFFIX = re.compile(r"_avg(\d+)$", re.IGNORECASE)


# --------------------------------------------------------------------------- pure arithmetic

def samples_from_name(path: str | Path) -> int | None:
    """k from an `_AvgK` file-name suffix (`aime24_Avg16.parquet` -> 16), else None."""
    m = _AVG_SUFFIX.search(Path(path).stem)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else None


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def matching_benchmarks(names: list[str], keys: tuple[str, ...]) -> list[str]:
    """The benchmark names that contain one of `keys` (case and punctuation ignored)."""
    return [n for n in names if any(k in _key(n) for k in keys)]


def summary_means(accuracies: dict[str, float]) -> dict[str, dict]:
    """"general" (the paper's four general benchmarks) and "all" (its seven): the mean accuracy
    over those present, with the benchmarks used; a key is absent when none is present."""
    out = {}
    for label, keys in (("general", GENERAL_BENCHMARKS), ("all", PAPER_BENCHMARKS)):
        names = matching_benchmarks(list(accuracies), keys)
        if names:
            present = {k for k in keys if any(k in _key(n) for n in names)}
            out[label] = {"accuracy": sum(accuracies[n] for n in names) / len(names),
                          "benchmarks": names, "complete": len(present) == len(keys)}
    return out


def results_table(results: dict) -> str:
    """Markdown table of a results.json dictionary."""
    lines = ["| benchmark | Avg@k | accuracy (%) | questions | format valid | mean tokens | judge calls "
             "| judge failed |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        if name in ("general", "all"):
            continue
        lines.append(f"| {name} | Avg@{r['samples_per_question']} | {100 * r['accuracy']:.1f} | "
                     f"{r['n_questions']} | {100 * r['format_valid_rate']:.1f}% | "
                     f"{r['mean_response_tokens']:.1f} | {r['judge_calls']} | {r['judge_failed']} |")
    for label in ("general", "all"):
        if label in results:
            r = results[label]
            note = "" if r["complete"] else " (partial)"
            lines.append(f"| **{label.title()}**{note} | | {100 * r['accuracy']:.1f} | "
                         f"{len(r['benchmarks'])} benchmarks | | | | |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- sampling and grading

@dataclass
class Sample:
    """One graded response; `correct` is the final verdict (rule OR judge)."""

    uid: str
    sample: int
    response: str
    extracted: str | None
    rule_correct: bool
    correct: bool
    judged: bool = False
    judge_verdict: bool | None = None  # None: not asked, or the judgment failed
    n_tokens: int = 0
    finished: bool = True
    format_valid: bool = False
    extra: dict = field(default_factory=dict)
    reference: str = ""  # the reference answer the response was graded against
    grader: str = ""  # multiple_choice | math | short_answer
    rule: str = ""  # the grader's rule that decided (graders.Grade.rule), e.g. "answer_tag:symbolic"

    def to_dict(self, benchmark: str) -> dict:
        d = asdict(self)
        d.pop("extra")
        head = {k: d.pop(k) for k in ("uid", "sample", "reference", "response", "extracted",
                                      "grader", "rule")}
        return {"benchmark": benchmark, **head, **d}


def graded_sample(example: Example, text: str, index: int, *, n_tokens: int = 0,
                  finished: bool = True) -> Sample:
    """One response graded by the rule grader of its example, with the reference, the answer the
    grader read and the rule that decided."""
    g = grade_example(example, text)
    grader = grader_for(example.data_source, example.ability, bool(example.choices))
    return Sample(uid=example.uid, sample=index, response=text, extracted=g.extracted,
                  rule_correct=g.correct, correct=g.correct, n_tokens=n_tokens, finished=finished,
                  format_valid=format_reward(text, "r1") == 1.0, reference=example.reference,
                  grader=grader, rule=g.rule)


def prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of chat messages under the model's chat template, ready for the assistant turn."""
    text = chat_text(tokenizer, messages)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def sample_and_grade(engine, tokenizer, examples: list[Example], k: int, *, max_new_tokens: int,
                     temperature: float, top_p: float, seed: int, questions_per_call: int,
                     advance=lambda n=1: None) -> list[list[Sample]]:
    """k graded samples per example (rule graders only), generated a few questions at a time so
    the progress bar moves and memory stays bounded."""
    out: list[list[Sample]] = []
    for start in range(0, len(examples), questions_per_call):
        chunk = examples[start:start + questions_per_call]
        rollouts = engine.generate([prompt_ids(tokenizer, e.prompt) for e in chunk], k,
                                   max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                                   seeds=[seed * SEED_MIX + start + q for q in range(len(chunk))],
                                   min_new_tokens=0)  # rollout.min_new_tokens is for training rollouts
        groups: list[list[Sample]] = [[] for _ in chunk]
        for r in rollouts:
            groups[r.prompt_index].append(graded_sample(
                chunk[r.prompt_index], r.text, len(groups[r.prompt_index]),
                n_tokens=len(r.token_ids), finished=r.finished))
        out.extend(groups)
        advance(len(chunk))
    return out


def apply_judge(judge, examples: list[Example], groups: list[list[Sample]]) -> None:
    """Ask the judge about every rule-wrong sample; it can only turn wrong into right, and a
    failed judgment keeps the rule verdict."""
    todo = [(e, s) for e, g in zip(examples, groups) for s in g if not s.rule_correct]
    if not todo:
        return
    verdicts = judge.judge_many([(question_text(e), s.response, e.reference) for e, s in todo])
    for (_, s), v in zip(todo, verdicts):
        s.judged, s.judge_verdict = True, v
        s.correct = s.rule_correct or bool(v)


def benchmark_result(groups: list[list[Sample]]) -> dict:
    """The per-benchmark entry of results.json."""
    flat = [s for g in groups for s in g]
    n = max(len(flat), 1)
    return {
        "accuracy": avg_at_k([[s.correct for s in g] for g in groups]),
        "rule_accuracy": avg_at_k([[s.rule_correct for s in g] for g in groups]),
        "n_questions": len(groups),
        "samples_per_question": max((len(g) for g in groups), default=0),
        "format_valid_rate": sum(s.format_valid for s in flat) / n,
        "mean_response_tokens": sum(s.n_tokens for s in flat) / n,
        "truncated_rate": sum(not s.finished for s in flat) / n,
        "judge_calls": sum(s.judged for s in flat),
        "judge_failed": sum(s.judged and s.judge_verdict is None for s in flat),
        "judge_flipped": sum(s.correct and not s.rule_correct for s in flat),
    }


# --------------------------------------------------------------------------- the command

def check_rollout(rollout: RolloutConfig) -> None:
    """The sampling settings eval reads, with the flags' own messages (before the config's ranges,
    which add NaN; temperature 0 is greedy decoding here)."""
    if rollout.max_new_tokens < 1:
        raise ValueError(f"--max-new-tokens must be at least 1, got {rollout.max_new_tokens} "
                         "(rollout.max_new_tokens)")
    if rollout.temperature < 0:
        raise ValueError("--temperature must be >= 0 (0: greedy decoding; rollout.temperature)")
    problem = temperature_problem(rollout.temperature, "greedy decoding")
    if problem:
        raise ValueError(f"--temperature {problem} (rollout.temperature)")
    if not 0 < rollout.top_p <= 1:
        raise ValueError("--top-p must be in (0, 1] (rollout.top_p)")
    if rollout.batch_sequences < 1:
        raise ValueError("--batch-sequences must be at least 1 (rollout.batch_sequences)")


@dataclass
class Benchmark:
    name: str  # the file stem
    examples: list[Example]
    k: int  # samples per question


# What one response costs in memory until results.json and samples.jsonl are written: per token its
# id in a list, its text and its share of the samples line; per response its Rollout and Sample
RESPONSE_BYTES, TOKEN_BYTES = 2048, 48


def check_fits(benchmarks: list[Benchmark], max_new_tokens: int, available: int | None = None) -> None:
    """One line, before any model work, when the responses an evaluation keeps (every question's
    samples, each up to `max_new_tokens` tokens) would need more than half of the memory available
    (`--samples 1000000000` used to end in an out-of-memory kill, or a MemoryError traceback)."""
    from rlpr.model.memory import available_memory

    responses = sum(len(b.examples) * b.k for b in benchmarks)
    need = responses * (RESPONSE_BYTES + max_new_tokens * TOKEN_BYTES)
    available = available_memory() if available is None else available
    if need > available / 2:
        k = max(b.k for b in benchmarks)
        raise ValueError(f"--samples {k}: {sum(len(b.examples) for b in benchmarks)} questions x up to {k} samples "
                         f"of up to {max_new_tokens} tokens would keep about {need / 2**30:.1f} GiB of responses in "
                         f"memory, more than half of the {available / 2**30:.1f} GiB available; lower --samples, "
                         f"--limit or --max-new-tokens")


def load_benchmarks(files: list[str | Path], samples: int | None = None, limit: int = 0,
                    template: str = "r1", default_samples: int | None = None) -> list[Benchmark]:
    """Read and validate every file (before any model work, so a bad file fails at once).
    `samples` per question (None: K of an _AvgK file-name suffix, else `default_samples`, a run's
    own held-out count, else 1); `limit`: at most this many questions per file (0: all); `template`:
    the prompt of flat rows (`data.template`, as `rlpr train` builds them; verl rows keep their own
    messages)."""
    from rlpr.data.loading import load_examples
    from rlpr.data.sources import parse_source

    if samples is not None and samples < 1:
        raise ValueError(f"--samples must be at least 1, got {samples}")
    if limit < 0:
        raise ValueError("--limit must be >= 0")
    out = []
    for path in files:
        examples = load_examples(path, template=template)
        if limit:
            examples = examples[:limit]
        source = parse_source(path)  # a folder's split is part of the name: "my_data:test"
        k = samples or samples_from_name(source.stem) or default_samples or 1
        out.append(Benchmark(source.name, examples, k))
    names = [b.name for b in out]
    if len(set(names)) != len(names):
        raise ValueError(f"two data files share a benchmark name (file stem): {', '.join(names)}")
    return out


def evaluate_files(engine, tokenizer, files: list[str | Path], output_dir: str | Path,
                   rollout: RolloutConfig, judge=None, *, samples: int | None = None, limit: int = 0,
                   seed: int = 0, progress: bool | None = None) -> dict:
    """Evaluate every file; see `load_benchmarks` and `evaluate`."""
    check_rollout(rollout)
    return evaluate(engine, tokenizer, load_benchmarks(files, samples, limit), output_dir, rollout, judge,
                    seed=seed, progress=progress)


def evaluate(engine, tokenizer, benchmarks: list[Benchmark], output_dir: str | Path,
             rollout: RolloutConfig, judge=None, *, seed: int = 0, progress: bool | None = None) -> dict:
    """Sample with the rollout settings (max_new_tokens, temperature, top_p, batch_sequences),
    grade (and judge); write results.json, results.md and samples.jsonl into `output_dir`."""
    check_fits(benchmarks, rollout.max_new_tokens)
    too_long = skip_too_long(benchmarks, tokenizer, context_of(engine))
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {}
    lines: list[str] = []
    total = sum(len(b.examples) for b in benchmarks)
    with progress_bar(total, "evaluating", progress) as advance:
        for b in benchmarks:
            name, examples, k = b.name, b.examples, b.k
            groups = sample_and_grade(
                engine, tokenizer, examples, k, max_new_tokens=rollout.max_new_tokens,
                temperature=rollout.temperature, top_p=rollout.top_p, seed=seed,
                questions_per_call=max(1, rollout.batch_sequences // k), advance=advance)
            if judge is not None:
                apply_judge(judge, examples, groups)
            results[name] = {**benchmark_result(groups), "skipped_too_long": too_long.get(name, 0)}
            if results[name]["judge_failed"]:
                log.warning("%s: %d of %d judgments failed; those keep the rule verdict", name,
                            results[name]["judge_failed"], results[name]["judge_calls"])
            lines += [json_line(s.to_dict(name), ensure_ascii=False) for g in groups for s in g]
            log.info("%s: Avg@%d = %.1f%% over %d questions", name, k,
                     100 * results[name]["accuracy"], len(examples))
    results.update(summary_means({n: r["accuracy"] for n, r in results.items()}))
    write_outputs(out, results, lines)
    return results


def context_of(engine) -> int | None:
    """The context length of the model an engine samples from (None when it does not say)."""
    config = getattr(getattr(engine, "model", None), "config", None)
    context = getattr(config, "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else None


def skip_too_long(benchmarks: list[Benchmark], tokenizer, context: int | None) -> dict[str, int]:
    """Take out of each benchmark (in place) the questions whose prompt leaves no room in the
    model's `context` for one answer token, as training skips its over-long prompts, with a warning
    (issue 60, S9: they were answered from a cut context and counted); {benchmark: skipped}. A
    benchmark with no question left is one line."""
    skipped: dict[str, int] = {}
    if not context:
        return skipped
    for b in benchmarks:
        fits = [e for e in b.examples if len(prompt_ids(tokenizer, e.prompt)) < context]
        n = len(b.examples) - len(fits)
        if not n:
            continue
        if not fits:
            raise ValueError(f"{b.name}: every one of its {n} prompts is longer than the model's context of {context} "
                             f"tokens; nothing to evaluate")
        log.warning("%s: skipped %d of %d questions whose prompt is longer than the model's context of %d tokens "
                    "(skipped_too_long in results.json)", b.name, n, len(b.examples), context)
        b.examples, skipped[b.name] = fits, n
    return skipped


def write_outputs(out: Path, results: dict, sample_lines: list[str]) -> None:
    """results.json, results.md, then samples.jsonl, each whole or not at all (`write_atomic`): a
    disk that fills up keeps the results of a long evaluation before the bulky samples, and the
    error names the file."""
    write_atomic(out / "results.json", json.dumps(json_safe(results), indent=2, allow_nan=False) + "\n")
    write_atomic(out / "results.md", results_table(results))
    write_atomic(out / "samples.jsonl", "".join(sample_lines))


# --------------------------------------------------------------------------- grading only

def read_responses(path: str | Path, n_examples: int) -> dict[int, list[str]]:
    """RESPONSES.jsonl rows {"index": 0-based row of the data file, "response": text}, several
    per index allowed, grouped by index in file order; a bad row is a one-line DataError."""
    from rlpr.data.loading import iter_jsonl
    from rlpr.data.records import DataError

    out: dict[int, list[str]] = {}
    for where, row in iter_jsonl(path):
        index, response = row.get("index"), row.get("response")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n_examples:
            raise DataError(f"{where}: field 'index' must be an integer in 0..{n_examples - 1}, got {index!r}")
        if not isinstance(response, str):
            raise DataError(f"{where}: field 'response' must be a string")
        out.setdefault(index, []).append(response)
    if not out:
        raise DataError(f"{path}: no responses")
    return out


def grade_responses(data_path: str | Path, responses_path: str | Path, output_dir: str | Path) -> dict:
    """`rlpr grade`: grade responses produced elsewhere against a data file, without a model;
    writes the same results.json, results.md and samples.jsonl as `evaluate` (response lengths
    are not known without the tokenizer: mean_response_tokens is 0). Questions without
    responses are left out and counted in `questions_without_responses`."""
    from rlpr.data.loading import load_examples
    from rlpr.data.sources import parse_source

    examples = load_examples(data_path)
    responses = read_responses(responses_path, len(examples))
    name = parse_source(data_path).name
    groups = [[graded_sample(examples[i], text, j) for j, text in enumerate(responses[i])]
              for i in sorted(responses)]
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = {name: {**benchmark_result(groups),
                      "questions_without_responses": len(examples) - len(groups)}}
    results.update(summary_means({name: results[name]["accuracy"]}))
    write_outputs(out, results, [json_line(s.to_dict(name), ensure_ascii=False) for g in groups for s in g])
    return results
