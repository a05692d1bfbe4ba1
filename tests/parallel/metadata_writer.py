"""Write DCP's ``.metadata`` with whatever Python runs this script (3.11 and later).

Run by ``test_metadata_versions.py`` under every interpreter it finds, so that the
restricted unpickler is tested on the pickles each CPython version really writes.

``real OUT``: the interpreter has torch; ``dcp.save`` a fixed state dict into OUT and
print nothing (the test compares what it reads back with its own save).

``standin TORCH_CKPT_DIR DESC OUT``: the interpreter has no torch (only Python 3.11's
torch wheel is on this machine). A stand-in ``torch`` package is laid out in a temporary
folder: DCP's own ``metadata.py`` copied unchanged from TORCH_CKPT_DIR, its
``_StorageInfo`` class copied from ``filesystem.py``, and ``Size`` / dtypes / layouts /
memory formats that reduce as torch's do (``torch.Size(t)``, the dtype's global name,
``torch.serialization._get_layout(name)``). The metadata tree described in the JSON file
DESC is rebuilt from those classes and pickled as DCP pickles it (``pickle.dump``,
default protocol) into OUT. What varies by interpreter — how its ``pickle``, ``enum``
and ``dataclasses`` reduce these classes — is then exactly what that interpreter does.
"""

from __future__ import annotations

import ast
import json
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any

_TORCH_INIT = """
import copyreg
from torch import serialization


class Size(tuple):
    def __reduce__(self):
        return (Size, (tuple(self),))


class dtype:
    def __init__(self, name):
        self.name = name

    def __reduce__(self):
        return self.name


class layout:
    def __init__(self, name):
        self.name = name


class memory_format:
    def __init__(self, name):
        self.name = name


class Tensor:
    pass


for _name in ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8",
              "uint8", "bool"):
    globals()[_name] = dtype(_name)
strided = layout("torch.strided")
sparse_coo = layout("torch.sparse_coo")
contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
preserve_format = memory_format("preserve_format")
copyreg.pickle(layout, lambda obj: (serialization._get_layout, (obj.name,)))


def get_default_dtype():
    return float32
"""

_SERIALIZATION = """
def _get_layout(name):
    import torch
    return {"torch.strided": torch.strided, "torch.sparse_coo": torch.sparse_coo}[name]
"""


def _storage_info_source(filesystem_py: Path) -> str:
    """DCP's ``_StorageInfo`` class, copied from its ``filesystem.py``."""
    source = filesystem_py.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "_StorageInfo":
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            lines = source.splitlines()[first - 1 : node.end_lineno]
            header = "from collections.abc import Sequence\nfrom dataclasses import dataclass\n"
            return header + "\n" + "\n".join(lines) + "\n"
    raise SystemExit(f"no _StorageInfo in {filesystem_py}")


def _lay_out_standin(root: Path, dcp_dir: Path) -> None:
    ckpt = root / "torch" / "distributed" / "checkpoint"
    ckpt.mkdir(parents=True)
    (root / "torch" / "__init__.py").write_text(_TORCH_INIT)
    (root / "torch" / "serialization.py").write_text(_SERIALIZATION)
    (root / "torch" / "distributed" / "__init__.py").write_text("")
    (ckpt / "__init__.py").write_text("")
    (ckpt / "stateful.py").write_text("StatefulT = object\n")
    (ckpt / "metadata.py").write_text((dcp_dir / "metadata.py").read_text())
    (ckpt / "filesystem.py").write_text(_storage_info_source(dcp_dir / "filesystem.py"))


def _build(node: Any) -> Any:
    """The object a JSON node of ``describe`` (in the test) stands for."""
    import importlib
    import pathlib

    import torch

    if isinstance(node, list):
        return [_build(item) for item in node]
    if not isinstance(node, dict):
        return node
    kind, value = next(iter(node.items()))
    if kind == "tuple":
        return tuple(_build(item) for item in value)
    if kind == "dict":
        return {_build(k): _build(v) for k, v in value}
    if kind == "size":
        return torch.Size(value)
    if kind == "dtype":
        return getattr(torch, value)
    if kind == "layout":
        return torch.serialization._get_layout(value)
    if kind == "memory_format":
        return getattr(torch, value)
    if kind == "path":
        return pathlib.Path(value)
    if kind == "object":
        module, name = value["class"].rsplit(":", 1)
        cls = getattr(importlib.import_module(module), name)
        return cls(**{k: _build(v) for k, v in value["fields"].items()})
    raise SystemExit(f"unknown node {kind!r}")


def _write_real(out: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    state = {"w": torch.arange(12.0).reshape(4, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    state["step"] = 3
    dcp.save(state, checkpoint_id=str(out), no_dist=True)


def main(argv: list[str]) -> None:
    if argv[:1] == ["real"]:
        _write_real(Path(argv[1]))
        return
    _, dcp_dir, desc, out = argv
    with tempfile.TemporaryDirectory() as tmp:
        _lay_out_standin(Path(tmp), Path(dcp_dir))
        sys.path.insert(0, tmp)
        metadata = _build(json.loads(Path(desc).read_text()))
        with open(out, "wb") as f:
            pickle.dump(metadata, f)


if __name__ == "__main__":
    main(sys.argv[1:])
