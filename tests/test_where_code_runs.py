"""What the kernel ships to engines is engine code, read statically from the source.

DESIGN.md: where code runs decides where it lives. The kernel's packages (``cluster/``,
``session/``) send functions to engines with ``apply_async`` / ``Cluster.run``; each such
function must be defined in ``workbench.engine`` (or outside the package: the standard
library, the user's own), never in the kernel package that sends it, so an engine never
imports the kernel-side stack to run it.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_SIDE = ("cluster", "session")
SENDS = {"apply_async", "apply_sync", "apply", "run"}


def _imported_names(tree: ast.Module, module: str) -> dict[str, str]:
    """Local name -> the dotted module or object it was imported as."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name.split(".")[0]] = alias.name
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names[node.name] = f"{module}.{node.name}"
    return names


def _shipped(source: str, module: str) -> list[tuple[int, str]]:
    """(line, dotted origin) of each function named as the first argument of a send."""
    tree = ast.parse(source)
    names = _imported_names(tree, module)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in SENDS or not node.args:
            continue
        first = node.args[0]
        if isinstance(first, ast.Name) and first.id in names:
            found.append((node.lineno, names[first.id]))
        elif (
            isinstance(first, ast.Attribute)
            and isinstance(first.value, ast.Name)
            and first.value.id in names
        ):
            found.append((node.lineno, f"{names[first.value.id]}.{first.attr}"))
    return found


def _module(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _kernel_files() -> list[Path]:
    return [p for d in KERNEL_SIDE for p in sorted((ROOT / "workbench" / d).rglob("*.py"))]


def test_the_kernel_ships_only_engine_code_to_engines() -> None:
    wrong = [
        f"{path.relative_to(ROOT)}:{line} ships {origin}"
        for path in _kernel_files()
        for line, origin in _shipped(path.read_text(), _module(path))
        if origin.startswith("workbench.") and not origin.startswith("workbench.engine.")
    ]
    assert wrong == []


def test_the_reader_sees_a_kernel_function_shipped() -> None:
    """The rule would be toothless if the reader missed the shapes the start sequence uses."""
    source = (
        "from workbench.engine import boot\n"
        "from workbench.cluster.hosts.rendezvous import open_probe\n"
        "def here(): ...\n"
        "def go(client):\n"
        "    client[0].apply_async(open_probe, 'a')\n"
        "    client[0].apply_async(boot.exit_now)\n"
        "    client[0].apply_async(here)\n"
    )
    origins = [origin for _, origin in _shipped(source, "workbench.cluster.start")]
    assert origins == [
        "workbench.cluster.hosts.rendezvous.open_probe",
        "workbench.engine.boot.exit_now",
        "workbench.cluster.start.here",
    ]
