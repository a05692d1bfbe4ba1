"""A checkpoint's ``.metadata`` loads whichever supported Python wrote it.

CPython pickles DCP's metadata differently by version: 3.11.0-3.11.4 (Debian 12's
``/usr/bin/python3`` is 3.11.2) write an enum member as ``builtins.getattr(cls, "NAME")``,
later versions by value; 3.13 names ``pathlib._local.PosixPath``. Every interpreter found
here writes ``.metadata`` (``metadata_writer.py``: with DCP itself where it has torch, else
DCP's own metadata classes over a stand-in torch), and each file must load through the
restricted unpickler to the very tree this process saved. Files committed under
``data/`` were written by DCP on Debian's 3.11.2 and on 3.11.7, so the cross-version
load is checked on any machine.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint.metadata as dcp_metadata
from torch.distributed.checkpoint.metadata import Metadata

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.unpickler import _MetadataUnpickler, load_metadata

HERE = Path(__file__).resolve().parent
WRITER = HERE / "metadata_writer.py"
DATA = HERE / "data"
DCP_DIR = Path(dcp_metadata.__file__).parent


def _candidates() -> list[str]:
    found = [sys.executable, "/usr/bin/python3"]
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv.is_dir():
        found += sorted(str(p / "bin" / "python3") for p in pyenv.iterdir())
    found += [p for p in (shutil.which(f"python3.{m}") for m in range(11, 15)) if p]
    return found


@functools.cache
def _probe(python: str) -> tuple[tuple[int, int, int], bool] | None:
    """(version, has torch) of an interpreter, or None where it is absent or < 3.11."""
    if not os.access(python, os.X_OK):
        return None
    code = (
        "import sys, importlib.util as u; "
        "print(*sys.version_info[:3], int(u.find_spec('torch') is not None))"
    )
    try:
        out = subprocess.run([python, "-I", "-c", code], capture_output=True, text=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    major, minor, micro, has_torch = (int(x) for x in out.stdout.split())
    if (major, minor) < (3, 11):
        return None
    return (major, minor, micro), bool(has_torch)


def _interpreters() -> list[str]:
    seen: dict[tuple[int, int, int], str] = {}
    for python in _candidates():
        probed = _probe(python)
        if probed is not None:
            seen.setdefault(probed[0], python)
    return [seen[v] for v in sorted(seen)]


def _saved(tmp: Path) -> Metadata:
    """What this process's DCP writes for the writer's fixed state dict."""
    state = {"w": torch.arange(12.0).reshape(4, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}
    state["step"] = 3
    dcp.save(state, checkpoint_id=str(tmp), no_dist=True)
    return load_metadata((tmp / ".metadata").read_bytes())


def _describe(value: Any) -> Any:
    """A JSON tree ``metadata_writer._build`` rebuilds into the same objects."""
    if isinstance(value, torch.Size):
        return {"size": list(value)}
    if isinstance(value, torch.dtype):
        return {"dtype": str(value).removeprefix("torch.")}
    if isinstance(value, torch.layout):
        return {"layout": str(value)}
    if isinstance(value, torch.memory_format):
        return {"memory_format": str(value).removeprefix("torch.")}
    if isinstance(value, pathlib.PurePath):
        return {"path": str(value)}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = {f.name: _describe(getattr(value, f.name)) for f in dataclasses.fields(value)}
        cls = type(value)
        return {"object": {"class": f"{cls.__module__}:{cls.__qualname__}", "fields": fields}}
    if isinstance(value, dict):
        return {"dict": [[_describe(k), _describe(v)] for k, v in value.items()]}
    if isinstance(value, tuple):
        return {"tuple": [_describe(v) for v in value]}
    if isinstance(value, list):
        return [_describe(v) for v in value]
    assert value is None or isinstance(value, str | int | float | bool), type(value)
    return value


def _same_tree(loaded: Metadata, expected: Metadata) -> None:
    assert loaded.state_dict_metadata == expected.state_dict_metadata
    assert loaded.planner_data == expected.planner_data
    assert loaded.storage_data == expected.storage_data
    assert loaded.version == expected.version
    assert loaded.storage_meta is not None and expected.storage_meta is not None
    # Where it was saved differs (a real save elsewhere); what it is must not.
    assert type(loaded.storage_meta.checkpoint_id) is type(expected.storage_meta.checkpoint_id)


def _write(python: str, tmp: Path, expected: Metadata) -> bytes:
    out = tmp / "written"
    probed = _probe(python)
    assert probed is not None
    has_torch = probed[1]
    if has_torch:
        subprocess.run([python, "-I", str(WRITER), "real", str(out)], check=True)
        return (out / ".metadata").read_bytes()
    desc = tmp / "desc.json"
    desc.write_text(json.dumps(_describe(expected)))
    subprocess.run(
        [python, "-I", str(WRITER), "standin", str(DCP_DIR), str(desc), str(out)], check=True
    )
    return out.read_bytes()


class _Recording(_MetadataUnpickler):
    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.found: set[tuple[str, str]] = set()

    def find_class(self, module: str, name: str) -> Any:
        self.found.add((module, name))
        return super().find_class(module, name)


def _globals(data: bytes) -> set[tuple[str, str]]:
    """Every (module, name) a pickle refers to, as the unpickler is asked for them."""
    recording = _Recording(data)
    recording.load()
    return recording.found


_PYTHONS = _interpreters()


def _label(python: str) -> str:
    probed = _probe(python)
    assert probed is not None
    return ".".join(map(str, probed[0])) + ("" if probed[1] else "-standin")


@pytest.mark.engines
@pytest.mark.parametrize("python", _PYTHONS, ids=[_label(p) for p in _PYTHONS])
def test_metadata_written_by_each_python_loads_here(python: str, tmp_path: Path) -> None:
    expected = _saved(tmp_path / "here")
    data = _write(python, tmp_path, expected)
    probed = _probe(python)
    assert probed is not None
    if probed[0] < (3, 11, 5):
        assert ("builtins", "getattr") in _globals(data), "3.11.0-3.11.4 pickle enums by name"
    if probed[0] >= (3, 13):
        assert ("pathlib._local", "PosixPath") in _globals(data)
    _same_tree(load_metadata(data), expected)


@pytest.mark.engines
def test_standin_writes_what_dcp_writes_on_this_python(tmp_path: Path) -> None:
    """The stand-in used for interpreters without torch pickles as DCP itself does."""
    expected = _saved(tmp_path / "here")
    desc = tmp_path / "desc.json"
    desc.write_text(json.dumps(_describe(expected)))
    out = tmp_path / "standin.metadata"
    cmd = [sys.executable, "-I", str(WRITER), "standin", str(DCP_DIR), str(desc), str(out)]
    subprocess.run(cmd, check=True)
    real = (tmp_path / "here" / ".metadata").read_bytes()
    assert _globals(out.read_bytes()) == _globals(real)
    _same_tree(load_metadata(out.read_bytes()), expected)


@pytest.mark.parametrize("name", ["metadata-py3.11.2.bin", "metadata-py3.11.7.bin"])
def test_committed_metadata_of_other_pythons_loads(name: str, tmp_path: Path) -> None:
    loaded = load_metadata((DATA / name).read_bytes())
    expected = _saved(tmp_path / "here")
    assert loaded.state_dict_metadata == expected.state_dict_metadata
    assert loaded.storage_data == expected.storage_data
    assert loaded.planner_data == expected.planner_data


def _crafted(func: tuple[str, str], *args: tuple[str, str] | str | int) -> bytes:
    """A pickle calling ``func(*args)``, each arg a global (module, name), a str or an
    int, written opcode by opcode as an attacker would (protocol 2, no framing)."""

    def glob(ref: tuple[str, str]) -> bytes:
        return b"c" + f"{ref[0]}\n{ref[1]}\n".encode()

    def arg(value: tuple[str, str] | str | int) -> bytes:
        if isinstance(value, tuple):
            return glob(value)
        if isinstance(value, str):
            raw = value.encode()
            return b"X" + len(raw).to_bytes(4, "little") + raw
        return b"J" + value.to_bytes(4, "little", signed=True)

    return b"\x80\x02" + glob(func) + b"(" + b"".join(arg(a) for a in args) + b"tR."


_GETATTR = ("builtins", "getattr")
_ENCODING = ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING")


@pytest.mark.parametrize(
    ("args", "refused"),
    [
        ((("pathlib", "PosixPath"), "home"), r"getattr of the class pathlib\.PosixPath"),
        (
            (("torch.distributed.checkpoint.metadata", "TensorProperties"), "__init__"),
            r"getattr of the class torch\.distributed\.checkpoint\.metadata\.TensorProperties",
        ),
        ((_ENCODING, 0), r"getattr\(_MEM_FORMAT_ENCODING, a int\)"),
        ((_ENCODING, "__class__"), r"a member '__class__' that the class does not have"),
        ((_ENCODING, "mro"), r"a member 'mro' that the class does not have"),
        ((_ENCODING, "TORCH_CONTIGUOUS_FORMAT", 0), r"getattr of"),
        ((("signal", "Signals"), "SIGKILL"), r"refers to signal\.Signals"),
        ((("os", "system"), "x"), r"refers to os\.system"),
    ],
    ids=[
        "allowed-class-attribute",
        "dataclass-method",
        "non-string-name",
        "dunder-name",
        "enum-method",
        "with-default",
        "enum-not-allowed",
        "module-function",
    ],
)
def test_crafted_getattr_is_refused(args: tuple[Any, ...], refused: str) -> None:
    with pytest.raises(CheckpointError, match=refused):
        load_metadata(_crafted(_GETATTR, *args))


def test_enum_member_by_name_and_by_value_both_load() -> None:
    member = dcp_metadata._MEM_FORMAT_ENCODING.TORCH_CHANNELS_LAST
    by_name = _crafted(_GETATTR, _ENCODING, "TORCH_CHANNELS_LAST")
    by_value = _crafted(_ENCODING, 1)
    for data in (by_name, by_value):
        assert _MetadataUnpickler(io.BytesIO(data)).load() is member
        with pytest.raises(CheckpointError, match="holds a _MEM_FORMAT_ENCODING, not DCP's"):
            load_metadata(data)  # a bare member is no Metadata: built, then refused


def test_pathlib_of_python_3_13_loads_on_any_python() -> None:
    data = pickle.dumps(pathlib.PosixPath("/ckpt"), protocol=2)
    renamed = data.replace(b"cpathlib\nPosixPath\n", b"cpathlib._local\nPosixPath\n")
    assert renamed != data
    assert _MetadataUnpickler(io.BytesIO(renamed)).load() == pathlib.PosixPath("/ckpt")
