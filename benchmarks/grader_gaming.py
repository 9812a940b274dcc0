"""Can the graders be gamed? Responses built from real references in the forms models write (issue 34).

    python benchmarks/grader_gaming.py [--limit 500]

For each public data set in ../shared/data (multiple choice: MMLU, MMLU-Pro; short answers: NQ-Open;
math: MATH-500, GSM8K), the first `--limit` converted rows are graded (`grade_example`, the verdict
of evaluation and of `reward.kind=verifier`) with responses built from the row's own reference
(GOLD) and another option or another row's reference (OTHER):

- fed back, which must be credited: the reference bare, "The answer is GOLD.", in tags, and for
  short answers with a trailing clause ("GOLD, which is well documented.", "The answer is GOLD,
  which ...", "GOLD, and ...");
- gamed, which must be refused: several candidates ("GOLD and OTHER", "The answer is OTHER or
  GOLD.", "Answer: GOLD, OTHER", every option), a negated reference ("The answer is not GOLD.",
  "definitely not (GOLD)", "Not GOLD, but OTHER.", "It wasn't GOLD."), a hedge between two
  ("Either GOLD or OTHER.", "It is GOLD or maybe OTHER."), another row's reference.

Writes benchmarks/results/grader_gaming.json and .md (rate credited per form and data set, with
GRADER_VERSION). Data is read, never copied.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
SEED = 0

# (name, converter format, data_source, file, kind)
DATASETS = [
    ("mmlu", "mmlu", "mmlu", "mmlu/mmlu_test.jsonl", "mc"),
    ("mmlu_pro", "mmlu_pro", "mmlu_pro", "mmlu_pro/mmlu_pro_test_1000_seed0.jsonl", "mc"),
    ("nq_open", "nq_open", "nq_open", "nq_open/NQ-open.dev.jsonl", "free"),
    ("math500", "math", "math500", "math500/test.jsonl", "math"),
    ("gsm8k", "gsm8k", "gsm8k", "gsm8k/test.jsonl", "math"),
]

# form name -> (template, must be credited); GOLD / OTHER / ALL stand for the answers
MC_FORMS = {
    "bare": ("{G}", True),
    "answer_is": ("The answer is {G}.", True),
    "answer_is_paren": ("The answer is ({G}).", True),
    "tagged": ("<answer>{G}</answer>", True),
    "choose": ("I choose {G}.", True),
    "gold_and_other": ("{G} and {O}", False),
    "other_and_gold": ("{O} and {G}", False),
    "answer_is_or": ("The answer is {O} or {G}.", False),
    "answer_comma": ("Answer: {G}, {O}", False),
    "tagged_two": ("<answer>{G}, {O}</answer>", False),
    "all_options": ("The answer is {ALL}.", False),
    "not_gold": ("The answer is not {G}.", False),
    "definitely_not": ("definitely not ({G})", False),
    "either_or": ("Either {G} or {O}.", False),
    "or_maybe": ("It is {G}, or maybe {O}.", False),
}
FREE_FORMS = {
    "bare": ("{G}", True),
    "answer_is": ("The answer is {G}.", True),
    "tagged": ("<answer>{G}</answer>", True),
    "which_clause": ("{G}, which is well documented.", True),
    "answer_is_which": ("The answer is {G}, which is well documented.", True),
    "and_clause": ("{G}, and this is well documented.", True),
    "other_row": ("{O}", False),
    "gold_or_other": ("{G} or {O}", False),
    "other_or_gold": ("The answer is {O} or {G}.", False),
    "gold_comma_other": ("{G}, {O}", False),
    "not_gold": ("The answer is not {G}.", False),
    "not_but": ("Not {G}, but {O}.", False),
    "wasnt": ("It wasn't {G}.", False),
    "either_or": ("Either {G} or {O}.", False),
    "or_maybe": ("It is {G}, or maybe {O}.", False),
}
MATH_FORMS = {
    "boxed": ("\\boxed{{{G}}}", True),
    "answer_is": ("The answer is {G}.", True),
    "tagged": ("<answer>{G}</answer>", True),
    "other_row": ("\\boxed{{{O}}}", False),
    "answer_is_or": ("The answer is {O} or {G}.", False),
    "boxed_two": ("\\boxed{{{G}}} or \\boxed{{{O}}}", False),
    "boxed_two_rev": ("\\boxed{{{O}}} or \\boxed{{{G}}}", False),
    "not_gold": ("The answer is not {G}.", False),
    "either_or": ("Either {G} or {O}.", False),
}
FORMS = {"mc": MC_FORMS, "free": FREE_FORMS, "math": MATH_FORMS}


def load(fmt: str, source: str, path: Path, limit: int) -> list:
    from rlpr.data.convert import convert_rows, read_input_rows

    return convert_rows(fmt, read_input_rows(path), source=source, path=str(path))[:limit]


def responses(examples: list, kind: str, seed: int = SEED) -> list[tuple]:
    """(example, form, response, must_be_credited) for each row and form of `kind`."""
    from rlpr.grading import LETTERS, normalize_answer

    rng = random.Random(seed)
    out = []
    for i, e in enumerate(examples):
        if kind == "mc" and len(e.choices) < 2:
            continue
        if kind == "mc":
            letters = LETTERS[:len(e.choices)]
            other = rng.choice([x for x in letters if x != e.reference])
            everything = ", ".join(letters[:-1]) + " or " + letters[-1]
        else:
            others = [x for x in examples if normalize_answer(x.reference) != normalize_answer(e.reference)]
            other, everything = rng.choice(others).reference, ""
        for form, (template, good) in FORMS[kind].items():
            out.append((e, form, template.format(G=e.reference, O=other, ALL=everything), good))
    return out


def probe(limit: int) -> dict:
    from rlpr.grading import grade_example

    results = {}
    for name, fmt, source, file, kind in DATASETS:
        path = DATA / file
        if not path.is_file():
            continue
        t = time.time()
        rows = responses(load(fmt, source, path, limit), kind)
        counts: dict[str, list[int]] = {}
        examples: dict[str, list[str]] = {}
        for e, form, text, good in rows:
            credited = grade_example(e, text).correct
            c = counts.setdefault(form, [0, 0])
            c[0] += credited
            c[1] += 1
            if credited != good and len(examples.setdefault(form, [])) < 3:
                examples[form].append(text[:120])
        results[name] = {"kind": kind, "rows": counts[next(iter(counts))][1],
                         "forms": {f: {"must_be_credited": FORMS[kind][f][1], "credited": c / n,
                                       "wrong_examples": examples.get(f, [])}
                                   for f, (c, n) in counts.items()}}
        print(f"{name}: {time.time() - t:.0f} s", flush=True)
    return results


def markdown(results: dict, version: int, header: str = "") -> str:
    out = [f"# Gaming probe (GRADER_VERSION {version})\n", *([header + "\n"] if header else []),
           "`python benchmarks/grader_gaming.py`: the share of rows credited for each form of response "
           "built from the row's own reference (G) and another option or row's reference (O). Forms marked "
           "**credit** must be near 100%, the others near 0%.\n"]
    for name, r in results.items():
        out += [f"## {name} ({r['kind']}, {r['rows']} rows)\n", "| form | template | should be | credited |",
                "|---|---|---|---|"]
        for form, f in r["forms"].items():
            template = FORMS[r["kind"]][form][0].replace("|", "\\|")
            out.append(f"| {form} | `{template}` | {'credit' if f['must_be_credited'] else 'refuse'} | "
                       f"{100 * f['credited']:.1f}% |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    from harness import files, record  # benchmarks/ is on the path when this runs as a script

    from rlpr.grading import GRADER_VERSION

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=500, help="rows per data set")
    parser.add_argument("--output", default=str(RESULTS / "grader_gaming"))
    args = parser.parse_args(argv)
    if not DATA.is_dir():
        print(f"{DATA} is absent: nothing to probe", file=sys.stderr)
        return 1
    results = probe(args.limit)
    res = {"date": record.now(), "commit": record.commit(), "machine": record.machine(),
           "meta": {"grader_version": GRADER_VERSION, "limit": args.limit, "seed": SEED}, "results": results}
    print(files.save(res, args.output, lambda r: markdown(r["results"], GRADER_VERSION, files.header(r))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
