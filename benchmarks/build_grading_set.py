"""Responses of the embedded model to grade by hand: the candidates of tests/data/grading/.

The hand-labeled grading set (tests/data/grading/labeled_responses.jsonl, issue 28) needs real
responses of the model rlpr trains, written the way training and `rlpr eval` see them. This script
generates them with rlpr's own machinery and grades nothing (the labels are a person's):

- prompts: the demo preset's (`data.template=plain`, the model's chat template, no prefill), on
  three sets of questions: the demo preset's held-out questions (`demo_examples("val", ...)` with
  the preset's families, size, seed and `demo_val_every`: what `rlpr train` evaluates),
  examples/general_questions.jsonl (general short-answer questions of other kinds, written for the
  project) and examples/family_new_items.jsonl (new items of the demo families, not in the demo
  dictionaries);
- models: the base model (`model.path=default`) and, with `--run`, a trained run's latest
  checkpoint (`rlpr.model.loading.load_policy`, its LoRA adapter merged);
- decoding: greedy, and `--samples` samples per question at the preset's rollout temperature and
  top_p, seeded as `rlpr eval` seeds them (`seed * SEED_MIX + question index`, one RNG per
  sample), through rlpr's rollout engine (`rollout.engine`, `model.rollout_dtype`).

    rlpr train trainer.name=grading-demo model.threads=1 trainer.output_dir=/tmp/rlpr-grading-runs
    python benchmarks/build_grading_set.py --run /tmp/rlpr-grading-runs/grading-demo
    python benchmarks/build_grading_set.py --pick 540 --more-greedy 72 --more-forms 30   # the subset to label

Writes tests/data/grading/candidates.jsonl (every response, unlabeled) and candidates.meta.json
(settings, checkpoint, timings); `--pick N` writes tests/data/grading/to_label.jsonl: a seeded
subset stratified over model x decoding x set (one sample per sampled question, duplicates of the
same response to the same question dropped), then `--more-greedy` greedy rows and `--more-forms`
rows with a parenthetical or a quoted answer followed by more text (picked by the text, never by a
grader): the rows that were then labeled by reading them.

`--fresh` makes a second, fresh set to label (tests/data/grading/fresh_labeled_responses.jsonl:
responses nobody read while writing the grader's rules), base model only:

    python benchmarks/build_grading_set.py --fresh --seed 31 --pick 250 --out /tmp/fresh_to_label.jsonl

The questions are the same three sets, but the demo ones are every held-out question of the preset
(`pool_size("val", ...)`: 203, of which the preset evaluates the first 100); greedy responses are
made only for questions with no greedy response in candidates.jsonl (greedy decoding ignores the
seed, so on those it would repeat responses already read), `--samples` (1 here) sampled ones for
every question, seeded with a `--seed` that no earlier generation, pick or check used (0, 1 and
2024 are refused). A response whose text (whitespace collapsed) is already a response to the same
question in candidates.jsonl is dropped. Then every fresh greedy row is kept and the rest of
`--pick` is filled with one seeded sample per question, stratified over the three sets; ids get a
`fresh<seed>-` prefix. Nothing is graded. A later fresh set (`fresh2_labeled_responses.jsonl`,
seed 77, written after GRADER_VERSION 3) also leaves out every response and greedy question of the
earlier fresh sets, so it holds sampled responses only.

`--from-responses` makes a fresh set of TRAINED models' sampled responses (fresh set 3,
`fresh3_labeled_responses.jsonl`, written after GRADER_VERSION 4) from the responses
benchmarks/learning.py saves per run (`learning_responses/VARIANT-SEED-HASH.jsonl.gz`: per question
the reference, its aliases and 8 samples at the rollout temperature). Nothing is generated: the
files are only read (finished runs; the benchmark writes each whole and renames it into place), and
the grades they hold (`greedy_correct`, `samples_correct`, from the grader the run had) are dropped
before anything is written, so the labeler never sees a verdict:

    python benchmarks/build_grading_set.py --seed 53 --pick 150 --out /tmp/fresh53_to_label.jsonl \
        --from-responses benchmarks/results/learning_responses/{shuffled_reference-0-cdc062b22f,rlpr-0-b60d6c9eb2}.jsonl.gz

Only the final responses are used (the held-out, new-item and general sets; the `curve` rows are an
intermediate step's). A response whose text (whitespace collapsed) is already a response to the
same question in candidates.jsonl or an earlier fresh set is dropped, and so are a question's
repeated samples; then, seeded, one sample per (run, question), the same number per run x set, a
question used for one run avoided for the others while others are left. Ids:
`fresh<seed>-<run>-sampled-<question id>-<sample index>`; `model` is `trained`, `run` names the file.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "grading"
GENERAL = ROOT / "examples" / "general_questions.jsonl"
NEW_ITEMS = ROOT / "examples" / "family_new_items.jsonl"
SETS = ("demo_family", "new_item", "general")
USED_SEEDS = (0, 1, 2024)  # candidates.jsonl's generation and training (0), its picks (0, 1), the re-read (2024)


def question_sets(cfg, all_held_out: bool = False) -> dict[str, list[tuple[object, str]]]:
    """set name -> [(Example, family or kind)], prompts built as the preset's training builds them;
    `all_held_out`: every held-out demo question, not only the preset's `demo_val_size` first."""
    from rlpr.data.demo_tasks import demo_examples, pool_size
    from rlpr.data.loading import iter_jsonl, load_examples

    d = cfg.data
    n = pool_size("val", d.demo_seed, d.demo_families, d.demo_val_every) if all_held_out else d.demo_val_size
    demo = demo_examples("val", n=n, seed=d.demo_seed, template=d.template,
                         families=d.demo_families, val_every=d.demo_val_every)
    out = {"demo_family": [(e, e.data_source.removeprefix("demo/")) for e in demo]}
    for name, path, field in (("new_item", NEW_ITEMS, "family"), ("general", GENERAL, "kind")):
        rows = [row for _, row in iter_jsonl(path)]
        out[name] = list(zip(load_examples(path, template=d.template), (r[field] for r in rows)))
    return out


