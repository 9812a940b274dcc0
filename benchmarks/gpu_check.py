"""The CUDA path in one command (issue 36; docs/distributed.md, "The GPU check"): everything rlpr promises
on a GPU, checked in at most 8 minutes on one H100, nothing downloaded, written to OUT/gpu_check.{json,md}.

    python benchmarks/gpu_check.py --out DIR                  # on a GPU machine
    python benchmarks/gpu_check.py --device cpu --out DIR     # the CPU dry run (tests/test_gpu_check.py)
    python benchmarks/gpu_check.py --resummarize gpu_check.json learning_cuda.jsonl

Each part runs against the deadline `--budget-s` (one that would not fit is recorded as skipped; the JSON
is rewritten after every part), the short ones first: the CUDA tests (tests/test_cuda.py), resume and
score B on the device, `decode` and `learning_cuda` (gpubench/decode.py, learning.py), then the model
shapes trained against `rlpr plan` (gpubench/train.py). This file keeps the command line, the budget,
the tests' and the environment's parts; gpubench/ holds the rest, imports running down.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))  # its parts in files of their own (module docstring)
from gpubench.decode import decode_part  # noqa: E402
from gpubench.learning import learning_part  # noqa: E402
from gpubench.report import resummarize, write_report  # noqa: E402
from gpubench.train import GiB, resume_check, score_b_comparison, train_shape  # noqa: E402
from harness import record  # noqa: E402

HARD_EXTRA_S = 90


# -- the CUDA tests, the environment ---------------------------------------------------------------
def cuda_tests(out: Path, timeout: float) -> dict:
    import xml.etree.ElementTree as ET

    junit = out / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", str(ROOT / "tests" / "test_cuda.py"), "-q", "-p", "no:cacheprovider",
           f"--junitxml={junit}", "-rs"]
    tick = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "seconds": time.perf_counter() - tick}
    result = {"returncode": proc.returncode, "seconds": time.perf_counter() - tick,
              "output_tail": (proc.stdout + proc.stderr)[-3000:]}
    if junit.exists():
        suite = ET.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        result.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
        result["failed"] = [f"{case.get('name')}: {(case.find('failure') if case.find('failure') is not None else case.find('error')).get('message', '')[:300]}"
                            for case in suite.iter("testcase")
                            if case.find("failure") is not None or case.find("error") is not None]
    return result


def environment(device: str) -> dict:
    import torch

    env = {**record.versions("peft", "accelerate", "safetensors", "tokenizers", "gguf", "math_verify"),
           "cuda": torch.version.cuda, "device": device, "hostname": platform.node(), "cpu_count": os.cpu_count(),
           "rlpr_source": rlpr_source(), "commit": record.commit(), "cpu": record.cpu_name(),
           "requirements": requirements_met()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=torch.cuda.get_device_name(0), gpu_memory_gib=props.total_memory / GiB,
                   multiprocessors=props.multi_processor_count, capability=f"{props.major}.{props.minor}",
                   bf16_supported=torch.cuda.is_bf16_supported(), cudnn=torch.backends.cudnn.version())
    return env


def requirements_met() -> dict:
    """rlpr's own requirements (its installed metadata) against what is installed: {name: [spec, version, ok]}."""
    from importlib.metadata import PackageNotFoundError, requires, version

    from packaging.requirements import Requirement

    out = {}
    for line in requires("rlpr") or []:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue  # an extra's
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        out[req.name] = [str(req.specifier), have, have is not None and req.specifier.contains(have, prereleases=True)]
    return out


def rlpr_source() -> dict:
    """Where rlpr was imported from, and whether its .py files are this tree's (a wheel built from an
    older commit would check old code)."""
    import rlpr

    installed = Path(rlpr.__file__).parent
    tree = ROOT / "src" / "rlpr"

    def digest(folder: Path) -> str:
        h = hashlib.sha256()
        for f in sorted(folder.rglob("*.py")):
            h.update(str(f.relative_to(folder)).encode() + b"\0" + f.read_bytes())
        return h.hexdigest()[:16]

    same = installed.resolve() == tree.resolve() or (tree.is_dir() and digest(installed) == digest(tree))
    return {"path": str(installed), "matches_tree": same}


class PartDeadline(Exception):
    """A part ran past the budget + HARD_EXTRA_S (raised by SIGALRM in the main thread)."""


def _deadline(signum, frame):
    raise PartDeadline(f"stopped: it ran past the budget + {HARD_EXTRA_S} s")


