"""DCP reading without arbitrary unpickling (defence in depth behind the signed manifest).

DCP's ``FileSystemReader`` unpickles ``.metadata`` with plain ``pickle`` and its default
planner ``torch.load``s non-tensor values with ``weights_only=False``: either runs code
from a crafted file. Here ``.metadata`` is read once, its bytes checked against the
manifest's sum (no window to swap the file after the check) and unpickled by an
unpickler that builds only DCP's metadata classes, ``torch.Size``, dtypes and layouts;
non-tensor values go through ``torch.load(weights_only=True)``. Tensor shards were
already read with ``weights_only=True`` by DCP itself.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import pickle
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from workbench.errors import CheckpointError

__all__ = ["VerifiedReader", "WeightsOnlyPlanner", "describe_failure", "load_metadata"]

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


def describe_failure(exc: BaseException) -> str:
    """One line per failing rank for DCP's ``CheckpointException`` (a ``BaseException``
    whose ``str`` is every rank's traceback); ``Type: message`` for anything else."""
    if isinstance(exc, CheckpointException):
        return "; ".join(
            f"rank {rank}: {describe_failure(inner)}"
            for rank, (inner, _trace) in sorted(exc.failures.items())
        )
    if isinstance(exc, CheckpointError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if name in _METADATA_CLASSES.get(module, ()):
            return super().find_class(module, name)
        if module == "torch":
            value = getattr(torch, name, None)
            if name == "Size" or isinstance(value, torch.dtype):
                return value
        raise CheckpointError(
            f".metadata refers to {module}.{name}, which is not part of DCP's checkpoint "
            "metadata; refusing to unpickle it"
        )


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


class VerifiedReader(FileSystemReader):
    """``FileSystemReader`` whose ``.metadata`` must have the manifest's SHA-256 sum."""

    def __init__(self, path: str, metadata_sha256: str) -> None:
        super().__init__(path)
        self._metadata_sha256 = metadata_sha256
        self._reading: str | None = None  # the file being read, for error messages

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._reading = sinfo.relative_path
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            return super().read_data(plan, planner)
        except Exception as exc:
            raise CheckpointError(
                f"{self._reading or 'a shard'} of the checkpoint at {str(self.path)!r} "
                f"cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            ) from None

    # No **kwargs on purpose: DCP then does not fall back to per-rank ``__<rank>.metadata``
    # files (which the workbench never writes) when the global one is refused.
    def read_metadata(self, *args: Any) -> Metadata:
        path = self._get_metadata_path()
        with self.fs.create_stream(path, "rb") as f:
            data = f.read()
        if not hmac.compare_digest(hashlib.sha256(data).hexdigest(), self._metadata_sha256):
            raise CheckpointError(
                f"{path} changed after its SHA-256 sum was checked; refusing to load it"
            )
        metadata = load_metadata(data)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads non-tensor values with ``weights_only=True``."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded
