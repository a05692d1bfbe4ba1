"""The package's layers, read statically from every import (module level and inside functions).

DESIGN.md: each layer may import only itself and the layers above it, and the core layers run
in plain scripts, under torchrun and on engines, so they never import the notebook stack.
``tests/planner/test_import.py`` keeps one subprocess check that ``workbench.planner`` loads
no torch at run time; everything else is decided here from the source, in well under a second.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"

# Top to bottom: a module may import its own layer and the layers listed before it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "workbench.errors",
            "workbench.config",
            "workbench.files",
            "workbench.lazy",
            "workbench.validate",
            "workbench.vocab",
        ),
    ),
    ("trace", ("workbench.trace",)),
    ("planner", ("workbench.planner",)),
    ("parallel", ("workbench.parallel",)),
    ("engine", ("workbench.engine",)),
    ("cluster", ("workbench.cluster",)),
    ("session", ("workbench.session",)),
    ("plots", ("workbench.plots", "workbench.report")),
    ("ui", ("workbench.ui",)),
    (
        "apps",
        (
            "workbench.magics",
            "workbench.cli",
            "workbench.demo",
            "workbench.compare",
            "workbench.export",
            "workbench.kernel_launcher",
            "workbench.nbval",
            "workbench.__main__",
        ),
    ),
]
NOTEBOOK_STACK = ("IPython", "ipywidgets", "ipyparallel", "plotly", "anywidget")
# Third-party packages a layer must never import, even inside a function.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "base": ("torch", "numpy", *NOTEBOOK_STACK),
    "trace": NOTEBOOK_STACK,
    "planner": ("torch", "numpy", *NOTEBOOK_STACK),
    "parallel": NOTEBOOK_STACK,
    "plots": ("torch", "IPython", "ipywidgets", "ipyparallel", "anywidget"),
}
# The package root is a lazy façade (``workbench.Cluster`` etc.): it may name any layer.
FACADE = "workbench"


@dataclass(frozen=True, slots=True)
class Import:
    module: str  # the importing module
    target: str  # the imported module, absolute
    line: int


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> list[Import]:
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    return _imports_in(path.read_text(), module, package)


def _imports_in(source: str, module: str, package: str) -> list[Import]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                targets = [".".join([*base, node.module] if node.module else base)]
            else:
                targets = [node.module or ""]
            # `from workbench.x import y` may name a submodule y: count it as x.y when it is one
            targets += [
                f"{targets[0]}.{alias.name}"
                for alias in node.names
                if _is_module(f"{targets[0]}.{alias.name}")
            ]
        else:
            continue
        found += [Import(module, t, node.lineno) for t in targets if t]
    return found


def _is_module(name: str) -> bool:
    if not name.startswith("workbench."):
        return False
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _layer(module: str) -> int | None:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return index
    return None


ALL_IMPORTS = [imp for path in sorted(PACKAGE.rglob("*.py")) for imp in _imports(path)]


def test_every_module_belongs_to_a_layer() -> None:
    modules = {_module_name(p) for p in PACKAGE.rglob("*.py")} - {FACADE}
    assert sorted(m for m in modules if _layer(m) is None) == []


def test_no_layer_imports_a_layer_below_it() -> None:
    upward = []
    for imp in ALL_IMPORTS:
        if imp.module == FACADE or not imp.target.startswith("workbench"):
            continue
        here, there = _layer(imp.module), _layer(imp.target)
        if there is not None and here is not None and there > here:
            upward.append(
                f"{imp.module}:{imp.line} ({LAYERS[here][0]}) imports {imp.target} "
                f"({LAYERS[there][0]})"
            )
    assert upward == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_layer_keeps_out_forbidden_packages(layer: str) -> None:
    index = [name for name, _ in LAYERS].index(layer)
    bad = [
        f"{imp.module}:{imp.line} imports {imp.target}"
        for imp in ALL_IMPORTS
        if _layer(imp.module) == index and imp.target.split(".")[0] in FORBIDDEN[layer]
    ]
    assert bad == []


def test_the_checker_sees_imports_inside_functions() -> None:
    """The rule would be toothless if a function-level import slipped past the reader."""
    source = "def f():\n    import torch\n    from ..ui import stepper\n"
    imports = _imports_in(source, "workbench.planner.probe", "workbench.planner")
    assert {imp.target for imp in imports} == {"torch", "workbench.ui", "workbench.ui.stepper"}
    assert _layer("workbench.ui.stepper") > _layer("workbench.planner.probe")  # type: ignore[operator]


def _runtime_imports(path: Path) -> set[str]:
    """Package modules a module imports when it is itself imported: module-level statements
    outside ``if TYPE_CHECKING:`` (imports inside functions run later and cannot cycle)."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    body: list[ast.stmt] = []
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            body += node.orelse
        else:
            body.append(node)
    source = ast.unparse(
        ast.Module(
            body=[n for n in body if isinstance(n, ast.Import | ast.ImportFrom)], type_ignores=[]
        )
    )
    return {
        imp.target
        for imp in _imports_in(source, module, package)
        if _is_module(imp.target) and imp.target != module
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_modules() -> None:
    graph = {_module_name(p): _runtime_imports(p) for p in PACKAGE.rglob("*.py")}
    # A package's __init__ re-exports its submodules; a submodule importing a sibling through
    # the package is the usual Python idiom, not a cycle between two files.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The subpackages inside a layer, each one concern (its ``__init__`` docstring names it).
SUBPACKAGES = {
    "workbench.parallel.checkpoint": "parallel",
    "workbench.parallel.planning": "parallel",
    "workbench.cluster.dispatch": "cluster",
    "workbench.cluster.doctor": "cluster",
    "workbench.cluster.hosts": "cluster",
    "workbench.cluster.launch": "cluster",
    "workbench.cluster.lifecycle": "cluster",
}


def test_every_package_says_what_it_holds() -> None:
    packages = sorted(p.parent for p in PACKAGE.rglob("__init__.py"))
    silent = [
        _module_name(p / "__init__.py")
        for p in packages
        if not ast.get_docstring(ast.parse((p / "__init__.py").read_text()))
    ]
    assert silent == []
    found = {_module_name(p / "__init__.py") for p in packages if PACKAGE not in (p, p.parent)}
    assert found == set(SUBPACKAGES)
    for name, layer in SUBPACKAGES.items():
        assert LAYERS[_layer(name)][0] == layer  # type: ignore[index]
