"""Self-consistency of the graders (issue 17; docs/scoring-and-evaluation.md): every converted row of the
public data in ../shared/data (or a converter's hand-made fixture, tests/test_convert_benchmarks.py) has
its own reference graded as a response in three forms (each >= 99% correct) and another row's reference
no more often than chance (+2 points for free-form answers). Then the free-form grader against people
(issue 28): precision and recall on the hand-labeled set (halves by sha256(id) parity) and on the fresh
sets labeled blind (FRESH_SETS).

    python benchmarks/grader_consistency.py [--limit N] [--workers 2] [--labeled-only]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import random
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

if str(Path(__file__).resolve().parent) not in sys.path:  # run as a script, or loaded from its path by a test
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import files, record  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"
LABELED = ROOT / "tests" / "data" / "grading" / "labeled_responses.jsonl"
GRADING = ROOT / "tests" / "data" / "grading"
# The fresh sets: responses generated after a grader version was written and labeled by reading them
# before the grader ran on them. Each was blind once; what it measured then is kept here (the
# grader changed after it was read), beside what the current grader scores on it.
FRESH_SETS = (
    {"name": "fresh set 1", "path": GRADING / "fresh_labeled_responses.jsonl",
     "made": "`build_grading_set.py --fresh --seed 31`, base model, greedy and sampled, after GRADER_VERSION 2",
     "blind": "version 2, blind: precision 0.952, recall 0.870 (80 of 92 right answers found); read "
              "while writing version 3"},
    {"name": "fresh set 2", "path": GRADING / "fresh2_labeled_responses.jsonl",
     "made": "`build_grading_set.py --fresh --seed 77`, base model, sampled only (every greedy response "
             "was already read), after GRADER_VERSION 3",
     "blind": "version 3 as first written, blind: precision 0.944, recall 0.654 (17 of 26 right answers "
              "found); three rules were added after reading it (asides such as ', of course,', 'due to' "
              "ends a phrase, 'However, in ...' takes nothing back)"},
    {"name": "fresh set 3", "path": GRADING / "fresh3_labeled_responses.jsonl",
     "made": "`build_grading_set.py --from-responses ... --seed 53 --pick 150`, TRAINED models' sampled responses "
             "saved by learning.py in runs finished after GRADER_VERSION 4 was written (shuffled_reference-0, "
             "SmolLM2-135M, sentences; rlpr-0, Gemma 3 270M, mostly bare answers), 25 per run x set",
     "blind": "version 4, blind: precision 1.000 (51 of 51), recall 0.962 (51 of 53 right answers found); "
              "no rule changed after reading it"},
    {"name": "fresh set 4", "path": GRADING / "fresh4_labeled_responses.jsonl",
     "made": "issue 59: general questions only, the base model's sampled responses (seed 59, 208) and 30 saved "
             "samples of each of two RLPR runs (rlpr-1-88202acba0, rlpr-2-a2292fc3a8), after GRADER_VERSION 5",
     "blind": "version 5, blind: precision 0.894 (42 of 47), recall 0.778 (42 of 54 right answers found); read "
              "while writing version 6"},
)
FORMS = {
    "answer_tag": "<answer> {} </answer>",
    "answer_is": "The answer is {}.",
    "boxed": "\\boxed{{{}}}",
}
MIN_FORM_ACCURACY = 0.99
FREE_FORM_SLACK = 0.02
SHUFFLE_SEED = 0

# (name, converter format, data_source, files relative to ../shared/data)
DATASETS = [
    ("gsm8k", "gsm8k", "gsm8k", ["gsm8k/test.jsonl"]),
    ("math500", "math", "math500", ["math500/test.jsonl"]),
    ("math_test5000", "math", "math", ["math_test5000/math_test5000.jsonl"]),
    ("minerva_math", "minerva", "minerva", ["minerva_math/test.jsonl"]),
    ("aime24", "aime", "aime24", ["aime24/test.jsonl"]),
    ("amc23", "aime", "amc23", ["amc23/test.jsonl"]),
    ("mmlu_test", "mmlu", "mmlu", ["mmlu/mmlu_test.jsonl"]),
    ("mmlu_pro_test", "mmlu_pro", "mmlu_pro", ["mmlu_pro/mmlu_pro_test.jsonl"]),
    ("bbh", "bbh", None, sorted(f"bbh/{p.name}" for p in (DATA / "bbh").glob("*.json"))),
    ("nq_open_dev", "nq_open", "nq_open", ["nq_open/NQ-open.dev.jsonl"]),
    ("nq_open_efficientqa", "nq_open", "nq_open", ["nq_open/NQ-open.efficientqa.dev.1.1.jsonl"]),
]
FIXTURES = ["theoremqa", "gpqa", "arc", "simpleqa"]  # converters whose data is not in ../shared/data


def fixture_module():
    """tests/test_convert_benchmarks.py, the single home of the hand-made fixtures."""
    path = ROOT / "tests" / "test_convert_benchmarks.py"
    spec = importlib.util.spec_from_file_location("_rlpr_convert_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_files(fmt: str, source: str | None, files: list[Path], limit: int = 0) -> list[list]:
    """Converted Examples, one list per file (shuffles stay within a file)."""
    from rlpr.data.convert import convert_rows, read_input_rows

    out = []
    for path in files:
        rows = read_input_rows(path)
        src = source or (f"bbh/{path.stem}" if fmt == "bbh" else fmt)
        examples = convert_rows(fmt, rows, source=src, path=str(path))
        out.append(examples[:limit] if limit else examples)
    return out


def load_fixture(fmt: str, workdir: Path) -> list[list]:
    path = fixture_module().fixture(fmt, workdir)
    return load_files(fmt, None, [path])


def response(form: str, reference: str) -> str:
    """The reference written as a response in `form`; inside \\boxed{} an unbalanced brace is
    written \\{ or \\} as LaTeX requires (BBH's Dyck targets such as "} >")."""
    if form == "boxed" and not _balanced(reference):
        reference = reference.replace("{", "\\{").replace("}", "\\}")
    return FORMS[form].format(reference)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text.replace("\\{", "").replace("\\}", ""):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth < 0:
            return False
    return depth == 0


def _grade_pairs(pairs: list[tuple]) -> list[bool]:
    from rlpr.grading import grade_example

    return [grade_example(example, response).correct for example, response in pairs]


def check(groups: list[list], *, workers: int = 1, seed: int = SHUFFLE_SEED) -> dict:
    """Form accuracies and the shuffled-reference rate for the Examples of one data set."""
    from rlpr.grading import grader_for, normalize_answer

    pairs, shuffled_same = [], []
    for examples in groups:
        order = list(range(len(examples)))
        random.Random(seed).shuffle(order)
        for i, e in enumerate(examples):
            other = examples[order[i]]
            pairs.extend((e, response(form, e.reference)) for form in FORMS)
            pairs.append((e, response("answer_tag", other.reference)))
            shuffled_same.append(normalize_answer(other.reference) == normalize_answer(e.reference)
                                 or other.reference.strip() == e.reference.strip())
    if workers > 1 and len(pairs) > 200:
        chunks = [pairs[i:i + 400] for i in range(0, len(pairs), 400)]
        with ProcessPoolExecutor(workers) as pool:
            verdicts = [v for part in pool.map(_grade_pairs, chunks) for v in part]
    else:
        verdicts = _grade_pairs(pairs)
    k = len(FORMS) + 1
    n = len(verdicts) // k
    flat = [e for g in groups for e in g]
    mc = sum(grader_for(e.data_source, e.ability, bool(e.choices)) == "multiple_choice" for e in flat)
    result = {
        "n": n,
        "multiple_choice_rows": mc,
        "graders": sorted({grader_for(e.data_source, e.ability, bool(e.choices)) for e in flat}),
        **{form: sum(verdicts[i * k + j] for i in range(n)) / n for j, form in enumerate(FORMS)},
        "shuffled": sum(verdicts[i * k + k - 1] for i in range(n)) / n,
        "chance": sum(shuffled_same) / n,
        "failures": {form: [flat[i].reference for i in range(n) if not verdicts[i * k + j]][:10]
                     for j, form in enumerate(FORMS)},
        "shuffled_false_positives": [
            [flat[i].reference, pairs[i * k + k - 1][1]] for i in range(n)
            if verdicts[i * k + k - 1] and not shuffled_same[i]][:10],
    }
    bound = result["chance"] + (0.0 if mc == n else FREE_FORM_SLACK)
    result["shuffled_bound"] = bound
    result["passes"] = (all(result[f] >= MIN_FORM_ACCURACY for f in FORMS)
                        and result["shuffled"] <= bound + 1e-12)
    return result


def table(results: dict) -> str:
    return "\n".join(files.table(["data set", "rows", "grader", "`<answer> REF </answer>`", "`The answer is REF.`", "`\\boxed{REF}`",
                         "shuffled refs correct", "chance (same answer)", "bound", "ok"],
                        ([name, r["n"], ", ".join(r["graders"]), *(f"{100 * r[f]:.1f}%" for f in FORMS),
                          *(f"{100 * r[k]:.2f}%" for k in ("shuffled", "chance", "shuffled_bound")),
                          "yes" if r["passes"] else "NO"] for name, r in results.items()))) + "\n"


# --------------------------------------------------------------------------- the labeled set

def half(row_id: str) -> str:
    """The fixed split of the labeled rows: "dev" when sha256(id) is even, else "held"."""
    return "dev" if hashlib.sha256(row_id.encode()).digest()[-1] % 2 == 0 else "held"


def _scores(pairs: list[tuple[bool, bool]]) -> dict:
    """Confusion counts, precision and recall of `correct` for (graded, labeled) pairs."""
    tp = sum(g and t for g, t in pairs)
    fp = sum(g and not t for g, t in pairs)
    fn = sum(t and not g for g, t in pairs)
    tn = len(pairs) - tp - fp - fn
    return {"n": len(pairs), "tp": tp, "fp": fp, "fn": fn, "tn": tn,
            "precision": tp / (tp + fp) if tp + fp else None,
            "recall": tp / (tp + fn) if tp + fn else None,
            "agreement": (tp + tn) / len(pairs) if pairs else None}


def labeled_agreement(path: Path = LABELED, split: bool = True) -> dict:
    """`grade_short_answer` against the people's labels (see the module's docstring); `split`: by
    the dev/held halves too (the fresh set has none: "fresh" in its disagreements)."""
    from rlpr.grading import grade_short_answer

    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    scored, groups, disagreements = [], {}, []
    for r in rows:
        if r["label"] == "ambiguous":
            continue
        g = grade_short_answer(r["response"], r["reference"], r["aliases"] or None, r["question"])
        pair = (g.correct, r["label"] == "correct")
        scored.append(pair)
        part = half(r["id"]) if split else "fresh"
        for key in ([f"half/{part}"] if split else []) + ([f"run/{r['run']}"] if r.get("run") else []) + [
                f"set/{r['set']}", f"model/{r['model']}-{r['decoding']}", f"kind/{r['set']}:{r['family_or_kind']}"]:
            groups.setdefault(key, []).append(pair)
        if pair[0] != pair[1]:
            disagreements.append({
                "id": r["id"], "half": part, "label": r["label"],
                "graded": "correct" if g.correct else "wrong", "rule": g.rule, "reason": r["reason"],
                "question": r["question"], "reference": r["reference"], "response": r["response"]})
    return {"file": path.relative_to(ROOT).as_posix(), "rows": len(rows),
            "ambiguous_left_out": len(rows) - len(scored), "split": "sha256(id) even: dev, odd: held",
            "overall": _scores(scored), "groups": {k: _scores(v) for k, v in sorted(groups.items())},
            "disagreements": disagreements}


def _pct(x) -> str:
    return "n/a" if x is None else f"{x:.3f}"


def slices(rows: list[tuple[str, dict]]) -> list[str]:
    """A markdown table of (slice name, _scores) rows."""
    return files.table(["slice", "scored rows", "precision", "recall", "agreement", "TP", "FP", "FN", "TN"],
                 ([name, r["n"], _pct(r["precision"]), _pct(r["recall"]), _pct(r["agreement"]), r["tp"], r["fp"],
                   r["fn"], r["tn"]] for name, r in rows))


def disagreements(result: dict, halves: bool) -> list[str]:
    return files.table(["id", *(["half"] if halves else []), "label", "graded", "rule", "label's reason", "response"],
                 ([d["id"], *([d["half"]] if halves else []), d["label"], d["graded"], d["rule"],
                   d["reason"].replace("|", "/"), " ".join(d["response"].split())[:160].replace("|", "\\|")]
                  for d in result["disagreements"]))


def labeled_markdown(result: dict, fresh: list[dict] = ()) -> str:
    """The labeled set's section (by half, set, model and kind; its disagreements) and each fresh set's."""
    groups = result["groups"]
    named = [(k.split("/", 1)[1] + (" half" if k.startswith("half/") else ""), v) for k, v in groups.items()
             if k.startswith(("half/", "set/", "model/"))]
    out = [f"## The free-form grader against people\n\n`grade_short_answer` on `{result['file']}` ({result['rows']} rows, "
           f"{result['ambiguous_left_out']} labeled ambiguous left out): precision and recall of `correct`; halves by "
           "sha256(id) parity (even: dev, odd: held)" + ("; the fresh sets (below): " + ", ".join(
               f"`{f['file']}`" for f in fresh) if fresh else "") + ".\n",
           *slices([("**all**", result["overall"]), *named, *((f"**{f['name']}** (now read)", f["overall"]) for f in fresh)]),
           "\nBy kind of question (set:family or kind):\n",
           *slices([(k.split("/", 1)[1], v) for k, v in groups.items() if k.startswith("kind/")]),
           f"\nThe {len(result['disagreements'])} remaining disagreements:\n", *disagreements(result, True)]
    for f in fresh:
        out += [f"\n### {f['name']}\n\n`{f['file']}` ({f['rows']} rows, {f['ambiguous_left_out']} labeled ambiguous left "
                f"out): {f['made']}; labeled by reading the responses before the grader ran on them. When it was blind: "
                f"{f['blind']}. The current grader:\n",
                *slices([("**all**", f["overall"]), *((k.split("/", 1)[1], v) for k, v in f["groups"].items()
                                                       if k.startswith(("set/", "model/", "run/")))]),
                f"\nIts {len(f['disagreements'])} disagreements:\n", *disagreements(f, False)]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    from rlpr.grading import GRADER_VERSION

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="rows per file (0: all)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--output", default=str(RESULTS / "grader_consistency"))
    parser.add_argument("--labeled-only", action="store_true", help="only the people-labeled sets (OUTPUT_labeled)")
    args = parser.parse_args(argv)
    labeled = labeled_agreement()
    fresh = [{**labeled_agreement(f["path"], split=False), **{k: v for k, v in f.items() if k != "path"}}
             for f in FRESH_SETS if f["path"].is_file()]
    for name, r in (("labeled set", labeled), *((f["name"], f) for f in fresh)):
        print(f"{name}: precision {_pct(r['overall']['precision'])} recall {_pct(r['overall']['recall'])} "
              f"({len(r['disagreements'])} disagreements)", flush=True)
    out = Path(args.output)
    if args.labeled_only:
        files.save({**record.stamp(), "meta": {"grader_version": GRADER_VERSION}, "labeled": labeled, "fresh": fresh},
                   out.with_name(out.name + "_labeled"), lambda r: f"# Grader against people (GRADER_VERSION "
                   f"{GRADER_VERSION})\n\n{files.header(r)}\n\n" + labeled_markdown(labeled, fresh).split("\n", 2)[2])
        return 0
    if not DATA.is_dir():
        print(f"{DATA} is absent: nothing to check", file=sys.stderr)
        return 1
    import tempfile

    results, start = {}, time.time()
    for name, fmt, source, paths in DATASETS:  # (`files` is the harness module)
        t = time.time()
        results[name] = check(load_files(fmt, source, [DATA / f for f in paths], args.limit), workers=args.workers)
        print(f"{name}: {json.dumps({k: v for k, v in results[name].items() if 'fail' not in k})} "
              f"({time.time() - t:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FIXTURES:
            results[f"{fmt} (fixture)"] = check(load_fixture(fmt, Path(tmp)), workers=1)
    meta = {"seconds": round(time.time() - start), "limit": args.limit, "shuffle_seed": SHUFFLE_SEED,
            "min_form_accuracy": MIN_FORM_ACCURACY, "free_form_slack": FREE_FORM_SLACK,
            "grader_version": GRADER_VERSION}
    res = {**record.stamp(),
           "meta": meta, "results": results, "labeled": labeled, "fresh": fresh}
    files.save(res, out, lambda r: f"# Grader self-consistency (GRADER_VERSION {GRADER_VERSION})\n\n"
        f"{files.header(r)}\n\n`python benchmarks/grader_consistency.py` ({meta['seconds']} s). Each row's own reference as "
        "a response in three forms must be graded correct (>= 99%); another row's reference (fixed "
        "shuffle within each file) no more often than chance (the rate at which the two references "
        "are the same answer; +2 points for free-form answers).\n\n"
        + table(results) + "\n" + labeled_markdown(labeled, fresh))
    print(table(results))
    return 0 if all(r["passes"] for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
