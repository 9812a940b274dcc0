"""The learning benchmark's package without training: the variant registry (the OPSD variants and
their controls), the summary's OPSD rows from synthetic runs against hand-computed differences, the
job order, the config check before any job, and the rows file and claims that let workers share
the job list and resume after a kill."""

import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlpr.config import load_config
from rlpr.errors import ConfigError
from rlpr.grading import GRADER_VERSION

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "learning.py"
_spec = importlib.util.spec_from_file_location("bench_learning", BENCH)
_spec.loader.exec_module(importlib.util.module_from_spec(_spec))  # puts benchmarks/ on the path, as running it does
variants = importlib.import_module("learnbench.variants")
tables = importlib.import_module("learnbench.tables")
rows_mod = importlib.import_module("learnbench.rows")
cli = importlib.import_module("learnbench.cli")

OPSD = {"opsd": ["reward.kind=opsd"], "opsd_hybrid": ["reward.kind=opsd_hybrid"],
        "op2sd": ["reward.kind=opsd", "reward.shuffle_references=true"],
        "opsd_context_only": ["reward.kind=opsd", "opsd.context=none"],
        "opsd_no_teacher": ["reward.kind=opsd_no_teacher"]}


def test_opsd_variants_registered_with_their_overrides():
    assert {name: variants.VARIANTS[name] for name in OPSD} == OPSD
    assert variants.OPSD_METHODS == ("opsd", "opsd_hybrid", "opsd_recipe", "opsd_hybrid_recipe")
    assert variants.OPSD_CONTROLS == ("op2sd", "opsd_context_only", "opsd_no_teacher", "op2sd_recipe",
                                      "opsd_context_only_recipe")
    # appended after every earlier variant: their table rows and plot colours stay where they were
    names = list(variants.VARIANTS)
    assert names[:6] == ["rlpr", "rlvr", "rlvr_exact", "no_debias", "no_std_filter", "seq_likelihood"]
    assert names[17:22] == list(OPSD) and len(names) == 36
    # then the precision arms (issue 42), which the default list leaves out
    assert names[22:25] == ["rlpr_exact_b", "rlpr_fp32_update", "rlpr_b_by_policy"]
    # then (issue 58) the OPSD rows of the mismatched teacher template, kept under their own names, and
    # OPSD at its authors' recipe for tracks with worked solutions: all run only when named
    assert names[25:29] == [f"{v}_refcode_template" for v in ("opsd", "opsd_hybrid", "op2sd", "opsd_context_only")]
    assert names[29:33] == ["opsd_recipe", "opsd_hybrid_recipe", "op2sd_recipe", "opsd_context_only_recipe"]
    assert all("opsd.template=reference_code" in variants.VARIANTS[n] for n in names[25:29])
    assert all("opsd.recipe=authors_current" in variants.VARIANTS[n] for n in names[29:33])
    # then (issue 61) RLPR's early-learning settings, one change each against the preset
    assert variants.VARIANTS["rlpr_fill"] == ["algorithm.refill=missing", "algorithm.max_sampling_tries=4"]
    assert names[33:] == ["rlpr_fill", "rlpr_lr2x", "rlpr_fp32"] and variants.VARIANTS["rlpr_lr2x"] == ["trainer.lr=4e-4"]
    assert list(variants.DEFAULT_VARIANTS) == names[:22]
    assert variants.CONTROLS == ("random", "shuffled_reference", "entropy", "self_certainty", "majority")
    assert set(OPSD) <= set(variants.MAIN_VARIANTS)
    with pytest.raises(ValueError, match="registered already"):
        variants.register("opsd", [], "opsd")
    with pytest.raises(ValueError, match="role"):
        variants.register("another", [], "baseline")


def _has_opsd() -> bool:
    try:
        load_config("small", ["reward.kind=opsd"])
        return True
    except ConfigError:
        return False


def test_every_variant_is_a_valid_config():
    """Each variant's overrides load on top of the preset, as the benchmark loads them (the OPSD ones
    where this rlpr has their keys)."""
    for name, overrides in variants.VARIANTS.items():
        if name in OPSD and not _has_opsd():
            continue
        cfg = load_config("small", overrides + ["trainer.seed=0", "trainer.max_steps=20"])
        assert cfg.trainer.max_steps == 20