PARTS_ORDER = ("cuda_tests", "resume", "score_b", "decode", "learning_cuda", "models")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gpu_check_out", help="folder for gpu_check.json / gpu_check.md")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--parts", nargs="*", default=None, choices=PARTS_ORDER,
                    help="the parts to run, in this order (default: all but learning_cuda, which needs the embedded model)")
    ap.add_argument("--merge", default=None, help="an earlier gpu_check.json whose sections the parts run now replace")
    ap.add_argument("--models", nargs="*", default=None,
                    help="shapes to train (default: qwen2.5-0.5b qwen2.5-1.5b on cuda, tiny on cpu)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--response-tokens", type=int, default=None, help="forced response length (cuda 1024, cpu 16)")
    ap.add_argument("--decode-rows", type=int, nargs="*", default=None, help="decode: rows (default 32 128 256)")
    ap.add_argument("--decode-tokens", type=int, default=None, help="decode: new tokens (cuda 1024, cpu 24)")
    ap.add_argument("--learning-steps", type=int, default=20)
    ap.add_argument("--learning-heldout", type=int, default=0, help="learning_cuda: held-out questions (0: the benchmark's)")
    ap.add_argument("--learning-set", nargs="*", default=[], help="learning_cuda: more config overrides")
    ap.add_argument("--learning-resume", default=None, help="learning_cuda: an earlier call's learning_cuda.tar.gz")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting parts after this (default 450)")
    ap.add_argument("--gpu-gb", type=float, default=None, help="plan for this GPU size (default: the device's)")
    ap.add_argument("--skip", nargs="*", default=[], choices=PARTS_ORDER)
    ap.add_argument("--resummarize", nargs=2, metavar=("REPORT", "ROWS"), default=None,
                    help="run nothing: REPORT's learning_cuda section again from ROWS against today's CPU table")
    args = ap.parse_args(argv)
    if args.resummarize:
        resummarize(Path(args.resummarize[0]), Path(args.resummarize[1]))
        return 0
    start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cuda = args.device == "cuda"
    command = " ".join([Path(sys.executable).name, *sys.argv]) if argv is None else f"main({argv})"
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    report = {"started": started, "budget_s": args.budget_s, "command": command, "errors": [], "models": {}}
    if args.merge:
        report = json.loads(Path(args.merge).read_text())
        report.setdefault("calls", [{"started": report["started"], "command": report["command"]}])
        report["calls"].append({"started": started, "command": command})
        report.update(budget_s=args.budget_s, command=command)
        report.setdefault("errors", [])
    parts = [p for p in (args.parts if args.parts is not None else [p for p in PARTS_ORDER if p != "learning_cuda"])
             if p not in args.skip]
    parts = [p for p in PARTS_ORDER if p in parts]
    # a part run now replaces the merged report's errors of that part
    report["errors"] = [e for e in report["errors"] if e.split(":", 1)[0].split("/", 1)[0] not in parts]

    def left() -> float:
        return args.budget_s - (time.perf_counter() - start)

    def part(key, fn, need_s):
        """Run `fn()`, one part, if `need_s` seconds are left; its error is recorded, not raised."""
        if left() < need_s:
            return {"skipped": f"not started: {left():.0f} s of the budget left, {need_s:.0f} s needed"}
        tick = time.perf_counter()
        # a part still running HARD_EXTRA_S after the budget is stopped, so that the report is written
        # before the caller's own time limit (600 s with a 450 s budget)
        signal.signal(signal.SIGALRM, _deadline)
        signal.alarm(max(1, int(left() + HARD_EXTRA_S)))
        try:
            value = fn()
        except Exception as e:  # noqa: BLE001 - the check reports every failure and goes on
            report["errors"].append(f"{key}: {type(e).__name__}: {e}")
            traceback.print_exc()
            value = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-4000:]}
        finally:
            signal.alarm(0)
        value["part_s"] = time.perf_counter() - tick
        return value

    import torch

    if cuda and not torch.cuda.is_available():
        print("gpu_check: --device cuda but torch sees no CUDA device (use --device cpu for the dry run)",
              file=sys.stderr)
        return 2
    device = "cuda" if cuda else "cpu"
    report["environment"] = environment(device)
    report["import_s"] = time.perf_counter() - start
    gpu_gb = args.gpu_gb if args.gpu_gb is not None else (report["environment"]["gpu_memory_gib"] if cuda else None)
    response = args.response_tokens or (1024 if cuda else 16)
    models = args.models if args.models is not None else (["qwen2.5-0.5b", "qwen2.5-1.5b"] if cuda else ["tiny"])
    decode_rows = tuple(args.decode_rows or ((32, 128, 256) if cuda else (8,)))
    write_report(out, report)
    work = Path(tempfile.mkdtemp(prefix="rlpr-gpu-check-"))
    try:
        # each part: (seconds it needs to start on CUDA, on the CPU; what runs it)
        runs = {"cuda_tests": (20, 20, lambda: cuda_tests(out, max(30.0, min(150.0, left() - 60)))),
                "resume": (30, 5, lambda: resume_check("qwen-small" if cuda else "tiny", work / "resume", device,
                                                       128 if cuda else response)),
                "score_b": (25, 5, lambda: score_b_comparison(models[0] if models else "tiny", work / "score-b",
                                                              device, response)),
                "decode": (60, 5, lambda: decode_part(device, decode_rows, args.decode_tokens, max(0.0, left()))),
                "learning_cuda": (120, 5, lambda: learning_part(
                    out, device, args.learning_steps, 0, args.learning_heldout or None,
                    max(60.0, left() + HARD_EXTRA_S / 2), args.learning_set, args.learning_resume))}
        # seconds each shape needs on one H100 (1024 tokens, 3 steps): measured 192 and 243 s
        # (benchmarks/results/gpu_check.md), of which ~55 s each was cuDNN attention planning the
        # first rollout, now left out; a part that starts runs to the budget + HARD_EXTRA_S at most
        need = {"qwen2.5-0.5b": 150, "qwen2.5-1.5b": 180}
        # the short parts first: a model part running long must not starve them (the first GPU run
        # spent its whole budget on the two shapes)
        for name in parts:
            if name != "models":
                on_cuda, on_cpu, fn = runs[name]
                report[name] = part(name, fn, on_cuda if cuda else on_cpu)
                write_report(out, report)
                continue
            for shape in models:
                report["models"][shape] = part(f"models/{shape}", lambda: train_shape(
                    shape, work / shape, device, response, args.steps, gpu_gb), need.get(shape, 10))
                write_report(out, report)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        report["wall_s"] = time.perf_counter() - start
        write_report(out, report)
    print(f"gpu_check: wrote {out / 'gpu_check.json'} and {out / 'gpu_check.md'} ({report['wall_s']:.0f} s; "
          f"{len(report['errors'])} errors)")
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