def generate(cfg, checkpoint, sets, samples: int, max_new_tokens: int, seed: int, model_name: str,
             skip_greedy: frozenset = frozenset(), id_prefix: str = "") -> list[dict]:
    """Greedy and sampled responses of one model to every question of every set (greedy: not to the
    questions in `skip_greedy`)."""
    from rlpr.data.demo_tasks import acceptable_answers
    from rlpr.evaluation.benchmark import prompt_ids
    from rlpr.model.loading import load_policy
    from rlpr.model.precision import resolve_rollout_dtype
    from rlpr.rollout.engines import build_engine
    from rlpr.seeding import SEED_MIX

    model, tokenizer = load_policy(cfg.model.path, checkpoint)
    engine = build_engine(model, tokenizer, cfg.rollout,
                          resolve_rollout_dtype(cfg.model.rollout_dtype, next(model.parameters()).device))
    rows = []
    for set_name in SETS:
        for decoding, k, temperature in (("greedy", 1, 0.0), ("sampled", samples, cfg.rollout.temperature)):
            items = [(e, kind) for e, kind in sets[set_name]
                     if decoding == "sampled" or e.prompt[-1]["content"] not in skip_greedy]
            if not k or not items:
                continue
            ids = [prompt_ids(tokenizer, e.prompt) for e, _ in items]
            t0 = time.time()
            rollouts = engine.generate(ids, k, max_new_tokens=max_new_tokens, temperature=temperature,
                                       top_p=cfg.rollout.top_p,
                                       seeds=[seed * SEED_MIX + i for i in range(len(ids))])
            counts = [0] * len(items)
            for r in rollouts:
                e, kind = items[r.prompt_index]
                j = counts[r.prompt_index]
                counts[r.prompt_index] += 1
                acceptable = e.acceptable or (acceptable_answers(e.reference) if set_name == "demo_family" else [])
                rows.append({
                    "id": f"{id_prefix}{model_name}-{decoding}-{e.uid}-{j}", "model": model_name, "decoding": decoding,
                    "sample": j, "set": set_name, "family_or_kind": kind, "question": e.prompt[-1]["content"],
                    "reference": e.reference, "aliases": [a for a in acceptable if a != e.reference],
                    "response": r.text, "n_tokens": len(r.token_ids), "finished": r.finished})
            print(f"{model_name} {decoding} {set_name}: {len(rollouts)} responses in {time.time() - t0:.0f} s",
                  flush=True)
    return rows


