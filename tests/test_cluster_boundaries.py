"""The cluster package's boundaries, read statically from the source (like test_layers.py).

- No import circle among ``workbench/cluster`` modules, counting every import: at module
  level, inside functions and under ``if TYPE_CHECKING:``. A circle hidden in a function or a
  typing-only import is still two modules that each need the other's insides (issue 27).
- No module outside ``workbench/cluster/`` reads or writes a private attribute (``._name``)
  of a ``Cluster`` or its ``RankDispatch``: the session and the apps go through their public
  methods, so the cluster's bookkeeping has one owner.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import _cycles, _imports, _imports_in, _module_name

ROOT = Path(__file__).resolve().parents[1]
CLUSTER = ROOT / "workbench" / "cluster"
# Everything that may hold a cluster: the package outside cluster/, benchmarks, notebooks.
OUTSIDE = [
    *(p for p in (ROOT / "workbench").rglob("*.py") if CLUSTER not in p.parents),
    *(ROOT / "benchmarks").rglob("*.py"),
    *(ROOT / "notebooks" / "src").rglob("*.py"),
]
# Names (or the last attribute of a dotted name) that hold one of these objects, and the
# classes whose annotation marks a parameter or variable as one.
HOLDER_WORDS = ("cluster", "dispatch")
CLASSES = ("Cluster", "RankDispatch")


def _cluster_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {}
    for path in sorted(CLUSTER.rglob("*.py")):
        module = _module_name(path)
        if path.name == "__init__.py":
            continue  # the lazy façade names every module it re-exports
        graph[module] = {
            imp.target
            for imp in _imports(path)
            if imp.target.startswith("workbench.cluster.")
            and imp.target != module
            and not imp.target.endswith("__init__")
        }
    return graph


def cluster_import_cycles() -> list[list[str]]:
    graph = _cluster_graph()
    known = set(graph)
    return _cycles({m: {t for t in ts if t in known} for m, ts in graph.items()})


def test_no_import_cycle_among_cluster_modules() -> None:
    assert cluster_import_cycles() == []


def test_the_cycle_reader_counts_typing_and_function_imports() -> None:
    """A circle made of one typing-only import and one inside a function is still found."""
    a = "def f():\n    from workbench.cluster.b import B\n"
    b = "if TYPE_CHECKING:\n    from workbench.cluster.a import A\n"
    graph = {
        name: {i.target for i in _imports_in(src, name, "workbench.cluster")}
        for name, src in (("workbench.cluster.a", a), ("workbench.cluster.b", b))
    }
    graph = {m: {t for t in ts if t in graph} for m, ts in graph.items()}
    assert _cycles(graph) == [["workbench.cluster.a", "workbench.cluster.b"]]


def _imported_names(tree: ast.Module) -> set[str]:
    """Names bound by imports: ``cluster._x`` on an imported module is not a Cluster."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _annotated_holders(tree: ast.Module) -> set[str]:
    """Parameters and variables annotated with one of ``CLASSES`` (any spelling)."""
    held: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            name, annotation = node.arg, node.annotation
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            name, annotation = node.target.id, node.annotation
        else:
            continue
        words = ast.unparse(annotation)
        for mark in ".|'\"[],":
            words = words.replace(mark, " ")
        if any(c in words.split() for c in CLASSES):
            held.add(name)
    return held


def _holder(expr: ast.expr, annotated: set[str], imported: set[str]) -> bool:
    if isinstance(expr, ast.Name):
        if expr.id in imported:
            return False
        name = expr.id
    elif isinstance(expr, ast.Attribute):
        name = expr.attr
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute):
        made = expr.func.attr in ("current", "latest")  # Cluster.current()._x
        return made or _holder(expr.func.value, annotated, imported)
    else:
        return False
    return name in annotated or any(word in name.lower() for word in HOLDER_WORDS)


def private_accesses(source: str, where: str = "<src>") -> list[str]:
    """``where:line obj._name`` for each private attribute read or set on a cluster holder."""
    # a notebook source's magics (``%load_ext``, ``!pip``) are not Python
    lines = source.splitlines()
    python = "\n".join(
        ln[: len(ln) - len(ln.lstrip())] + "pass" if ln.lstrip().startswith(("%", "!")) else ln
        for ln in lines
    )
    tree = ast.parse(python)
    annotated, imported = _annotated_holders(tree), _imported_names(tree)
    found: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or (attr.startswith("__") and attr.endswith("__")):
            continue
        if _holder(node.value, annotated, imported):
            found.append(
                (node.lineno, node.col_offset, f"{where}:{node.lineno} {ast.unparse(node)}")
            )
    return [text for _, _, text in sorted(found)]


def test_nothing_outside_the_cluster_package_touches_its_privates() -> None:
    found = []
    for path in sorted(OUTSIDE):
        found += private_accesses(path.read_text(), str(path.relative_to(ROOT)))
    assert found == []


def test_the_private_reader_sees_each_way_of_holding_a_cluster() -> None:
    source = (
        "from workbench.cluster import cluster\n"
        "def f(c: Cluster, d: 'RankDispatch') -> None:\n"
        "    c._stuck\n"
        "    d._views = {}\n"
        "    self.cluster._mark_stuck()\n"
        "    session.cluster.dispatch._given_up\n"
        "    Cluster.current()._client\n"
        "    cluster._current\n"  # an imported module, not a Cluster
        "    c.__class__\n"
        "    c.ranks\n"
    )
    assert [line.split(" ", 1)[1] for line in private_accesses(source)] == [
        "c._stuck",
        "d._views",
        "self.cluster._mark_stuck",
        "session.cluster.dispatch._given_up",
        "Cluster.current()._client",
    ]
