"""Data sources beyond single files (issue 20): Hugging Face `datasets` folders (save_to_disk of a
Dataset or a DatasetDict, a dataset repository's file layout, README configs), `.arrow` files,
compressed and tab-separated files. The same rows give the same Examples whichever way they come,
and every bad source is one line naming the path, split or field."""

import bz2
import gzip
import json
import lzma

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlpr.data import hf_datasets
from rlpr.data.loading import ColumnMapping, examples_from_tables, load_examples
from rlpr.data.sources import Table, parse_source, read_tables, source_exists
from rlpr.errors import DataError

pytestmark = pytest.mark.unit

needs_datasets = pytest.mark.skipif(not hf_datasets.available(),
                                    reason="needs the Hugging Face datasets package (pip install 'rlpr[datasets]')")

FLAT = [  # every row has every key: Dataset.from_list takes the columns from the first row
    {"question": "Capital of France?", "answer": "Paris", "choices": [], "id": "q1"},
    {"question": "2 + 2?", "answer": "4", "choices": [], "id": "q2"},
    {"question": "A colour of the sky?", "answer": "blue", "choices": [], "id": "q3"},
    {"question": "Pick the metal.", "answer": "B", "choices": ["wood", "iron", "glass"], "id": "q4"},
]


def verl_rows():
    return [{"data_source": "geo", "ability": "general", "extra_info": {"index": i, "split": "train"},
             "prompt": [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": q}],
             "reward_model": {"ground_truth": a, "style": "rule"}}
            for i, (q, a) in enumerate([("Capital of Italy?", "Rome"), ("Capital of Spain?", "Madrid"),
                                         ("Largest planet?", "Jupiter")])]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def one_line(err) -> str:
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text and len(text) < 300, text
    return text


# --------------------------------------------------------------------------- save_to_disk folders

@needs_datasets
def test_saved_dataset_gives_the_examples_of_the_same_rows_in_jsonl(tmp_path):
    import datasets

    reference = load_examples(write_jsonl(tmp_path / "files" / "qa.jsonl", FLAT))  # data_source "qa" both ways
    datasets.Dataset.from_list(FLAT).save_to_disk(str(tmp_path / "saved" / "qa"))
    assert load_examples(tmp_path / "saved" / "qa") == reference
    assert [e.uid for e in reference] == ["q1", "q2", "q3", "q4"] and reference[3].choices == ["wood", "iron", "glass"]


@needs_datasets
def test_saved_verl_rows_equal_the_verl_parquet(tmp_path):
    import datasets

    parquet = tmp_path / "verl.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows()), parquet)
    datasets.Dataset.from_parquet(str(parquet)).save_to_disk(str(tmp_path / "verl_saved"))
    loaded = load_examples(tmp_path / "verl_saved")
    assert loaded == load_examples(parquet)
    assert [e.reference for e in loaded] == ["Rome", "Madrid", "Jupiter"]
    assert loaded[0].prompt[0] == {"role": "system", "content": "Answer briefly."}


@needs_datasets
def test_dataset_dict_splits(tmp_path):
    import datasets

    dd = tmp_path / "qa_dict"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(FLAT[:3]),
                          "test": datasets.Dataset.from_list(FLAT[3:])}).save_to_disk(str(dd))
    assert [e.uid for e in load_examples(f"{dd}:test")] == ["q4"]
    assert [e.uid for e in load_examples(dd, default_split="train")] == ["q1", "q2", "q3"]  # data.train
    with pytest.raises(DataError, match=rf"^{dd}: has splits train, test; name one as PATH:SPLIT$") as err:
        load_examples(dd)  # data.val, rlpr eval: a folder with several splits must name one
    one_line(err)
    with pytest.raises(DataError, match=rf"^{dd}:validation: no split 'validation' \(splits: train, test\)$") as err:
        load_examples(f"{dd}:validation")
    one_line(err)
    # one split: no need to name it
    datasets.DatasetDict({"test": datasets.Dataset.from_list(FLAT)}).save_to_disk(str(tmp_path / "only"))
    assert len(load_examples(tmp_path / "only")) == 4


