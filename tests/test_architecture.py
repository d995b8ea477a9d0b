"""The import graph of ``src/rlscope`` follows the layer table of docs/architecture.md.

Every module is parsed with `ast` (nothing is imported), and every ``import`` statement counts:
module level, inside functions, under ``if TYPE_CHECKING:`` and in ``try:`` blocks alike. An
import names the module it loads: ``from rlscope.sampling import graphs`` is an edge to
``rlscope.sampling.graphs``, ``from rlscope.sampling import generate`` one to the package
``rlscope.sampling`` (its ``__init__``); the parent packages Python initialises on the way are
not edges, or every package whose ``__init__`` re-exports its modules would be a cycle.

Three rules: no module imports one of a higher layer; no two modules import each other, directly
or around a loop (every strongly connected component has one module); the doctor is torch-free
(no module it reaches through rlscope imports imports torch).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "rlscope"
DOC = ROOT / "docs" / "architecture.md"

LAYERS: dict[str, int] = {
    # 0 utilities: nothing of rlscope below them
    "__init__.py": 0, "utils.py": 0, "files.py": 0, "paths.py": 0, "checks.py": 0,
    "tokenizer.py": 0, "data/": 0, "sandbox/": 0, "ray_cluster.py": 0,
    # 1 records: batch contracts, metric estimators / schema / sinks, tidy results
    "batch.py": 1, "metrics/": 1, "results.py": 1, "envs/": 1,
    # 2 the doctor: torch-free, so the training loop may run its rules live
    "doctor/": 2,
    # 3-6 the model stack, in the order of ARCHITECTURE.md
    "policy/": 3,
    "sampling/": 4,
    "tasks/": 5,
    "methods/": 6,
    # 7 a run's parts: configuration, queues, checkpoints, evaluation (never the learner)
    "config.py": 7, "replay.py": 7, "checkpoint.py": 7, "evaluation.py": 7,
    "env_workers.py": 7,
    "distributed.py": 7,  # data parallel: ranks' rows, gathers, gradient sums, FSDP2 sharding
    # 8 the update
    "learner.py": 8, "learner_graphs.py": 8, "learner_packed.py": 8, "diagnostics.py": 8,
    # 9 the loops
    "steps/": 8, "train.py": 9, "supervised/": 9,
    # 10 applications over the loops
    "seeds.py": 10, "bench.py": 10, "demo.py": 10, "report/": 10, "serve/": 10,
    "probes/": 10,  # measurements that are not training runs (rlscope probe)
    # 11 sweeps (they build reports)
    "sweep/": 11,
    # 12 the command line
    "cli.py": 12,
}
"""Layer of each top-level module and package of ``src/rlscope`` (a package's modules share its
layer). The same table is in docs/architecture.md, "Layers"."""

PENDING: frozenset[tuple[str, str]] = frozenset()
"""Upward imports another change of issue 14 removes. Each must still exist (remove the entry
with the import), and nothing else may point up."""

TORCH_FREE = "doctor/"


def module_files(src: Path) -> dict[str, Path]:
    """Dotted module name → file, for every ``.py`` under ``src`` (a package is its
    ``__init__.py``)."""
    out = {}
    for path in sorted(src.rglob("*.py")):
        parts = (src.name, *path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(tree: ast.Module, package: str) -> Iterator[tuple[str, str]]:
    """(imported module, imported name or "") of every import statement in ``tree``;
    ``package`` resolves relative imports."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, ""
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                yield base, alias.name


def import_graph(src: Path) -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """``(edges, external)``: for each module of ``src``, the modules of ``src`` it imports,
    and the top-level names of the other packages it imports."""
    files = module_files(src)
    edges: dict[str, set[str]] = {name: set() for name in files}
    external: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for module, member in _imports(ast.parse(path.read_text(), str(path)), package):
            if module.split(".")[0] != src.name:
                external[name].add(module.split(".")[0])
                continue
            target = f"{module}.{member}" if f"{module}.{member}" in files else module
            while target not in files:  # `import rlscope.a.b` of a name inside rlscope.a
                target = target.rpartition(".")[0]
            if target != name:
                edges[name].add(target)
    return edges, external


def layer_key(module: str, layers: Mapping[str, int]) -> str:
    """The key of ``layers`` that places ``module`` (its file, else its top-level package)."""
    parts = module.split(".")[1:]
    if not parts:
        return "__init__.py"
    if len(parts) == 1 and f"{parts[0]}/" not in layers:
        return f"{parts[0]}.py"
    return f"{parts[0]}/"


