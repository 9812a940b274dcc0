"""Can the graders be gamed (issue 34), and do they read a response as a careful reader does (issue 59)?
Responses built from each row's reference (G) and another option or row's reference (O), graded with
`grade_example` (the verdict of evaluation and of `reward.kind=verifier`) on the first `--limit` rows of
the public data in ../shared/data (read, never copied); docs/scoring-and-evaluation.md says what each
form tests.

    python benchmarks/grader_probes.py gaming [--limit 500]     # fed back: credited; gamed: refused
    python benchmarks/grader_probes.py wordings [--limit 200]   # committed: >= 95% credited; hedged: <= 2%

Writes benchmarks/results/grader_gaming.{json,md} or grader_wordings.{json,md}.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
# name -> (converter format, data_source, file, kind, the data sources whose rules grade it in the wordings probe)
DATASETS = {
    "mmlu": ("mmlu", "mmlu", "mmlu/mmlu_test.jsonl", "mc", ["mmlu", "gpqa_diamond", "arc_challenge"]),
    "mmlu_pro": ("mmlu_pro", "mmlu_pro", "mmlu_pro/mmlu_pro_test_1000_seed0.jsonl", "mc", ["mmlu_pro"]),
    "nq_open": ("nq_open", "nq_open", "nq_open/NQ-open.dev.jsonl", "free", ["nq_open", "simpleqa"]),
    "math500": ("math", "math500", "math500/test.jsonl", "math", ["math500"]),
    "gsm8k": ("gsm8k", "gsm8k", "gsm8k/test.jsonl", "number", ["gsm8k", "theoremqa"]),
}

# gaming: kind -> {form: (template, must be credited)}; {ALL} is every option
GAMING = {
    "mc": {"bare": ("{G}", True), "answer_is": ("The answer is {G}.", True),
           "answer_is_paren": ("The answer is ({G}).", True), "tagged": ("<answer>{G}</answer>", True),
           "choose": ("I choose {G}.", True), "gold_and_other": ("{G} and {O}", False),
           "other_and_gold": ("{O} and {G}", False), "answer_is_or": ("The answer is {O} or {G}.", False),
           "answer_comma": ("Answer: {G}, {O}", False), "tagged_two": ("<answer>{G}, {O}</answer>", False),
           "all_options": ("The answer is {ALL}.", False), "not_gold": ("The answer is not {G}.", False),
           "definitely_not": ("definitely not ({G})", False), "either_or": ("Either {G} or {O}.", False),
           "or_maybe": ("It is {G}, or maybe {O}.", False)},
    "free": {"bare": ("{G}", True), "answer_is": ("The answer is {G}.", True), "tagged": ("<answer>{G}</answer>", True),
             "which_clause": ("{G}, which is well documented.", True),
             "answer_is_which": ("The answer is {G}, which is well documented.", True),
             "and_clause": ("{G}, and this is well documented.", True), "other_row": ("{O}", False),
             "gold_or_other": ("{G} or {O}", False), "other_or_gold": ("The answer is {O} or {G}.", False),
             "gold_comma_other": ("{G}, {O}", False), "not_gold": ("The answer is not {G}.", False),
             "not_but": ("Not {G}, but {O}.", False), "wasnt": ("It wasn't {G}.", False),
             "either_or": ("Either {G} or {O}.", False), "or_maybe": ("It is {G}, or maybe {O}.", False)},
    "math": {"boxed": ("\\boxed{{{G}}}", True), "answer_is": ("The answer is {G}.", True),
             "tagged": ("<answer>{G}</answer>", True), "other_row": ("\\boxed{{{O}}}", False),
             "answer_is_or": ("The answer is {O} or {G}.", False),
             "boxed_two": ("\\boxed{{{G}}} or \\boxed{{{O}}}", False),
             "boxed_two_rev": ("\\boxed{{{O}}} or \\boxed{{{G}}}", False),
             "not_gold": ("The answer is not {G}.", False), "either_or": ("Either {G} or {O}.", False)},
}
GAMING["number"] = GAMING["math"]

CYRILLIC = {"A": "А", "B": "В", "C": "С", "E": "Е", "H": "Н", "K": "К", "M": "М", "O": "О", "P": "Р", "T": "Т", "X": "Х"}
# wordings: class -> (must be credited, [wording]); {L} G as a look-alike letter, {FW} full-width, {LO} O as a
# look-alike, {V} G in another form (`value_forms`)
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
BY_KIND = {  # the classes only some kinds of answer have
    "math": {"two_boxes": (False, ["\\boxed{{{G}}}\n\nOn reflection the value is rather different: \\boxed{{{O}}}",
                                   "So we get \\boxed{{{G}}}. Checking the units gives \\boxed{{{O}}}."]),
             "box_restated": (True, ["\\boxed{{{G}}}\n\nTherefore the final answer is \\boxed{{{G}}}."])},
    "mc": {"look_alike_letter": (True, ["The answer is {L}.", "Answer: ({L})", "<answer>{FW}</answer>"]),
           "look_alike_alternative": (False, ["The answer is {G} or {LO}.", "Answer: {G} (or possibly {LO})"])},
    "free": {"value_in_another_form": (True, ["The answer is {V}.", "<answer>{V}</answer>"])},
}
BY_KIND["number"] = {**BY_KIND["math"], **BY_KIND["free"],
                     "latex_units": (True, ["\\boxed{{{G} \\text{{ m}}}}", "The answer is ${G} \\, \\mathrm{{kg}}$.",
                                            "<answer> {G} \\text{{ s}} </answer>", "\\boxed{{{G}^\\circ}}"])}
PROBES = {"gaming": {"seed": 0, "limit": 500}, "wordings": {"seed": 59, "limit": 200}}


def value_forms(reference: str) -> list[str]:
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


def _same_math(a: str, b: str) -> bool:
    from rlpr.grading import math_equal

    try:
        return math_equal(a, [b])[0] or math_equal(b, [a])[0]
    except Exception:  # unreadable: not the same value
        return False


def other_answer(e, examples: list, kind: str, rng: random.Random, probe: str) -> str:
    """Another option (a letter with a Cyrillic look-alike where the wordings probe can use one), or another
    row's reference that is another value (and, for wordings, does not contain this one: "x=5" for 5)."""
    from rlpr.grading import LETTERS, normalize_answer

    if kind == "mc":
        letters = [x for x in LETTERS[:len(e.choices)] if x != e.reference]
        return rng.choice([x for x in letters if x in CYRILLIC] or letters if probe == "wordings" else letters)
    gold = normalize_answer(e.reference)
    others = [x for x in examples if normalize_answer(x.reference) != gold]
    if probe == "gaming":
        return rng.choice(others).reference
    others = [x for x in others if gold not in normalize_answer(x.reference).split()]
    rng.shuffle(others)
    return next(x for x in others if not (kind == "math" and _same_math(x.reference, e.reference))).reference