@needs_datasets
def test_missing_column_in_a_saved_folder_names_folder_row_and_field(tmp_path):
    import datasets

    dd = tmp_path / "dd"
    rows = [{"question": "q1", "answer": "a"}, {"question": "q2", "reply": "b"}]
    datasets.DatasetDict({"train": datasets.Dataset.from_list(rows)}).save_to_disk(str(dd))
    # the column exists (the first row has it): the second row reads None, refused as missing
    with pytest.raises(DataError, match=rf"^{dd}:train: row 2: field 'answer' is missing \(null\)"):
        load_examples(dd)
    datasets.Dataset.from_list([{"question": "q1", "reply": "a"}]).save_to_disk(str(tmp_path / "no_answer"))
    with pytest.raises(DataError, match=rf"^{tmp_path / 'no_answer'}: row 1: field 'answer' is missing") as err:
        load_examples(tmp_path / "no_answer")
    one_line(err)
    # a column mapping names it
    got = load_examples(tmp_path / "no_answer", mapping=ColumnMapping(answer="reply"))
    assert got[0].reference == "a"


# --------------------------------------------------------------------------- dataset repository layout

@needs_datasets
def test_repository_layout_finds_the_split_files(tmp_path):
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    train, test = repo / "data" / "train-00000-of-00001.parquet", repo / "data" / "test-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(verl_rows()), train)
    pq.write_table(pa.Table.from_pylist(verl_rows()[:1]), test)
    (repo / "README.md").write_text("# questions\n")
    assert load_examples(repo, default_split="train") == load_examples(train)
    assert load_examples(f"{repo}:test") == load_examples(test)
    # errors name the file inside the folder
    bad = verl_rows()
    bad[1]["reward_model"] = {"style": "rule"}
    pq.write_table(pa.Table.from_pylist(bad), test)
    # (parquet stores the struct's missing key as null, as it always has)
    with pytest.raises(DataError, match=rf"^{test}: row 2: field 'reward_model.ground_truth' is missing \(null\)"):
        load_examples(f"{repo}:test")


@needs_datasets
@pytest.mark.parametrize("suffix", ["jsonl", "csv", "parquet"])
def test_repository_of_flat_files(tmp_path, suffix):
    """`train.X` + `test.X` in a folder: datasets names the splits, rlpr's readers read the files."""
    import csv

    repo = tmp_path / "flat_repo"
    repo.mkdir()
    rows = [{"question": r["question"], "answer": str(r["answer"]), "choices": json.dumps(r["choices"]),
             "id": r["id"]} for r in FLAT]
    for split, part in (("train", rows[:2]), ("test", rows[2:])):
        path = repo / f"{split}.{suffix}"
        if suffix == "jsonl":
            write_jsonl(path, part)
        elif suffix == "parquet":
            pq.write_table(pa.Table.from_pylist(part), path)
        else:
            with open(path, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(part[0]))
                writer.writeheader()
                writer.writerows(part)
    for split, default in (("train", "train"), ("test", None)):
        folder = load_examples(repo if default else f"{repo}:{split}", default_split=default)
        single = load_examples(repo / f"{split}.{suffix}")
        assert [e.data_source for e in folder] == ["flat_repo"] * len(single)  # the folder's name
        assert [{**e.__dict__, "data_source": ""} for e in folder] == [{**e.__dict__, "data_source": ""} for e in single]
    assert [e.reference for e in load_examples(repo, default_split="train")] == ["Paris", "4"]
    assert load_examples(f"{repo}:test")[1].choices == ["wood", "iron", "glass"]


@needs_datasets
def test_readme_configs(tmp_path):
    repo = tmp_path / "configs"
    for name, rows in (("alpha", verl_rows()[:1]), ("beta", verl_rows()[1:])):
        (repo / name).mkdir(parents=True)
        pq.write_table(pa.Table.from_pylist(rows), repo / name / "train.parquet")
    (repo / "README.md").write_text("---\nconfigs:\n- config_name: alpha\n  data_files:\n  - split: train\n"
                                    "    path: alpha/*.parquet\n- config_name: beta\n  data_files:\n"
                                    "  - split: train\n    path: beta/*.parquet\n---\n# two configs\n")
    assert [e.reference for e in load_examples(f"{repo}:beta")] == ["Madrid", "Jupiter"]
    assert [e.reference for e in load_examples(f"{repo}:alpha:train")] == ["Rome"]
    with pytest.raises(DataError, match=rf"^{repo}: has configs alpha, beta; name one as") as err:
        load_examples(repo)
    one_line(err)
    with pytest.raises(DataError, match=rf"^{repo}:gamma:train: no config 'gamma' \(configs: alpha, beta\)$"):
        load_examples(f"{repo}:gamma:train")


