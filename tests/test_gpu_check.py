"""benchmarks/gpu_check.py (issue 36) kept from rotting between GPU loans: its CPU dry run (`--device
cpu`, a tiny model, 2 steps of 8-token responses: every part of the GPU check on the CPU), its
tokenizer, and the wheels and requirements of the GPU machine's image (benchmarks/gpu_wheels.py)."""

from __future__ import annotations

import json
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402
import gpu_wheels  # noqa: E402

pytestmark = pytest.mark.integration


def test_cpu_dry_run_runs_every_part_of_the_gpu_check(tmp_path):
    tick = time.perf_counter()
    rc = gpu_check.main(["--device", "cpu", "--out", str(tmp_path), "--steps", "2", "--response-tokens", "8"])
    wall = time.perf_counter() - tick
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
    for phase in gpu_check.PHASES:
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

    md = (tmp_path / "gpu_check.md").read_text()
    for heading in ("## CUDA tests", "## tiny: `--preset paper`", "## Score B", "## Resume"):
        assert heading in md
    assert wall < 120, wall  # about 25 s on 2 shared cores


def test_synthetic_tokenizer_has_the_vocabulary_and_decodes_every_id():
    tok = gpu_check.synthetic_tokenizer(4096)
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
        have = gpu_wheels.IMAGE_VERSIONS.get(gpu_wheels.norm(req.name))
        if have is not None:
            assert req.specifier.contains(have), (str(req), have)
    # what the image lacks travels as wheels (math-verify's own needs are checked in the wheels' metadata)
    lacking = {gpu_wheels.norm(r.name) for r in deps} - gpu_wheels.IMAGE
    assert lacking <= {gpu_wheels.norm(n) for n in gpu_wheels.CARRIED}, lacking


def test_docs_give_the_one_command_for_a_gpu_machine():
    assert gpu_wheels.COMMAND in (ROOT / "docs" / "distributed.md").read_text()
    assert ".whl/" in (ROOT / ".gitignore").read_text().split()
