"""Learning-benchmark rows trained on a lent GPU (issue 41; docs/distributed.md): `run` starts several
`learning.py` workers per `--job` on one job list until they end or `--deadline-s`, and archives the rows
they added with their saved responses; `merge` appends those rows here (once; each keeps its `device`).

    python3 benchmarks/gpu_rows.py run --out $OUT --deadline-s 480 --job "--variants opsd --seeds 2" --workers 4
    python benchmarks/gpu_rows.py merge DIR/gpu_rows.tar.gz
"""

from __future__ import annotations

import argparse
import io
import json
import shlex
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from learnbench.rows import append_row, load_rows  # the table's reader and its locked, one-write append

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
ARCHIVE = "gpu_rows.tar.gz"


def run(jobs: list[tuple[str, int]], out: Path, deadline_s: float, workdir: Path, threads: int,
        output: Path, extra: list[str]) -> int:
    """Start `workers` learning.py processes per job line at once, wait for them or the deadline (then
    end them: a run in progress is lost, the finished ones are kept), archive the rows they added."""
    table = output.with_suffix(".jsonl")
    before = len(load_rows(table))
    out.mkdir(parents=True, exist_ok=True)
    procs = []
    for j, (args, workers) in enumerate(jobs):
        for w in range(workers):
            cmd = [sys.executable, str(ROOT / "benchmarks" / "learning.py"), *shlex.split(args), "--workdir",
                   str(workdir), "--threads", str(threads), "--output", str(output), *extra]
            log = (workdir / f"worker-{j}-{w}.log")
            log.parent.mkdir(parents=True, exist_ok=True)
            procs.append((subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT), log))
            time.sleep(2)  # claims are files: a moment apart, the workers take different jobs at once
    end = time.monotonic() + deadline_s
    while time.monotonic() < end and any(p.poll() is None for p, _ in procs):
        time.sleep(5)
    for p, _ in procs:
        if p.poll() is None:
            p.kill()
    rows = load_rows(table)[before:]
    with tarfile.open(out / ARCHIVE, "w:gz") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))

        add("rows.jsonl", "".join(json.dumps(row) + "\n" for row in rows).encode())
        for row in rows:
            responses = row.get("responses")
            if responses and (table.parent / responses).exists():
                tar.add(table.parent / responses, arcname=responses)
        for _, log in procs:
            add(f"logs/{log.name}", log.read_bytes())
    ended = sum(p.returncode == 0 for p, _ in procs)
    print(f"{len(rows)} rows added; {ended} of {len(procs)} workers ended by themselves; {out / ARCHIVE}", flush=True)
    for _, log in procs:
        print(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-4:]), flush=True)
    return 0 if rows else 1


def key(row: dict) -> str:
    return json.dumps([row.get("variant"), row.get("seed"), row.get("steps"), row.get("settings"),
                       row.get("grader_version"), row.get("device")], sort_keys=True)


def merge(archive: Path, output: Path) -> list[dict]:
    """Append the archive's rows to `output`.jsonl (skipping rows already there) and copy their saved
    responses beside the table's; returns the rows appended."""
    table = output.with_suffix(".jsonl")
    have = {key(row) for row in load_rows(table)}
    added = []
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        rows = [json.loads(line) for line in tar.extractfile("rows.jsonl").read().decode().splitlines() if line.strip()]
        for row in rows:
            if key(row) in have:
                continue
            responses = row.get("responses")
            if responses and responses in names:
                target = table.parent / responses
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(tar.extractfile(responses).read())
            append_row(table, row)
            have.add(key(row))
            added.append(row)
    for row in added:
        print(f"appended {row['variant']} seed {row['seed']} {row['steps']} steps ({row.get('device', '?')}) "
              f"to {table}", flush=True)
    return added


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="on the GPU machine: train, then archive the new rows")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--job", action="append", default=[], help="learning.py arguments of one job list")
    r.add_argument("--workers", action="append", type=int, default=[], help="workers of the --job before it")
    r.add_argument("--deadline-s", type=float, default=480.0)
    r.add_argument("--workdir", type=Path, default=Path("/tmp/rlpr-gpu-rows"))
    r.add_argument("--threads", type=int, default=2)
    r.add_argument("--output", type=Path, default=RESULTS / "learning", help="the table (learning.py --output)")
    r.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more learning.py arguments for every worker")
    m = sub.add_parser("merge", help="here: append an archive's rows to the table")
    m.add_argument("archive", type=Path)
    m.add_argument("--output", type=Path, default=RESULTS / "learning")
    args = ap.parse_args(argv)
    if args.cmd == "merge":
        if not args.archive.exists():
            sys.exit(f"gpu_rows: no archive at {args.archive}")
        try:
            merge(args.archive, args.output)
        except (tarfile.TarError, KeyError, EOFError, OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            sys.exit(f"gpu_rows merge: {args.archive}: not an archive of gpu_rows run ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else e!r})")
        return 0
    if not args.job or len(args.workers) != len(args.job):
        sys.exit("gpu_rows run: give each --job its --workers")
    return run(list(zip(args.job, args.workers)), args.out, args.deadline_s, args.workdir, args.threads,
               args.output, args.extra)


if __name__ == "__main__":
    sys.exit(main())