@needs_datasets
def test_folders_without_data_are_one_line(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=rf"^{empty}: empty folder") as err:
        load_examples(empty)
    one_line(err)
    (empty / "README.md").write_text("# nothing here\n")
    with pytest.raises(DataError, match=rf"^{empty}: cannot read with datasets \(EmptyDatasetError") as err:
        load_examples(empty)
    one_line(err)


# --------------------------------------------------------------------------- datasets' own readers agree

@needs_datasets
@pytest.mark.parametrize("suffix,builder", [("jsonl", "json"), ("csv", "csv"), ("parquet", "parquet")])
def test_datasets_readers_give_the_same_examples(tmp_path, suffix, builder):
    """What benchmarks/data_loading.py (retired; code in commit a0f9d4c) measures: load_dataset(...) rows turned into Examples equal
    rlpr's own readers' (which stay: faster, and their errors name the row)."""
    import datasets

    path = tmp_path / f"qa.{suffix}"
    rows = [{"question": r["question"], "answer": str(r["answer"]) if suffix == "csv" else r["answer"],
             "choices": json.dumps(r["choices"])} for r in FLAT]
    getattr(datasets.Dataset.from_list(rows), f"to_{'json' if suffix == 'jsonl' else suffix}")(str(path))
    theirs = datasets.load_dataset(builder, data_files=str(path), split="train", cache_dir=str(tmp_path / "cache"))
    mapping = ColumnMapping()
    assert examples_from_tables([Table(str(path), theirs.to_list())], "r1", mapping, "qa") == \
        load_examples(path) != []


@needs_datasets
def test_arrow_file(tmp_path):
    import datasets

    datasets.Dataset.from_list(FLAT).save_to_disk(str(tmp_path / "saved"))
    [arrow] = (tmp_path / "saved").glob("*.arrow")
    assert [e.reference for e in load_examples(arrow)] == ["Paris", "4", "blue", "B"]
    with pytest.raises(DataError, match=rf"^{tmp_path / 'x.arrow'}: cannot read with datasets"):
        (tmp_path / "x.arrow").write_bytes(b"not arrow")
        load_examples(tmp_path / "x.arrow")


def test_without_datasets_the_folder_names_the_extra(tmp_path, monkeypatch):
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "state.json").write_text("{}")
    (folder / "dataset_info.json").write_text("{}")
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match=rf"^{folder}: reading this needs the Hugging Face datasets package "
                                        r"\(pip install 'rlpr\[datasets\]'\)$"):
        load_examples(folder)


# --------------------------------------------------------------------------- files read here

@pytest.mark.parametrize("suffix,opener", [(".gz", gzip.open), (".bz2", bz2.open), (".xz", lzma.open)])
def test_compressed_files(tmp_path, suffix, opener):
    plain = write_jsonl(tmp_path / "qa.jsonl", FLAT)
    packed = tmp_path / f"qa.jsonl{suffix}"
    with opener(packed, "wb") as f:
        f.write(plain.read_bytes())
    assert load_examples(packed) == load_examples(plain)
    with opener(packed, "wb") as f:
        f.write(b'{"question": "q", "answer": "a"}\n{"question": "q2", "answer": }\n')
    with pytest.raises(DataError, match=rf"^{packed}: row 2: not valid JSON"):
        load_examples(packed)


def test_corrupt_compressed_data_is_one_line(tmp_path):
    """A .gz whose deflate stream is damaged past its header (a flipped byte on a disk or in a
    download) raised zlib.error, which is no OSError: a traceback."""
    packed = tmp_path / "qa.jsonl.gz"
    data = bytearray(gzip.compress("".join(json.dumps({"question": f"q{i}?", "answer": str(i * 7919)}) + "\n"
                                           for i in range(200)).encode()))
    data[100:140] = bytes(b ^ 0xFF for b in data[100:140])
    packed.write_bytes(bytes(data))
    with pytest.raises(DataError, match=rf"^{packed}: cannot decompress \(error: Error -3 while decompressing") as err:
        load_examples(packed)
    one_line(err)