def pick(rows: list[dict], n: int, seed: int) -> list[dict]:
    """A seeded subset of about n rows, stratified over model x decoding x set: one random sample
    per sampled question, and a response already picked for the same question left out."""
    rng = random.Random(seed)
    strata: dict[tuple, list[dict]] = {}
    by_q: dict[tuple, list[dict]] = {}
    for r in rows:
        by_q.setdefault((r["model"], r["decoding"], r["set"], r["question"]), []).append(r)
    for (model, decoding, set_name, _), group in by_q.items():
        strata.setdefault((model, decoding, set_name), []).append(rng.choice(group))
    per = -(-n // len(strata))
    seen: set[tuple] = set()
    out = []
    for key in sorted(strata):
        pool = strata[key][:]
        rng.shuffle(pool)
        taken = 0
        for r in pool:
            if taken == per:
                break
            k = (r["question"], " ".join(r["response"].split()))
            if k in seen:
                continue
            seen.add(k)
            out.append(r)
            taken += 1
    rng.shuffle(out)
    return out


# Forms the issue names as hard for a rule grader, picked by the response text alone (never by a
# grader's verdict): a parenthetical after a word, a quoted phrase ending in a period and more text.
FORMS = re.compile(r"\w \([^)]{1,30}\)|[\"'][^\"']{1,30}[.!][\"']\s+\S")


def pick_more(rows: list[dict], chosen: list[dict], greedy: int, forms: int, seed: int) -> list[dict]:
    """A second seeded batch beside `chosen`: `greedy` more greedy rows (stratified over model x set,
    to raise the share of correct responses: sampled ones are mostly wrong) and `forms` rows whose
    response has a form of FORMS; rows already chosen, or the same response to the same question,
    left out."""
    rng = random.Random(seed + 1)
    seen = {(r["question"], " ".join(r["response"].split())) for r in chosen}
    taken_ids = {r["id"] for r in chosen}

    def fresh(r):
        return r["id"] not in taken_ids and (r["question"], " ".join(r["response"].split())) not in seen

    def take(r):
        seen.add((r["question"], " ".join(r["response"].split())))
        taken_ids.add(r["id"])
        return r

    out = []
    strata: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["decoding"] == "greedy":
            strata.setdefault((r["model"], r["set"]), []).append(r)
    per = -(-greedy // len(strata)) if greedy else 0
    for key in sorted(strata):
        pool = strata[key][:]
        rng.shuffle(pool)
        out += [take(r) for r in [r for r in pool if fresh(r)][:per]]
    pool = [r for r in rows if FORMS.search(r["response"])]
    rng.shuffle(pool)
    for r in pool:
        if len(out) == per * len(strata) + forms:
            break
        if fresh(r):
            out.append(take(r))
    rng.shuffle(out)
    return out


def _key(r: dict) -> tuple[str, str]:
    return r["question"], " ".join(r["response"].split())


def pick_fresh(rows: list[dict], seen: list[dict], n: int, seed: int) -> list[dict]:
    """The fresh rows to label: those whose response to the question is not in `seen`; every
    greedy one, then one seeded sample per question, stratified over the sets, up to n rows."""
    rng = random.Random(seed)
    known = {_key(r) for r in seen}
    rows = [r for r in rows if _key(r) not in known]
    out = [r for r in rows if r["decoding"] == "greedy"]
    taken = {_key(r) for r in out}
    by_q: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["decoding"] == "sampled":
            by_q.setdefault((r["set"], r["question"]), []).append(r)
    strata: dict[str, list[dict]] = {}
    for (set_name, _), group in by_q.items():
        strata.setdefault(set_name, []).append(rng.choice(group))
    left = max(0, n - len(out))
    for i, set_name in enumerate(sorted(strata)):
        per = left // len(strata) + (i < left % len(strata))
        pool = strata[set_name][:]
        rng.shuffle(pool)
        k = 0
        for r in pool:
            if k == per:
                break
            if _key(r) not in taken:
                taken.add(_key(r))
                out.append(r)
                k += 1
    rng.shuffle(out)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", default=None, help="a trained run directory (its latest checkpoint) or checkpoints/step_N")
    p.add_argument("--preset", default="demo")
    p.add_argument("--samples", type=int, default=None, help="sampled responses per question (2; 1 with --fresh)")
    p.add_argument("--max-new-tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", "--out", default=None,
                   help="candidates.jsonl (default), or with --fresh the rows to label (default /tmp/fresh_to_label.jsonl)")
    p.add_argument("--fresh", action="store_true",
                   help="a fresh set to label: base model, new --seed, responses not in candidates.jsonl, --pick rows")
    p.add_argument("--pick", type=int, default=0, help="write N seeded, stratified rows of --output to to_label.jsonl")
    p.add_argument("--more-greedy", type=int, default=0, help="with --pick: a second batch of N more greedy rows")
    p.add_argument("--from-responses", nargs="+", default=None, metavar="FILE",
                   help="a fresh set of trained runs' sampled responses from learning.py's .jsonl.gz files")
    p.add_argument("--more-forms", type=int, default=0,
                   help="with --pick: a second batch of N rows with a parenthetical or a quoted answer and more text")
    args = p.parse_args()
    if args.from_responses:
        return fresh_trained(args)
    if args.fresh:
        return fresh(args)
    args.samples = 2 if args.samples is None else args.samples
    out = Path(args.output or OUT / "candidates.jsonl")
    if args.pick:
        with open(out, encoding="utf-8") as f:  # not splitlines(): responses may hold U+2028
            rows = [json.loads(line) for line in f]
        chosen = pick(rows, args.pick, args.seed)
        for r in chosen:
            r["batch"] = 1
        for r in pick_more(rows, chosen, args.more_greedy, args.more_forms, args.seed):
            chosen.append({**r, "batch": 2})
        with open(out.parent / "to_label.jsonl", "w", encoding="utf-8") as f:
            for r in chosen:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(f"wrote {len(chosen)} rows to {out.parent / 'to_label.jsonl'}")
        return 0

    import torch

    from rlpr.config import load_config
    from rlpr.train.setup import seed_everything

    cfg = load_config(args.preset, [f"model.threads={args.threads}"])
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    sets = question_sets(cfg)
    models = [("base", None)] + ([("trained", args.run)] if args.run else [])
    rows, timings = [], {}
    for name, checkpoint in models:
        t0 = time.time()
        rows += generate(cfg, checkpoint, sets, args.samples, args.max_new_tokens, args.seed, name)
        timings[name] = round(time.time() - t0, 1)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    from rlpr.model.loading import find_checkpoint

    meta = {"preset": args.preset, "template": cfg.data.template, "model": cfg.model.path,
            "checkpoint": str(find_checkpoint(args.run)) if args.run else None,
            "samples": args.samples, "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p,
            "max_new_tokens": args.max_new_tokens, "seed": args.seed, "threads": args.threads,
            "rollout_dtype": cfg.model.rollout_dtype, "engine": cfg.rollout.engine,
            "questions": {k: len(v) for k, v in sets.items()}, "responses": len(rows),
            "generation_seconds": timings}
    (out.parent / "candidates.meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {len(rows)} responses to {out}")
    return 0


def fresh(args) -> int:
    """--fresh: generate, drop responses already in candidates.jsonl, pick, write (see the docstring)."""
    if args.seed in USED_SEEDS:
        raise SystemExit(f"--seed {args.seed} was used for candidates.jsonl; take another for a fresh set")
    if args.run:
        raise SystemExit("--fresh generates with the base model only")
    import torch

    from rlpr.config import load_config
    from rlpr.train.setup import seed_everything

    seen = []
    for path in [OUT / "candidates.jsonl", *sorted(OUT.glob("fresh*_labeled_responses.jsonl"))]:
        with open(path, encoding="utf-8") as f:  # every response already read, and its seed
            seen += [json.loads(line) for line in f if line.strip()]
    if any(r["id"].startswith(f"fresh{args.seed}-") for r in seen):
        raise SystemExit(f"--seed {args.seed} made an earlier fresh set; take another")
    samples = 1 if args.samples is None else args.samples
    cfg = load_config(args.preset, [f"model.threads={args.threads}"])
    torch.set_num_threads(args.threads)
    seed_everything(args.seed)
    sets = question_sets(cfg, all_held_out=True)
    skip = frozenset(r["question"] for r in seen if r["decoding"] == "greedy" and r["model"] == "base")
    t0 = time.time()
    rows = generate(cfg, None, sets, samples, args.max_new_tokens, args.seed, "base",
                    skip_greedy=skip, id_prefix=f"fresh{args.seed}-")
    seconds = round(time.time() - t0, 1)
    chosen = pick_fresh(rows, seen, args.pick or 250, args.seed)
    out = Path(args.output or "/tmp/fresh_to_label.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in chosen:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    known = {_key(r) for r in seen}
    meta = {"preset": args.preset, "template": cfg.data.template, "model": cfg.model.path, "seed": args.seed,
            "samples": samples, "temperature": cfg.rollout.temperature, "top_p": cfg.rollout.top_p,
            "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "rollout_dtype": cfg.model.rollout_dtype, "engine": cfg.rollout.engine,
            "questions": {k: len(v) for k, v in sets.items()}, "responses": len(rows),
            "already_in_candidates": sum(_key(r) in known for r in rows), "picked": len(chosen),
            "generation_seconds": seconds}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(meta))
    print(f"wrote {len(chosen)} rows to {out}")
    return 0


# learning.py's sets -> the grading set's names (the `curve` rows, an intermediate step's, are left out)
LEARNING_SETS = {"heldout": "demo_family", "new_items": "new_item", "general": "general"}


def _seen_responses(seed: int) -> list[dict]:
    """Every response already read (candidates.jsonl and the fresh sets); a seed an earlier set used
    is refused."""
    if seed in USED_SEEDS:
        raise SystemExit(f"--seed {seed} was used for candidates.jsonl; take another for a fresh set")
    seen = []
    for path in [OUT / "candidates.jsonl", *sorted(OUT.glob("fresh*_labeled_responses.jsonl"))]:
        with open(path, encoding="utf-8") as f:
            seen += [json.loads(line) for line in f if line.strip()]
    if any(r["id"].startswith(f"fresh{seed}-") for r in seen):
        raise SystemExit(f"--seed {seed} made an earlier fresh set; take another")
    return seen


def trained_rows(path: Path) -> list[dict]:
    """The sampled responses of one learning.py run file as grading-set rows, with no grade: only
    the fields named here are copied (never `greedy_correct` or `samples_correct`)."""
    import gzip

    kinds = {}
    for name, field in ((NEW_ITEMS, "family"), (GENERAL, "kind")):
        with open(name, encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    row = json.loads(line)
                    kinds[row["id"]] = row[field]
    run = path.name.removesuffix(".jsonl.gz")
    rows = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r["set"] not in LEARNING_SETS:
                continue
            kind = r["data_source"].removeprefix("demo/") if r["set"] == "heldout" else kinds[r["uid"]]
            question = r["prompt"][-1]["content"]
            aliases = [a for a in r.get("acceptable") or [] if a != r["reference"]]
            for i, response in enumerate(r["samples"]):
                rows.append({"id": f"{run}-sampled-{r['uid']}-{i}", "model": "trained", "run": run,
                             "decoding": "sampled", "set": LEARNING_SETS[r["set"]], "family_or_kind": kind,
                             "question": question, "reference": r["reference"], "aliases": aliases,
                             "response": response})
    return rows


def pick_trained(runs: dict[str, list[dict]], seen: list[dict], n: int, seed: int) -> list[dict]:
    """Seeded: one sample per (run, question), n spread evenly over run x set, a question taken for
    one run avoided for the others while other questions are left (see the docstring)."""
    rng = random.Random(seed)
    known = {_key(r) for r in seen}
    strata = [(run, s) for run in sorted(runs) for s in SETS]
    out, used_questions = [], set()
    for i, (run, set_name) in enumerate(strata):
        per = n // len(strata) + (i < n % len(strata))
        by_q: dict[str, list[dict]] = {}
        for r in runs[run]:
            if r["set"] == set_name and _key(r) not in known:
                by_q.setdefault(r["question"], []).append(r)
        questions = sorted(by_q)
        rng.shuffle(questions)
        questions.sort(key=lambda q: q in used_questions)  # stable: unused questions first, in shuffled order
        for q in questions[:per]:
            distinct = {}
            for r in by_q[q]:  # a question's repeated samples count once
                distinct.setdefault(" ".join(r["response"].split()), r)
            out.append(rng.choice(list(distinct.values())))
            used_questions.add(q)
    rng.shuffle(out)
    return out


def fresh_trained(args) -> int:
    """--from-responses: read learning.py's saved responses, drop what was read before, pick, write."""
    seen = _seen_responses(args.seed)
    runs, files = {}, {}
    for name in args.from_responses:
        path = Path(name)
        rows = trained_rows(path)
        runs[rows[0]["run"]] = rows
        files[rows[0]["run"]] = {"file": path.as_posix(), "bytes": path.stat().st_size,
                                 "mtime_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(path.stat().st_mtime))}
    chosen = [{**r, "id": f"fresh{args.seed}-{r['id']}"} for r in pick_trained(runs, seen, args.pick or 150, args.seed)]
    out = Path(args.output or f"/tmp/fresh{args.seed}_to_label.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for r in chosen:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    known = {_key(r) for r in seen}
    meta = {"seed": args.seed, "runs": files, "responses": {k: len(v) for k, v in runs.items()},
            "already_read": sum(_key(r) in known for v in runs.values() for r in v), "picked": len(chosen)}
    out.with_suffix(".meta.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(meta))
    print(f"wrote {len(chosen)} rows to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
