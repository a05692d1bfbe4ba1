"""DCP's ``.metadata`` unpickled by an allow-list, in every form CPython 3.11+ writes it.

DCP writes ``.metadata`` with plain ``pickle.dump``; reading it with plain ``pickle`` runs
whatever a crafted file names. This unpickler builds only DCP's metadata classes,
``torch.Size``, dtypes and layouts. What CPython emits for those classes differs by
version, and a checkpoint must load on every supported Python whichever one wrote it:

- an ``Enum`` member (``_MEM_FORMAT_ENCODING``, inside every ``TensorProperties``) is
  pickled by *value* on 3.11.5+, 3.12 and 3.13 (``_MEM_FORMAT_ENCODING(0)``), but by
  *name* on 3.11.0-3.11.4 — Debian 12's ``/usr/bin/python3`` is 3.11.2 — as
  ``builtins.getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")``. That ``getattr``
  is answered by a guarded stand-in that looks up a member of an allowed enum class by a
  plain string name and does nothing else (``getattr(os, "system")`` is refused);
- 3.13 names ``pathlib._local.PosixPath`` (the ``checkpoint_id`` in ``StorageMeta``),
  which 3.11 and 3.12 know as ``pathlib.PosixPath``;
- dataclasses and ``OrderedDict`` pickle the same on all of them.

``tests/parallel/test_metadata_versions.py`` writes ``.metadata`` with each interpreter
it finds and loads every one here.
"""

from __future__ import annotations

import enum
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from workbench.errors import CheckpointError

__all__ = ["load_metadata"]

_METADATA_CLASSES = {
    "torch.distributed.checkpoint.metadata": {
        "BytesStorageMetadata",
        "ChunkStorageMetadata",
        "Metadata",
        "MetadataIndex",
        "StorageMeta",
        "TensorProperties",
        "TensorStorageMetadata",
        "_MEM_FORMAT_ENCODING",
    },
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.serialization": {"_get_layout"},  # maps a layout's name to torch.strided etc.
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath"},
    "collections": {"OrderedDict"},
}
# Python 3.13 moved pathlib's classes into ``pathlib._local`` (and pickles them so); the
# same classes under the name every supported Python has.
_RENAMED = {("pathlib._local", name): ("pathlib", name) for name in _METADATA_CLASSES["pathlib"]}


def _refuse(what: str) -> CheckpointError:
    return CheckpointError(
        f".metadata refers to {what}, which is not part of DCP's checkpoint metadata; "
        "refusing to unpickle it"
    )


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file)
        # The enum classes this file may name a member of: only allowed ones, and only
        # those the file itself loaded through find_class (so by the allow-list).
        self._enums: set[type[enum.Enum]] = set()

    def find_class(self, module: str, name: str) -> Any:
        module, name = _RENAMED.get((module, name), (module, name))
        if name in _METADATA_CLASSES.get(module, ()):
            found = super().find_class(module, name)
            if isinstance(found, type) and issubclass(found, enum.Enum):
                self._enums.add(found)
            return found
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(value, torch.dtype):
                return value
        if module == "builtins" and name == "getattr":
            return self._enum_member  # Python 3.11.0-3.11.4's enum-by-name form
        raise _refuse(f"{module}.{name}")

    def _enum_member(self, cls: Any, name: Any, *default: Any) -> enum.Enum:
        """``getattr(EnumClass, "NAME")`` for an allowed enum class and one of its member
        names — the only call of ``getattr`` CPython's pickling of these classes makes."""
        if default or cls not in self._enums:
            raise _refuse(f"builtins.getattr of {_describe(cls)}")
        if type(name) is not str or name not in cls.__members__:
            raise _refuse(f"builtins.getattr({cls.__qualname__}, {_describe(name)})")
        return cls.__members__[name]


def _describe(value: Any) -> str:
    """A short, safe description of what a crafted file passed to ``getattr``."""
    if isinstance(value, type):
        return f"the class {value.__module__}.{value.__qualname__}"
    if type(value) is str:
        return f"a member {value[:40]!r} that the class does not have"
    return f"a {type(value).__name__}"


def load_metadata(data: bytes) -> Metadata:
    """Unpickle ``.metadata`` bytes, building only DCP's metadata classes."""
    try:
        metadata = _MetadataUnpickler(io.BytesIO(data)).load()
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f".metadata cannot be read: {type(exc).__name__}: {exc}") from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f".metadata holds a {type(metadata).__name__}, not DCP's Metadata; refusing it"
        )
    return metadata