def test_dataset_dict_json_nested_too_deep_is_one_line(tmp_path):
    """A dataset_dict.json nested a thousand deep was a RecursionError traceback."""
    folder = tmp_path / "saved"
    folder.mkdir()
    (folder / "dataset_dict.json").write_text('{"splits": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(DataError, match=rf"^{folder}/dataset_dict.json: cannot read the split names \(RecursionError\)"):
        load_examples(folder)


def test_tsv_and_csv_keep_cells_as_text(tmp_path):
    """`datasets` (pandas) would read this answer column as numbers: 007 -> 7.0, and the empty
    cell as a missing value. The CSV reader keeps the text."""
    (tmp_path / "qa.csv").write_text("question,answer\nBond's number?,007\nPi to 2 places?,3.14\n")
    (tmp_path / "qa.tsv").write_text("question\tanswer\nBond's number?\t007\nPi to 2 places?\t3.14\n")
    csv_refs = [e.reference for e in load_examples(tmp_path / "qa.csv")]
    assert csv_refs == ["007", "3.14"] == [e.reference for e in load_examples(tmp_path / "qa.tsv")]


def test_a_split_after_a_file_or_a_missing_path_is_one_line(tmp_path):
    path = write_jsonl(tmp_path / "qa.jsonl", FLAT)
    with pytest.raises(DataError, match=rf"^{path}:train: a split or config \(':train'\) applies only to a folder$"):
        load_examples(f"{path}:train")
    with pytest.raises(DataError, match=rf"^{tmp_path / 'nope'}:train: file not found$"):
        load_examples(f"{tmp_path / 'nope'}:train")
    with pytest.raises(DataError, match=r"unsupported file type '\.txt'"):
        (tmp_path / "qa.txt").write_text("question answer\n")
        load_examples(tmp_path / "qa.txt")


def test_parse_source(tmp_path):
    (tmp_path / "d").mkdir()
    colon = tmp_path / "odd:name.jsonl"  # an existing path is never split at its colon
    write_jsonl(colon, FLAT)
    assert parse_source(colon).path == colon and parse_source(colon).selector == ()
    assert parse_source(f"{tmp_path / 'd'}:test").selector == ("test",)
    assert parse_source(f"{tmp_path / 'd'}:cfg:test").selector == ("cfg", "test")
    assert parse_source(f"{tmp_path / 'd'}:test").name == "d:test"
    assert parse_source(tmp_path / "x.csv.gz").stem == "x"
    assert source_exists(f"{tmp_path / 'd'}:test") and not source_exists(tmp_path / "missing:test")
    assert len(load_examples(colon)) == 4


# --------------------------------------------------------------------------- data.train, data.val, rlpr eval

@needs_datasets
def test_train_val_and_eval_take_folders(tmp_path):
    import datasets

    from rlpr.config import load_config
    from rlpr.errors import ConfigError
    from rlpr.evaluation.benchmark import load_benchmarks
    from rlpr.train.setup import load_examples_for

    dd = tmp_path / "qa"
    datasets.DatasetDict({"train": datasets.Dataset.from_list(FLAT[:3]),
                          "test": datasets.Dataset.from_list(FLAT[3:])}).save_to_disk(str(dd))
    cfg = load_config("small", [f"data.train={dd}", f"data.val={dd}:test"])  # validated: the folder exists
    assert [e.uid for e in load_examples_for(cfg, "train")] == ["q1", "q2", "q3"]
    assert [e.uid for e in load_examples_for(cfg, "val")] == ["q4"]
    cfg = load_config("small", [f"data.train={dd}", f"data.val={dd}"])
    with pytest.raises(DataError, match="has splits train, test; name one as PATH:SPLIT"):
        load_examples_for(cfg, "val")  # never the training split by default
    with pytest.raises(ConfigError, match="data.train: file not found"):
        load_config("small", [f"data.train={tmp_path / 'nope'}:train"])
    [bench] = load_benchmarks([f"{dd}:test"])
    assert bench.name == "qa:test" and [e.uid for e in bench.examples] == ["q4"]
    assert read_tables(f"{dd}:test")[0].where == f"{dd}:test"