def upward_imports(edges: Mapping[str, set[str]], layers: Mapping[str, int]
                   ) -> set[tuple[str, str]]:
    """The imports from a module to one of a higher layer."""
    return {(a, b) for a, targets in edges.items() for b in targets
            if layers[layer_key(a, layers)] < layers[layer_key(b, layers)]}


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)


def reachable(edges: Mapping[str, set[str]], start: set[str]) -> set[str]:
    """``start`` and every module it imports, directly or not."""
    seen, todo = set(start), list(start)
    while todo:
        for w in edges[todo.pop()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    return seen


def documented_layers(text: str) -> dict[str, int]:
    """The layer table of docs/architecture.md's "Layers" section: rows ``| N name | `a.py`,
    `b/` | ... |``."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and re.match(r"\d+\b", cells[0]):
            layer = int(cells[0].split()[0])
            for key in re.findall(r"`([^`]+)`", cells[1]):
                out[key] = layer
    return out


GRAPH, EXTERNAL = import_graph(SRC)


def test_the_graph_sees_every_kind_of_import() -> None:
    # module level, inside a function (cli's lazy commands), a submodule named by `from pkg
    # import mod`, and the package itself when a name of its __init__ is imported
    assert "rlscope.batch" in GRAPH["rlscope.sampling.sampler"]
    assert "rlscope.supervised.sft" in GRAPH["rlscope.cli"]
    assert "rlscope.sampling.backends" in GRAPH["rlscope.sampling.sampler"]
    assert "rlscope.sampling" in GRAPH["rlscope.config"]
    assert "torch" in EXTERNAL["rlscope.policy.tiny"]
    assert "torch" not in EXTERNAL["rlscope.doctor.rules"]


def test_every_module_has_a_layer_and_the_docs_hold_the_same_table() -> None:
    missing = sorted({layer_key(m, LAYERS) for m in GRAPH} - set(LAYERS))
    assert not missing, (f"{missing} have no layer: add them to LAYERS in "
                         "tests/test_architecture.py and to docs/architecture.md, 'Layers'")
    assert documented_layers(DOC.read_text()) == LAYERS


def test_no_module_imports_a_higher_layer() -> None:
    up = upward_imports(GRAPH, LAYERS)
    assert sorted(up - PENDING) == [], "imports from a lower layer to a higher one"
    assert sorted(PENDING - up) == [], "remove these from PENDING: the import is gone"


def test_no_import_cycles() -> None:
    assert cycles(GRAPH) == []


def test_the_doctor_never_reaches_torch() -> None:
    doctor = {m for m in GRAPH if layer_key(m, LAYERS) == TORCH_FREE}
    assert len(doctor) > 5
    with_torch = sorted(m for m in reachable(GRAPH, doctor) if "torch" in EXTERNAL[m])
    assert with_torch == []


def test_the_checks_catch_what_they_look_for(tmp_path: Path) -> None:
    src = tmp_path / "pkg"
    (src / "low").mkdir(parents=True)
    (src / "__init__.py").write_text("")
    (src / "low" / "__init__.py").write_text("from pkg.low import a\n")
    (src / "low" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import high\n")
    (src / "low" / "b.py").write_text("def f():\n    from . import a\n    import torch\n")
    (src / "high.py").write_text("from .low import b\nfrom pkg.low.a import thing\n")
    edges, external = import_graph(src)
    assert edges == {"pkg": set(), "pkg.low": {"pkg.low.a"}, "pkg.low.a": {"pkg.high"},
                     "pkg.low.b": {"pkg.low.a"}, "pkg.high": {"pkg.low.b", "pkg.low.a"}}
    assert external["pkg.low.b"] == {"torch"}
    layers = {"__init__.py": 0, "low/": 1, "high.py": 2}
    assert upward_imports(edges, layers) == {("pkg.low.a", "pkg.high")}
    assert cycles(edges) == [["pkg.high", "pkg.low.a", "pkg.low.b"]]
    assert reachable(edges, {"pkg.low"}) == {"pkg.low", "pkg.low.a", "pkg.high", "pkg.low.b"}


@pytest.mark.parametrize("module,key", [("rlscope", "__init__.py"), ("rlscope.train", "train.py"),
                                        ("rlscope.sampling", "sampling/"),
                                        ("rlscope.sweep.builtin.x", "sweep/")])
def test_layer_key(module: str, key: str) -> None:
    assert layer_key(module, LAYERS) == key