def responses(examples: list, kind: str, probe: str) -> list[tuple]:
    """(example, class, wording, response, must_be_credited) for each row and form of `kind`."""
    from rlpr.grading import LETTERS

    rng = random.Random(PROBES[probe]["seed"])
    out = []
    for e in examples:
        if kind == "mc" and len(e.choices) < 2:
            continue
        other = other_answer(e, examples, kind, rng, probe)
        if probe == "gaming":
            letters = LETTERS[:len(e.choices)]
            every = ", ".join(letters[:-1]) + " or " + letters[-1] if kind == "mc" else ""
            out += [(e, form, template, template.format(G=e.reference, O=other, ALL=every), good)
                    for form, (template, good) in GAMING[kind].items()]
            continue
        forms = value_forms(e.reference) if kind in ("number", "free") else []
        full_width = chr(0xFF21 + ord(e.reference) - 65) if kind == "mc" else ""
        for name, (good, wordings) in {**COMMON, **BY_KIND.get(kind, {})}.items():
            if name == "value_in_another_form" and not forms:
                continue
            out += [(e, name, wording, wording.format(G=e.reference, O=other, L=CYRILLIC.get(e.reference, full_width),
                                                      FW=full_width, LO=CYRILLIC.get(other, other),
                                                      V=forms[i % len(forms)] if forms else ""), good)
                    for i, wording in enumerate(wordings)]
    return out


