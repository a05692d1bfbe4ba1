"""The ownership rule (issue 41), read statically from the source like test_layers.py.

Every piece of state has one owner whose methods change it. Two things break that and can be
seen without running anything:

- **An import circle**: two modules that each need the other's insides, counting every
  import: module level, inside functions, under ``if TYPE_CHECKING:``. A circle hidden in a
  function or a type-only import is still one owner split over two files.
- **A write to a handed-in object**: ``param.attr = ...`` (or ``param.a.b = ...``,
  ``param.attr += ...``, ``setattr(param, ...)``) where ``param`` is an argument of the
  function (or of a function around it) other than ``self``/``cls``. The object's owner is
  elsewhere; the function should ask it, or answer with a return value.

The few writes that remain are listed with the reason each is the right design. The
package root is a lazy façade; no module inside the package imports it.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_layers import PACKAGE, _cycles, _imports, _imports_in, _module_name

# "path::function::param.attr" -> why this function writes an object it was handed.
WRITES_ALLOWED: dict[str, str] = {
    "magics/__init__.py::load_ipython_extension::setattr(ipython)": (
        "IPython's extension hook is handed the shell; the extension's magics object lives "
        "on it (shell._workbench_magics) so unload and tests find the one this shell loaded"
    ),
    "nbval/plugin.py::pytest_configure::config.option.nbval_sanitize_with": (
        "pytest's configure hook: nbval reads its sanitizer path from config.option lazily, "
        "so the merged rules file is pointed at there, the one way pytest offers"
    ),
    "parallel/collectives.py::keep_for_backward::setattr(ctx)": (
        "torch.autograd.Function hands forward a ctx to keep backward's non-tensor state "
        "(process group, splits); every Function of parallel/ writes it through this one"
    ),
}
MAX_WRITES_ALLOWED = 10


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {imp.target for imp in _imports(path) if imp.target in modules}
        # `from workbench.x import y` also names workbench.x; a module importing its own
        # package (the usual re-export idiom) is not a circle between two files.
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
    return graph


def test_no_import_circle_in_the_package_type_only_imports_included() -> None:
    assert _cycles(_graph()) == []


def test_no_module_imports_the_package_root() -> None:
    """`import workbench` inside the package closes a loop through the root's façade."""
    root = [
        f"{_module_name(p)}:{imp.line}"
        for p in PACKAGE.rglob("*.py")
        if p != PACKAGE / "__init__.py"
        for imp in _imports(p)
        if imp.target == "workbench" and not _names_only_submodules(p, imp.line)
    ]
    assert root == []


def _names_only_submodules(path: Path, line: int) -> bool:
    """`from workbench import validate` imports a module, not the façade's names."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.lineno == line and node.module == "workbench":
            return all(
                (PACKAGE / f"{a.name}.py").exists() or (PACKAGE / a.name).is_dir()
                for a in node.names
            )
    return False


def _root_name(node: ast.expr) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _attribute_path(node: ast.Attribute) -> str:
    parts = []
    current: ast.expr = node
    while isinstance(current, ast.Attribute):
        parts.append(current.attr)
        current = current.value
    return ".".join([_root_name(node) or "?", *reversed(parts)])


def _params(func: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> set[str]:
    a = func.args
    names = {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    names |= {x.arg for x in (a.vararg, a.kwarg) if x is not None}
    return names - {"self", "cls"}


def handed_in_writes(source: str, path: str) -> list[str]:
    """Every ``param.attr = ...`` in the source, as ``path::function::param.attr``."""
    found: list[str] = []

    def visit(node: ast.AST, qualname: str, params: set[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                visit(child, f"{qualname}{child.name}.", set())
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                own = _params(child)
                # a closure writes its outer function's arguments too, unless it shadows them
                visit(child, f"{qualname}{child.name}.", (params - own) | own)
            else:
                for target in _targets(child):
                    if isinstance(target, ast.Attribute) and _root_name(target) in params:
                        found.append(f"{path}::{qualname.rstrip('.')}::{_attribute_path(target)}")
                if (
                    isinstance(child, ast.Call)
                    and isinstance(child.func, ast.Name)
                    and child.func.id == "setattr"
                    and child.args
                    and _root_name(child.args[0]) in params
                ):
                    found.append(
                        f"{path}::{qualname.rstrip('.')}::setattr({_root_name(child.args[0])})"
                    )
                visit(child, qualname, params)

    visit(ast.parse(source), "", set())
    return found


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        out: list[ast.expr] = []
        for t in node.targets:
            out += list(t.elts) if isinstance(t, ast.Tuple | ast.List) else [t]
        return out
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    return []


def _all_writes() -> list[str]:
    return [
        w
        for p in sorted(PACKAGE.rglob("*.py"))
        for w in handed_in_writes(p.read_text(), str(p.relative_to(PACKAGE)))
    ]


def test_no_function_writes_an_object_it_was_handed_unless_listed_with_a_reason() -> None:
    writes = _all_writes()
    assert sorted(set(writes) - set(WRITES_ALLOWED)) == []
    # the list names only writes that still exist, and stays short
    assert sorted(set(WRITES_ALLOWED) - set(writes)) == []
    assert len(WRITES_ALLOWED) <= MAX_WRITES_ALLOWED


def test_the_write_finder_sees_nested_chained_augmented_and_setattr_writes() -> None:
    source = (
        "def f(engines, n):\n"
        "    engines.state = 'x'\n"
        "    engines.ranks.master = 1\n"
        "    n.count += 1\n"
        "    setattr(engines, 'y', 2)\n"
        "    def inner():\n"
        "        engines.z = 3\n"
        "    class C:\n"
        "        def m(self, other):\n"
        "            self.ok = 1\n"
        "            other.bad = 2\n"
    )
    assert handed_in_writes(source, "m.py") == [
        "m.py::f::engines.state",
        "m.py::f::engines.ranks.master",
        "m.py::f::n.count",
        "m.py::f::setattr(engines)",
        "m.py::f.inner::engines.z",
        "m.py::f.C.m::other.bad",
    ]


def test_the_circle_finder_counts_type_only_and_function_level_imports() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from workbench.ui import stepper\n"
        "def f():\n"
        "    from workbench.session import training\n"
    )
    found = {i.target for i in _imports_in(source, "workbench.trace.x", "workbench.trace")}
    assert {"workbench.ui.stepper", "workbench.session.training"} <= found
    assert _cycles({"a": {"b"}, "b": {"a"}}) == [["a", "b"]]