def test_job_order_runs_every_seed_of_opsd_and_its_controls_first():
    jobs = cli.job_list(["opsd", "nover", "op2sd", "opsd_no_teacher"], 2)
    assert jobs == [("base", None), ("opsd", 0), ("op2sd", 0), ("opsd_no_teacher", 0), ("opsd", 1), ("op2sd", 1),
                    ("opsd_no_teacher", 1), ("nover", 0), ("nover", 1)]


def _run(variant: str, seed, acc: float, greedy: float, pass8: float, entropy: float = 1.0, length: float = 10.0,
         n: int = 100) -> dict:
    """A synthetic finished row: every set the same numbers (what the summary reads of a row)."""
    row = {"variant": variant, "seed": seed, "steps": 0 if seed is None else 20, "n_heldout": n,
           "n_new_items": n, "n_general": n, "seconds": 60.0, "step_s": 3.0, "reward_s": 0.5,
           "curve": [{"step": 0, "acc_curve": acc}],
           "train": [{"step": s, "reward/mean": 0.1, "reward/accuracy": 0.2, "policy/entropy": 1.5}
                     for s in (1, 2, 3)]}
    for when in ("before", "after"):
        values = {"acc": acc, "greedy": greedy, "pass8": pass8, "reward": 0.05, "score_b": 0.08, "format": 0.0,
                  "len": length, "entropy": entropy}
        if when == "before":  # every run starts from the same base
            values = {"acc": 0.2, "greedy": 0.4, "pass8": 0.5, "reward": 0.05, "score_b": 0.08, "format": 0.0,
                      "len": 12.0, "entropy": 2.0}
        row.update({f"{k}_{when}": v for k, v in values.items()})
        for s in ("new_items", "general"):
            row.update({f"{s}_{k}_{when}": values[k] for k in ("acc", "greedy", "pass8")})
    return row


def _opsd_rows() -> list[dict]:
    rows = [_run("base", None, 0.2, 0.4, 0.5, entropy=2.0, length=12.0)]
    rows += [_run("rlpr", s, a, 0.6, 0.7) for s, a in enumerate((0.44, 0.46, 0.45))]
    rows += [_run("opsd", s, a, 0.5, 0.6, entropy=0.3, length=4.0) for s, a in enumerate((0.30, 0.34, 0.32))]
    rows += [_run("op2sd", s, a, 0.45, 0.55) for s, a in enumerate((0.28, 0.28, 0.28))]
    rows += [_run("opsd_no_teacher", s, a, 0.3, 0.4) for s, a in enumerate((0.10, 0.20))]
    return rows


def test_opsd_rows_net_of_their_controls_and_of_rlpr_in_standard_errors():
    runs = _opsd_rows()
    table, markdown = tables.summarise(runs)
    rows, text = tables.opsd_verdict(table, runs[0])  # the base row
    assert text and text in markdown  # the summary carries the section
    by = {(r["comparison"], r["set"], r["metric"]): r for r in rows}
    # opsd (0.32, sd 0.02, 3 seeds) - op2sd (0.28, sd 0, 3 seeds), 100 questions each
    r = by[("opsd - op2sd", "heldout", "Avg@8")]
    error = math.sqrt(0.32 * 0.68 / 100 + 0.02 ** 2 / 3 + 0.28 * 0.72 / 100)
    assert math.isclose(r["net"], 0.04) and math.isclose(r["net_se"], 0.04 / error)
    # the best control per cell: op2sd (0.28) above opsd_no_teacher (0.15)
    best = by[("opsd - best control", "heldout", "Avg@8")]
    assert best["b"] == "op2sd" and math.isclose(best["net_se"], r["net_se"])
    r = by[("opsd - opsd_no_teacher", "general", "greedy")]  # 0.5 - 0.3; no_teacher's sd 0 over 2 seeds
    assert math.isclose(r["net_se"], 0.2 / math.sqrt(0.5 * 0.5 / 100 + 0.3 * 0.7 / 100))
    # RLPR (0.45, sd 0.01) minus OPSD (0.32, sd 0.02)
    r = by[("rlpr - opsd", "new_items", "Avg@8")]
    error = math.sqrt(0.45 * 0.55 / 100 + 0.01 ** 2 / 3 + 0.32 * 0.68 / 100 + 0.02 ** 2 / 3)
    assert math.isclose(r["net"], 0.13) and math.isclose(r["net_se"], 0.13 / error)
    # every comparison on every set and metric: 2 controls + best + RLPR, 3 sets x 3 metrics
    assert len(rows) == 4 * 9
    assert "| opsd - best control | in-family held-out | +4.0 (op2sd; " in text
    # the collapse monitors of every OPSD row
    assert "| opsd | 0.30 | 1.50 | 4.0 | 0.5 |" in text and "| opsd_no_teacher | 1.00 |" in text
    assert "| in-family held-out | Avg@8 | 20.0 | 45.0 | 32.0 | 28.0 | 15.0 |" in text


