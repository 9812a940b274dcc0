"""Load time and memory of rlpr's own readers against the Hugging Face `datasets` library (issue 20).

    python benchmarks/data_loading.py [--repeats 3]

The question: should the readers of the current formats (verl parquet, JSONL, CSV) go through
`datasets` (load_dataset("parquet" / "json" / "csv", data_files=...)) instead of pyarrow and the
standard library? Real files from ../shared/data, converted to the verl layout in a temporary
folder where the format needs it (never copied into the repository). Each measurement runs in a
fresh process (so the library import is counted, as it is for `rlpr train`): the time to import
the reader's library (pyarrow for parquet; `datasets`, which imports pyarrow, pandas and more),
to read the rows, and to turn them into Examples; the peak resident memory of the process (after
importing rlpr.data.loading, in the "before" column); and whether both ways give the same
Examples. A save_to_disk folder of the same
rows (a source only `datasets` reads) is timed too.

Writes benchmarks/results/data_loading.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data"
RESULTS = ROOT / "benchmarks" / "results"

# One measurement, in a child process: argv = method, path, builder, choices column, pickle-free
# output path for the Examples (JSON) so that the parent can compare both ways.
CHILD = r"""
import json, sys, tempfile, time
method, path, builder, choices, out = sys.argv[1:6]


def peak_mb():  # VmHWM starts afresh at exec (ru_maxrss would carry the parent's peak over)
    status = open("/proc/self/status").read()
    return int(status.split("VmHWM:")[1].split()[0]) / 1024



t0 = time.perf_counter()
from rlpr.data.loading import ColumnMapping, examples_from_tables, load_examples
from rlpr.data.sources import Table, parse_source
mapping = ColumnMapping(choices=choices)
rss0 = peak_mb()
t1 = time.perf_counter()
if method == "rlpr":
    if path.endswith(".parquet"):  # what pq.read_table imports on first use
        import pyarrow.dataset, pyarrow.parquet
    t2 = time.perf_counter()
    from rlpr.data.sources import read_tables
    tables = read_tables(path)
else:
    import datasets
    datasets.disable_progress_bars()
    t2 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        if method == "datasets_saved":
            rows = datasets.Dataset.load_from_disk(path).to_list()
        else:
            rows = datasets.load_dataset(builder, data_files=path, split="train", cache_dir=cache).to_list()
    tables = [Table(path, rows)]
t3 = time.perf_counter()
examples = examples_from_tables(tables, "r1", mapping, parse_source(path).stem)
t4 = time.perf_counter()
rss = peak_mb()
with open(out, "w") as f:
    json.dump([e.__dict__ for e in examples], f)
print(json.dumps({"import_s": t2 - t1, "rows_s": t3 - t2, "examples_s": t4 - t3, "rows": len(examples),
                  "peak_rss_mb": rss, "rss_before_mb": rss0}))
"""


def prepare(tmp: Path) -> list[dict]:
    """The inputs: verl parquet converted from real files, the raw JSONL, a CSV and a saved folder."""
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlpr.data.convert import convert_file

    datasets.disable_progress_bars()
    gsm8k, mmlu_pro = tmp / "gsm8k_train_verl.parquet", tmp / "mmlu_pro_verl.parquet"
    convert_file("gsm8k", DATA / "gsm8k" / "train.jsonl", gsm8k)
    convert_file("mmlu_pro", DATA / "mmlu_pro" / "mmlu_pro_test.jsonl", mmlu_pro)
    big = tmp / "mmlu_pro_verl_x6.parquet"  # about the size of RLPR's 77k-row training set
    table = pq.read_table(mmlu_pro)
    pq.write_table(pa.concat_tables([table] * 6), big)
    csv_path = tmp / "mmlu_test_flat.csv"
    with open(DATA / "mmlu" / "mmlu_test.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    datasets.Dataset.from_list([{"question": r["question"], "answer": r["answer"],
                                 "choices": json.dumps(r["choices"])} for r in rows]).to_csv(csv_path, index=False)
    saved = tmp / "gsm8k_train_verl_saved"
    datasets.Dataset.from_parquet(str(gsm8k)).save_to_disk(str(saved))
    return [
        {"name": "gsm8k train, verl parquet", "path": gsm8k, "builder": "parquet", "choices": "choices"},
        {"name": "MMLU-Pro test, verl parquet", "path": mmlu_pro, "builder": "parquet", "choices": "choices"},
        {"name": "MMLU-Pro test x6, verl parquet", "path": big, "builder": "parquet", "choices": "choices"},
        {"name": "MMLU-Pro test, flat JSONL (shared/data)", "path": DATA / "mmlu_pro" / "mmlu_pro_test.jsonl",
         "builder": "json", "choices": "options"},
        {"name": "MMLU test, flat CSV", "path": csv_path, "builder": "csv", "choices": "choices"},
        {"name": "gsm8k train, save_to_disk folder", "path": saved, "builder": None, "choices": "choices"},
    ]


def measure(method: str, case: dict, out: Path, repeats: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    runs = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", CHILD, method, str(case["path"]), str(case["builder"]),
                               case["choices"], str(out)], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    result = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    result["total_s"] = result["import_s"] + result["rows_s"] + result["examples_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="runs per measurement (the median is kept)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="rlpr-bench-") as tmp:
        tmp = Path(tmp)
        for case in prepare(tmp):
            methods = ["datasets_saved"] if case["builder"] is None else ["rlpr", "datasets"]
            if case["builder"] is None:
                methods.insert(0, "rlpr")
            row = {"name": case["name"], "bytes": _size(case["path"])}
            outputs = {}
            for method in methods:
                outputs[method] = tmp / f"{method}.json"
                row[method] = measure(method, case, outputs[method], args.repeats)
                print(case["name"], method, row[method], flush=True)
            texts = [outputs[m].read_text() for m in methods]
            row["same_examples"] = all(t == texts[0] for t in texts)
            results.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "data_loading.json").write_text(json.dumps(results, indent=2) + "\n")
    (RESULTS / "data_loading.md").write_text(table(results, args.repeats))


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def table(results: list[dict], repeats: int) -> str:
    lines = [f"# Data loading: rlpr's readers vs the `datasets` library (median of {repeats} fresh processes)",
             "",
             "| input | rows | size | reader | import s | rows s | Examples s | total s | RSS before MB | peak RSS MB | same Examples |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    names = {"rlpr": "rlpr (pyarrow / stdlib)", "datasets": "datasets load_dataset",
             "datasets_saved": "datasets load_from_disk"}
    for r in results:
        for method in ("rlpr", "datasets", "datasets_saved"):
            if method not in r:
                continue
            m = r[method]
            lines.append(f"| {r['name']} | {int(m['rows'])} | {r['bytes'] / 1e6:.1f} MB | {names[method]} | "
                         f"{m['import_s']:.2f} | {m['rows_s']:.2f} | {m['examples_s']:.2f} | {m['total_s']:.2f} | "
                         f"{m['rss_before_mb']:.0f} | {m['peak_rss_mb']:.0f} | {'yes' if r['same_examples'] else 'NO'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
