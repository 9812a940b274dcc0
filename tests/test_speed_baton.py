"""benchmarks/harness/baton.py: the speed benchmark's two trainer processes take turns, so that
their steps alternate in time and never overlap (the ratio then compares steps run under the same
load). Two real child processes, each recording when its units of work ran."""

import json
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"

CHILD = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {bench!r})
    from harness.baton import Baton

    name, units, out, spec = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[5]
    baton, spans = Baton(spec), []
    for _ in range(units):
        with baton.turn():
            start = time.monotonic()
            time.sleep(0.05)
            spans.append([start, time.monotonic()])
    json.dump(spans, open(out, "w"))
""")


def test_turns_alternate_and_never_overlap(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from harness.baton import alternate, start

    script = tmp_path / "child.py"
    script.write_text(CHILD.format(bench=str(BENCH)))
    units = {"rlpr": 4, "trl": 3}  # rlpr has one more unit (its evaluation), as in speed.py
    children = [start(name, [sys.executable, str(script), name, str(n), str(tmp_path / f"{name}.json")])
                for name, n in units.items()]
    assert alternate(children) == [0, 0]
    spans = sorted((s, e, name) for name in units for s, e in json.loads((tmp_path / f"{name}.json").read_text()))
    assert [name for _, _, name in spans] == ["rlpr", "trl", "rlpr", "trl", "rlpr", "trl", "rlpr"]
    assert all(end <= nxt for (_, end, _), (nxt, _, _) in zip(spans, spans[1:]))  # one at a time
    assert [len(c.turns) for c in children] == [4, 3]


def test_a_failed_child_drops_out_and_the_other_finishes(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from harness.baton import alternate, start

    script = tmp_path / "child.py"
    script.write_text(CHILD.format(bench=str(BENCH)))
    failing = tmp_path / "failing.py"
    failing.write_text("import sys; sys.exit(3)\n")
    children = [start("rlpr", [sys.executable, str(failing)]),
                start("trl", [sys.executable, str(script), "trl", "2", str(tmp_path / "trl.json")])]
    assert alternate(children) == [3, 0]
    assert len(json.loads((tmp_path / "trl.json").read_text())) == 2