def test_no_opsd_rows_no_opsd_section():
    rows = [r for r in _opsd_rows() if r["variant"] in ("base", "rlpr")]
    rows.append(_run("random", 0, 0.2, 0.4, 0.5))
    table, markdown = tables.summarise(rows)
    assert tables.opsd_verdict(table, rows[0]) == ([], "")
    assert "OPSD" not in markdown and "RLPR - best control" in markdown
    # an OPSD control alone still shows its rows (no method to net it against)
    rows.append(_run("op2sd", 0, 0.28, 0.45, 0.55))
    result, text = tables.opsd_verdict(tables.summarise(rows)[0], rows[0])
    assert result == [] and "| op2sd |" in text



def test_a_retired_variants_rows_stay_in_the_table():
    """precision_arms.jsonl holds `rlpr_b_from_bf16_cache`, a name the registry no longer has: a --regrade
    rewrote its rows and the summary dropped them. Registry order first, then such names in row order."""
    rows = [r for r in _opsd_rows() if r["variant"] in ("base", "rlpr")]
    rows += [_run("an_old_arm", s, 0.4, 0.5, 0.6) for s in (0, 1)] + [_run("random", 0, 0.2, 0.4, 0.5)]
    table, markdown = tables.summarise(rows)
    assert [e["variant"] for e in table] == ["base", "rlpr", "random", "an_old_arm"]
    assert next(e for e in table if e["variant"] == "an_old_arm")["seeds"] == [0, 1]
    assert "| an_old_arm | 2 |" in markdown