def percent_rows(examples: list) -> list:
    """GSM8K rows as TheoremQA rows whose reference is a fraction (the integer / 100) and True/False rows,
    for the percent and boolean forms: (example, class, wording, response, must_be_credited)."""
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


def probe(name: str, limit: int) -> dict:
    """Per data set (and, for wordings, per data source whose rules grade it): each wording's share credited."""
    from rlpr.data.convert import convert_rows, read_input_rows
    from rlpr.grading import grade_example

    results = {}
    for data, (fmt, source, file, kind, graded_as) in DATASETS.items():
        path = DATA / file
        if not path.is_file():
            continue
        t = time.time()
        examples = convert_rows(fmt, read_input_rows(path), source=source, path=str(path))[:limit]
        rows = responses(examples, kind, name)
        if name == "wordings" and kind == "number":
            rows += percent_rows(examples)
        for as_source in graded_as if name == "wordings" else [source]:
            counts: dict[str, list] = {}
            for e, cls, wording, text, good in rows:
                if e.data_source == "theoremqa" and as_source != "theoremqa":
                    continue
                credited = grade_example(e if e.data_source == "theoremqa" else replace(e, data_source=as_source),
                                         text).correct
                c = counts.setdefault(f"{cls}|{wording}", [cls, good, 0, 0, []])
                c[2] += credited
                c[3] += 1
                if credited != good and len(c[4]) < 2:
                    c[4].append({"reference": e.reference, "response": text[:160]})
            results[data if name == "gaming" else f"{data} as {as_source}"] = {
                "kind": kind, "rows": len(examples),
                "wordings": [{"class": cls, "wording": key.split("|", 1)[1], "must_be_credited": good,
                              "credited": k / n, "n": n, "wrong_examples": ex}
                             for key, (cls, good, k, n, ex) in counts.items()]}
        print(f"{data}: {time.time() - t:.0f} s", flush=True)
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


def markdown(res: dict) -> str:
    from harness import files

    meta = res["meta"]
    out = [f"# {meta['probe'].capitalize()} probe (GRADER_VERSION {meta['grader_version']})\n", files.header(res) + "\n",
           f"`python benchmarks/grader_probes.py {meta['probe']} --limit {meta['limit']}`: the share of rows credited "
           "for each form of response built from the row's reference (G) and another option or row's reference (O). "
           "Forms to credit must be credited on >= 95% of rows, those to refuse on <= 2%.\n",
           "## By class, all data sets\n", *files.table(["class", "should be", "credited", "rows", "passes"], (
               [name, "credit" if c["must_be_credited"] else "refuse", f"{100 * c['rate']:.1f}%", c["n"],
                "yes" if c["passes"] else "NO"] for name, c in res["by_class"].items()))]
    for name, r in res["results"].items():
        out += ["", f"## {name} ({r['kind']}, {r['rows']} rows)\n", *files.table(
            ["class", "wording", "should be", "credited"],
            ([w["class"], "`" + w["wording"].replace("|", "\\|").replace("\n", "\\n") + "`",
              "credit" if w["must_be_credited"] else "refuse", f"{100 * w['credited']:.1f}%"] for w in r["wordings"]))]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from harness import files, record

    from rlpr.grading import GRADER_VERSION

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("probe", choices=list(PROBES))
    parser.add_argument("--limit", type=int, default=None, help="rows per data set (gaming 500, wordings 200)")
    parser.add_argument("--output", default=None, help="path stem (default: benchmarks/results/grader_PROBE)")
    args = parser.parse_args(argv)
    if not DATA.is_dir():
        print(f"{DATA} is absent: nothing to probe", file=sys.stderr)
        return 1
    limit = args.limit or PROBES[args.probe]["limit"]
    results = probe(args.probe, limit)
    res = {**record.stamp(),
           "meta": {"probe": args.probe, "grader_version": GRADER_VERSION, "limit": limit,
                    "seed": PROBES[args.probe]["seed"]}, "by_class": by_class(results), "results": results}
    text = files.save(res, args.output or RESULTS / f"grader_{args.probe}", markdown)
    print(text.split("\n## ", 2)[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
