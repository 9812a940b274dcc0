"""Does the grader read a response as a careful reader does? A probe of issue 59's classes of wording.

    python benchmarks/grader_wordings.py [--limit 200]

For each public data set in ../shared/data (multiple choice: MMLU, MMLU-Pro, graded also as GPQA-Diamond
and ARC-Challenge; short answers: NQ-Open, graded also as SimpleQA; math: GSM8K graded as GSM8K and as
TheoremQA, MATH-500), the first `--limit` converted rows are graded (`grade_example`, the verdict of
evaluation and of `reward.kind=verifier`) with responses built from the row's reference (G) and another
option or row's reference (O) in wordings of each class of issue 59:

- COMMITTED, to be credited: LaTeX units and notation around the answer (math), a restatement, a
  correction toward the reference ("Answer: O. Hmm, no wait -- G."), another candidate only in hidden
  text, a look-alike or full-width letter (multiple choice), the value in another form (number words,
  "approximately", scientific notation, a percent of a fraction reference, a date in ISO form,
  "correct" for True);
- HEDGED, to be refused: two final lines, tags or boxes, a second choice, a condition, a postscript,
  "equally valid", "then again", "on the other hand", a correction away from the reference, the
  reference only in hidden text, a look-alike letter offered as the alternative.

The wordings are written for this probe (not the unit tests' templates). Writes
benchmarks/results/grader_wordings.json and .md: the share of rows credited per wording and data set,
and per class the share over all data sets (committed: at least 95% to pass; hedged: at most 2%), with
GRADER_VERSION. Data is read, never copied.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
SEED = 59

# (name, converter format, data_source, file, kind, graded as: data sources whose rules grade it too)
DATASETS = [
    ("mmlu", "mmlu", "mmlu", "mmlu/mmlu_test.jsonl", "mc", ["mmlu", "gpqa_diamond", "arc_challenge"]),
    ("mmlu_pro", "mmlu_pro", "mmlu_pro", "mmlu_pro/mmlu_pro_test_1000_seed0.jsonl", "mc", ["mmlu_pro"]),
    ("nq_open", "nq_open", "nq_open", "nq_open/NQ-open.dev.jsonl", "free", ["nq_open", "simpleqa"]),
    ("gsm8k", "gsm8k", "gsm8k", "gsm8k/test.jsonl", "number", ["gsm8k", "theoremqa"]),
    ("math500", "math", "math500", "math500/test.jsonl", "math", ["math500"]),
]

CYRILLIC = {"A": "А", "B": "В", "C": "С", "E": "Е", "H": "Н", "K": "К", "M": "М", "O": "О", "P": "Р", "T": "Т", "X": "Х"}

# class -> (must be credited, [wording]); {G} the reference, {O} another candidate, {L} G as a look-alike,
# {LO} O as a look-alike, {V} G in another form (see `value_forms`).
COMMON = {
    "restatement": (True, ["The answer is {G}.\n\nTo sum up, the answer is {G}.",
                           "Final answer: {G}\nI am confident: the answer is {G}.",
                           "<answer>{G}</answer>\n\nSo, once more: <answer>{G}</answer>"]),
    "correction_to_reference": (True, ["Answer: {O}. Hmm, no wait -- {G}.",
                                       "My first thought was the answer is {O}... actually, the answer is {G}.",
                                       "<answer>{O}</answer> Sorry, I meant <answer>{G}</answer>",
                                       "The answer is {O}. On second thought, the answer is {G}."]),
    "other_only_hidden": (True, ["<!-- draft: the answer is {O} -->\nThe answer is {G}.",
                                 "The answer is {G}.<span hidden>Answer: {O}</span>",
                                 "[//]: # (answer: {O})\nFinal answer: {G}"]),
    "two_final_answers": (False, ["Final answer: {G}\nFinal answer: {O}", "<answer>{G}</answer>\n<answer>{O}</answer>",
                                  "The answer is {G}.\n\nHaving checked again, the answer is {O}."]),
    "second_choice": (False, ["My pick: {G}. Second choice: {O}.", "Answer: {G}; backup answer: {O}."]),
    "condition": (False, ["The answer is {G}, unless the question is asking about {O}.",
                          "Answer: {G}, unless you mean {O}."]),
    "postscript": (False, ["The answer is {G}.\n\nPS: it could also be {O}.", "Answer: {G}\n\nP.S. Or {O}."]),
    "equally_valid": (False, ["The answer is {G} ({O} is equally valid).", "Answer: {G}. {O} is also plausible."]),
    "then_again": (False, ["The answer is {G}. Then again, {O}.", "Answer: {G}. On the other hand, {O}.",
                           "The answer is {G}. Alternatively: {O}."]),
    "correction_away": (False, ["Answer: {G} -- no wait, {O}.", "The answer is {G}. Actually, the answer is {O}.",
                                "<answer>{G}</answer> Oops, I meant <answer>{O}</answer>"]),
    "reference_only_hidden": (False, ["<!-- The answer is {G} -->\nI cannot decide.",
                                      "I am not sure.<div style=\"display:none\">Answer: {G}</div>"]),
}
BOXES = {
    "two_boxes": (False, ["\\boxed{{{G}}}\n\nOn reflection the value is rather different: \\boxed{{{O}}}",
                          "So we get \\boxed{{{G}}}. Checking the units gives \\boxed{{{O}}}."]),
    "box_restated": (True, ["\\boxed{{{G}}}\n\nTherefore the final answer is \\boxed{{{G}}}."]),
}
MC_ONLY = {
    "look_alike_letter": (True, ["The answer is {L}.", "Answer: ({L})", "<answer>{FW}</answer>"]),
    "look_alike_alternative": (False, ["The answer is {G} or {LO}.", "Answer: {G} (or possibly {LO})"]),
}
NUMBER_ONLY = {
    "latex_units": (True, ["\\boxed{{{G} \\text{{ m}}}}", "The answer is ${G} \\, \\mathrm{{kg}}$.",
                           "<answer> {G} \\text{{ s}} </answer>", "\\boxed{{{G}^\\circ}}"]),
    "value_in_another_form": (True, ["The answer is {V}.", "<answer>{V}</answer>"]),
}


def classes(kind: str) -> dict:
    out = dict(COMMON)
    if kind in ("number", "math"):
        out.update(BOXES)
    if kind == "mc":
        out.update(MC_ONLY)
    if kind in ("number", "free"):
        out.update({"value_in_another_form": NUMBER_ONLY["value_in_another_form"]})
    if kind == "number":
        out["latex_units"] = NUMBER_ONLY["latex_units"]
    return out


def value_forms(reference: str, rng: random.Random) -> list[str]:
    """The reference in forms a reader reads as the same value (issue 59, item 4), or []."""
    from rlpr.grading.canonical import date_key, gold_variants, number_value, number_words

    value = number_value(reference)
    if value is not None and value.is_integer() and 0 <= value < 1_000_000:
        n = int(value)
        mantissa = f"{n / 10 ** (len(str(n)) - 1):g}"
        return [number_words(n), f"approximately {n}", f"{mantissa} \\times 10^{{{len(str(n)) - 1}}}", f"about {n:,}"]
    if date_key(reference) is not None:
        return [v for v in gold_variants(reference) if v[:1].isdigit()][:2]
    return []


def responses(examples: list, kind: str, seed: int = SEED) -> list[tuple]:
    """(example, class, wording, response, must_be_credited) for each row and wording of `kind`."""
    from rlpr.grading import LETTERS, normalize_answer

    rng = random.Random(seed)
    out = []
    for e in examples:
        if kind == "mc" and len(e.choices) < 2:
            continue
        if kind == "mc":
            other = rng.choice([x for x in LETTERS[:len(e.choices)] if x != e.reference and x in CYRILLIC] or
                               [x for x in LETTERS[:len(e.choices)] if x != e.reference])
        else:  # another row's reference that is another value and does not contain this one ("x=5" for 5)
            gold = normalize_answer(e.reference)
            others = [x for x in examples if normalize_answer(x.reference) != gold
                      and gold not in normalize_answer(x.reference).split()]
            rng.shuffle(others)
            other = next(x for x in others if not (kind == "math" and _same_math(x.reference, e.reference))).reference
        forms = value_forms(e.reference, rng) if kind in ("number", "free") else []
        for name, (good, wordings) in classes(kind).items():
            if name == "value_in_another_form" and not forms:
                continue
            for i, wording in enumerate(wordings):
                full_width = chr(0xFF21 + ord(e.reference) - 65) if kind == "mc" else ""
                text = wording.format(G=e.reference, O=other, L=CYRILLIC.get(e.reference, full_width), FW=full_width,
                                      LO=CYRILLIC.get(other, other), V=forms[i % len(forms)] if forms else "")
                out.append((e, name, wording, text, good))
    return out


def _same_math(a: str, b: str) -> bool:
    from rlpr.grading import math_equal

    try:
        return math_equal(a, [b])[0] or math_equal(b, [a])[0]
    except Exception:  # unreadable: not the same value
        return False


def percent_rows(examples: list) -> list:
    """GSM8K rows as TheoremQA rows whose reference is a fraction (the integer / 100) and True/False
    rows, for the percent and boolean forms: (example, class, wording, response, must_be_credited)."""
    out = []
    for e in examples:
        n = float(e.reference)
        fraction = replace(e, reference=f"{n / 100:g}", data_source="theoremqa")
        out.append((fraction, "value_in_another_form", "{G*100}%", f"The answer is {e.reference}%.", True))
        out.append((fraction, "value_in_another_form", "\\boxed{{G*100}\\%}", f"\\boxed{{{e.reference}\\%}}", True))
        truth = replace(e, reference="True" if int(n) % 2 else "False", data_source="theoremqa")
        said = "correct" if truth.reference == "True" else "incorrect"
        out.append((truth, "value_in_another_form", "The statement is correct/incorrect.", f"The statement is {said}.", True))
    return out


def probe(limit: int) -> dict:
    from rlpr.data.convert import convert_rows, read_input_rows
    from rlpr.grading import grade_example

    results = {}
    for name, fmt, source, file, kind, graded_as in DATASETS:
        path = DATA / file
        if not path.is_file():
            continue
        t = time.time()
        examples = convert_rows(fmt, read_input_rows(path), source=source, path=str(path))[:limit]
        rows = responses(examples, kind)
        if kind == "number":
            rows += percent_rows(examples)
        for as_source in graded_as:
            counts: dict[str, list] = {}
            for e, cls, wording, text, good in rows:
                if kind == "number" and e.data_source == "theoremqa" and as_source != "theoremqa":
                    continue
                graded = e if e.data_source == "theoremqa" else replace(e, data_source=as_source)
                credited = grade_example(graded, text).correct
                c = counts.setdefault(f"{cls}|{wording}", [cls, good, 0, 0, []])
                c[2] += credited
                c[3] += 1
                if credited != good and len(c[4]) < 2:
                    c[4].append({"reference": e.reference, "response": text[:160]})
            results[f"{name} as {as_source}"] = {
                "kind": kind, "rows": len(examples),
                "wordings": [{"class": cls, "wording": key.split("|", 1)[1], "must_be_credited": good,
                              "credited": k / n, "n": n, "wrong_examples": ex}
                             for key, (cls, good, k, n, ex) in counts.items()]}
        print(f"{name}: {time.time() - t:.0f} s", flush=True)
    return results


def by_class(results: dict) -> dict:
    """Per class: rows credited over all data sets and wordings, and whether it meets the target."""
    out: dict[str, dict] = {}
    for r in results.values():
        for w in r["wordings"]:
            c = out.setdefault(w["class"], {"must_be_credited": w["must_be_credited"], "credited": 0, "n": 0})
            c["credited"] += round(w["credited"] * w["n"])
            c["n"] += w["n"]
    for c in out.values():
        c["rate"] = c["credited"] / c["n"]
        c["passes"] = c["rate"] >= 0.95 if c["must_be_credited"] else c["rate"] <= 0.02
    return out


def markdown(results: dict, classes_: dict, version: int, limit: int) -> str:
    out = [f"# Wording probe (GRADER_VERSION {version})\n",
           f"`python benchmarks/grader_wordings.py --limit {limit}`: issue 59's classes of wording, built from each "
           "row's reference (G) and another option or row's reference (O). Committed classes must be credited on "
           ">= 95% of rows, hedged ones on <= 2%.\n", "## By class, all data sets\n",
           "| class | should be | credited | rows | passes |", "|---|---|---|---|---|"]
    for name, c in classes_.items():
        out.append(f"| {name} | {'credit' if c['must_be_credited'] else 'refuse'} | {100 * c['rate']:.1f}% | "
                   f"{c['n']} | {'yes' if c['passes'] else 'NO'} |")
    for name, r in results.items():
        out += ["", f"## {name} ({r['kind']}, {r['rows']} rows)\n", "| class | wording | should be | credited |",
                "|---|---|---|---|"]
        for w in r["wordings"]:
            wording = w["wording"].replace("|", "\\|").replace("\n", "\\n")
            out.append(f"| {w['class']} | `{wording}` | {'credit' if w['must_be_credited'] else 'refuse'} | "
                       f"{100 * w['credited']:.1f}% |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from rlpr.grading import GRADER_VERSION

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=200, help="rows per data set")
    parser.add_argument("--output", default=str(RESULTS / "grader_wordings"))
    args = parser.parse_args(argv)
    if not DATA.is_dir():
        print(f"{DATA} is absent: nothing to probe", file=sys.stderr)
        return 1
    results = probe(args.limit)
    classes_ = by_class(results)
    out = Path(args.output)
    out.with_suffix(".json").write_text(json.dumps(
        {"meta": {"grader_version": GRADER_VERSION, "limit": args.limit, "seed": SEED}, "by_class": classes_,
         "results": results}, indent=2, ensure_ascii=False) + "\n")
    out.with_suffix(".md").write_text(markdown(results, classes_, GRADER_VERSION, args.limit))
    print(markdown(results, classes_, GRADER_VERSION, args.limit).split("\n## ", 2)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