def test_summary_json_carries_the_opsd_rows(tmp_path):
    settings = {"preset": "small", "steps": 20, "heldout": 203, "samples": 8, "set": [], "transfer_questions": 0,
                "transfer": rows_mod.transfer_fingerprint(), "grader_version": GRADER_VERSION}
    out = tmp_path / "learning"
    lines = [{**r, "settings": settings, "grader_version": GRADER_VERSION} for r in _opsd_rows()]
    out.with_suffix(".jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert cli.main("t", ["--report", "--output", str(out), "--workdir", str(tmp_path / "work")]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    opsd = data["models"]["smollm2"]["opsd"]
    assert {r["comparison"] for r in opsd} >= {"opsd - op2sd", "opsd - best control", "rlpr - opsd"}
    assert {r["variant"] for r in data["table"]} == {"base", "rlpr", "opsd", "op2sd", "opsd_no_teacher"}
    assert all(r["entropy_after"] is not None and r["len_after"] for r in data["runs"])
    assert "On-policy self-distillation (OPSD)" in out.with_suffix(".md").read_text()


def test_bad_override_stops_before_any_job(tmp_path):
    """One line naming the variant and the key, no traceback, nothing claimed."""
    result = subprocess.run([sys.executable, str(BENCH), "--variants", "rlpr", "--output", str(tmp_path / "x"),
                             "--workdir", str(tmp_path / "work"), "--set", "algorithm.std_filter=maybe"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "variant base (the preset)" in result.stderr and "std_filter" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "work" / "claims").exists() and not (tmp_path / "x.jsonl").exists()


def _ended_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_claims_resume_jobs_whose_worker_ended(tmp_path, capsys):
    settings = {"steps": 1}
    assert rows_mod.claim(tmp_path, ("rlpr", 0), settings)
    assert not rows_mod.claim(tmp_path, ("rlpr", 0), settings)  # this (live) process holds it
    path = next((tmp_path / "claims").glob("rlpr-0-*"))
    owner = json.loads(path.read_text())
    path.write_text(json.dumps({**owner, "pid": _ended_pid()}))  # its worker was killed mid-run
    assert rows_mod.claim(tmp_path, ("rlpr", 0), settings)
    assert "taking over rlpr-0-" in capsys.readouterr().out
    assert json.loads(path.read_text())["pid"] == os.getpid()
    path.write_text("")  # a claim from before claims named their worker: left alone, as then
    assert not rows_mod.claim(tmp_path, ("rlpr", 0), settings)
    path.write_text(json.dumps({**owner, "pid": _ended_pid(), "host": "another-host"}))  # can't tell: alive
    assert not rows_mod.claim(tmp_path, ("rlpr", 0), settings)


def test_rows_survive_a_torn_line_and_concurrent_writers(tmp_path, capsys):
    log = tmp_path / "learning.jsonl"
    rows_mod.append_row(log, {"variant": "base", "seed": None})
    with log.open("a") as f:
        f.write('{"variant": "rlpr", "seed": 0, "acc')  # a writer killed mid-write
    rows_mod.append_row(log, {"variant": "rlpr", "seed": 1})
    assert [r["seed"] for r in rows_mod.load_rows(log)] == [None, 1]
    assert f"{log}:2: skipping a line" in capsys.readouterr().out
    # two processes appending 200 large rows each at once: every row whole, none lost
    code = ("import sys; sys.path.insert(0, {bench!r}); from learnbench.rows import append_row; from pathlib import Path\n"
            "for i in range(200): append_row(Path({log!r}), {{'variant': sys.argv[1], 'seed': i, 'pad': 'x' * 20000}})")
    code = code.format(bench=str(BENCH.parent), log=str(log))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    procs = [subprocess.Popen([sys.executable, "-c", code, name], env=env) for name in ("a", "b")]
    assert all(p.wait(timeout=300) == 0 for p in procs)
    with rows_mod.rewriting(log) as rows:  # a rewrite keeps every row it read
        rows.append({"variant": "c", "seed": 0})
    rows = rows_mod.load_rows(log)
    assert sorted(r["seed"] for r in rows if r["variant"] == "a") == list(range(200))
    assert sorted(r["seed"] for r in rows if r["variant"] == "b") == list(range(200))
    assert rows[-1]["variant"] == "c" and len(rows) == 403


def test_teacher_gap_numbers_by_hand(tmp_path):
    """--teacher-gap's per-family numbers: greedy, Avg@k, pass@k as the learning rows grade them, and
    the gap (teacher Avg@k minus student Avg@k) and room (pass@k minus Avg@k) its table writes."""
    gap = importlib.import_module("learnbench.teacher_gap")
    kept = [{"greedy_correct": True, "samples_correct": [True, False, False, False], "samples": ["a b", "c"] * 2},
            {"greedy_correct": False, "samples_correct": [False] * 4, "samples": ["d e f"] * 4}]
    numbers = gap._numbers(kept)
    assert numbers == {"greedy": 0.5, "avg": 0.125, "pass": 0.5, "len": 2.25}  # 18 words over 8 samples
    family = {"questions": 2, "greedy": 0.5, "avg": 0.125, "pass": 0.5, "len_words": 2.0, "teacher_greedy": 1.0,
              "teacher_avg": 0.25, "teacher_pass": 1.0, "gap": 0.125, "room": 0.375}
    result = {"preset": "reasoning", "samples": 4, "max_new_tokens": 96, "temperature": 1.0, "template": "steps",
              "teacher_template": "matched", "families": {"add_two_digit": family}, "teacher_prompt_example": "T"}
    text = gap.write(result, tmp_path / "gap")
    assert "| add_two_digit | 2 | 50.0 | 12.5 | 50.0 | +37.5 | 25.0 | 100.0 | +12.5 | 2 |" in text
    assert json.loads((tmp_path / "gap.json").read_text())["families"]["add_two_digit"]["gap"] == 0.125
