"""The package layout: every rlpr module imports, and no two rlpr modules import each other; the same
holds for benchmarks/ (its scripts import each other with benchmarks/ on the path), whose files also
stay short (issue 62).

Imports are read from the source with `ast`, at any depth: a function-local import counts as
much as a top-level one, so a circle cannot hide inside a function either. `from rlpr.x import y`
counts as importing `rlpr.x.y` when that is a module, else `rlpr.x`.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import rlpr

pytestmark = pytest.mark.unit

ROOT = Path(rlpr.__file__).resolve().parent


def module_names(root: Path = ROOT, base: Path | None = None) -> dict[str, Path]:
    """Dotted module name -> file, for every .py under `root`, named as imported from `base` on sys.path."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent if base is None else base).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


MODULES = module_names()


def rlpr_imports(name: str, modules: dict[str, Path] | None = None) -> set[str]:
    """The modules of `modules` (default: rlpr's) that module `name` imports (itself excluded)."""
    MODULES_ = MODULES if modules is None else modules
    path = MODULES_[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: `from . import x`, `from ..y import x`
                parent = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in MODULES_ else base)
    return {m for m in found if m in MODULES_ and m != name}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_no_module_imports_a_module_that_imports_it_back():
    graph = {name: rlpr_imports(name) for name in MODULES}
    circles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a] if a in graph.get(b, ())})
    assert circles == []


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of any length in `graph` (its strongly connected components of more than one
    module, or a module importing itself), each sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    cycles.append(sorted(component))
    return sorted(cycles)


def test_no_import_cycle_of_any_length():
    """No chain of rlpr imports leads back to where it started (issue 41: model/card.py imported the
    package root `rlpr`, whose lazy attributes import rlpr.api and rlpr.train, which import the card)."""
    assert import_cycles({name: rlpr_imports(name) for name in MODULES}) == []


def test_no_module_imports_the_package_root():
    """`rlpr/__init__.py` reaches the API and the training loop (its __getattr__): a module below them
    that imports `rlpr` closes a cycle; the version lives in rlpr.version."""
    assert sorted(name for name in MODULES if name != "rlpr" and "rlpr" in rlpr_imports(name)) == []


def test_the_cycle_finder_sees_a_long_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert import_cycles(graph) == [["a", "b", "c"], ["e"]]


def test_the_import_reader_sees_top_level_and_local_imports():
    config = rlpr_imports("rlpr.config")
    assert "rlpr.errors" in config  # top level
    assert "rlpr.algorithms.advantages" in rlpr_imports("rlpr.config.registries")  # inside a function


# Imports run down (docs/layout.md, issue 34): the stages below the loop never reach up into it.
LOWER = ("rlpr.reward", "rlpr.model", "rlpr.rollout", "rlpr.data", "rlpr.algorithms")
UPPER = ("rlpr.evaluation", "rlpr.train")


def _under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_no_lower_stage_imports_evaluation_or_train():
    """No module under reward/, model/, rollout/, data/ or algorithms/ imports rlpr.evaluation or
    rlpr.train, at any depth (function-local imports included): the graders live in rlpr.grading
    and a checkpoint's files in rlpr.model.checkpoint_files, below both sides."""
    upward = sorted(f"{name} -> {m}" for name in MODULES if _under(name, LOWER)
                    for m in rlpr_imports(name) if _under(m, UPPER))
    assert upward == []


def test_the_downward_check_sees_a_function_local_upward_import(tmp_path, monkeypatch):
    """The reader behind the check above finds an upward import hidden inside a function."""
    path = tmp_path / "hidden.py"
    path.write_text("def f():\n    from rlpr.train.checkpoint import latest_checkpoint\n"
                    "    import rlpr.evaluation.benchmark\n")
    monkeypatch.setitem(MODULES, "rlpr.reward.hidden", path)
    assert {"rlpr.train.checkpoint", "rlpr.evaluation.benchmark"} <= rlpr_imports("rlpr.reward.hidden")


TIERS = {"unit", "integration", "distributed", "slow"}


def test_every_test_module_has_a_tier():
    """Each tests/test_*.py sets `pytestmark = pytest.mark.<tier>` (docs/testing.md)."""
    untiered = []
    for path in sorted(Path(__file__).parent.glob("test_*.py")):
        marks = {node.value.attr for node in ast.parse(path.read_text()).body
                 if isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)] == ["pytestmark"]
                 and isinstance(node.value, ast.Attribute)}
        if not marks & TIERS:
            untiered.append(path.name)
    assert untiered == []


def test_the_training_loop_stays_short():
    """train/trainer.py reads top to bottom, one method per stage (issue 41: under 450 lines); what
    it calls lives in the other train/ modules (update.py, opsd.py, state.py, metrics.py, ...)."""
    assert len((ROOT / "train" / "trainer.py").read_text().splitlines()) < 450


# benchmarks/ (issue 62): scripts run with benchmarks/ on sys.path, so `import gpu_check`,
# `from speedbench.report import ...`, `from gpubench.models import ...` name its modules.
BENCHMARKS = ROOT.parents[1] / "benchmarks"
BENCH_MODULES = module_names(BENCHMARKS, BENCHMARKS) if BENCHMARKS.is_dir() else {}
MAX_BENCHMARK_LINES = 400
MAX_BENCHMARK_TOTAL = 6000


def test_benchmarks_have_no_import_cycle():
    """No chain of imports among benchmarks/ modules leads back to where it started (the GPU check's
    files once imported each other in a circle: gpu_check -> gpu_learning -> gpu_check)."""
    if not BENCH_MODULES:
        pytest.skip("no benchmarks/ beside src/ (an installed rlpr)")
    graph = {name: rlpr_imports(name, BENCH_MODULES) for name in BENCH_MODULES}
    assert sum(map(len, graph.values())) > 10  # the reader resolves benchmarks' own imports
    assert import_cycles(graph) == []


def test_the_benchmark_import_reader_sees_a_circle(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from .b import x\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    import top\n")
    (tmp_path / "top.py").write_text("import pkg.a\n")
    modules = module_names(tmp_path, tmp_path)
    graph = {name: rlpr_imports(name, modules) for name in modules}
    assert import_cycles(graph) == [["pkg.a", "pkg.b", "top"]]


def test_no_benchmarks_file_is_long():
    """Every benchmarks/ file stays under 400 lines (issue 62): a suite that grows gets a module per concern."""
    if not BENCH_MODULES:
        pytest.skip("no benchmarks/ beside src/ (an installed rlpr)")
    long = {str(p.relative_to(BENCHMARKS)): n for p in BENCH_MODULES.values()
            if (n := len(p.read_text().splitlines())) > MAX_BENCHMARK_LINES}
    assert long == {}


def test_benchmarks_stay_short_in_all():
    """benchmarks/'s .py files stay under 6,000 lines in all (issue 62: 6,298 before): a new measurement
    makes room by simplifying, and tooling that measures nothing (tools/gpu_loan.py) lives outside."""
    if not BENCH_MODULES:
        pytest.skip("no benchmarks/ beside src/ (an installed rlpr)")
    total = sum(len(p.read_text().splitlines()) for p in BENCH_MODULES.values())
    assert total < MAX_BENCHMARK_TOTAL, f"benchmarks/ holds {total} lines of Python"
