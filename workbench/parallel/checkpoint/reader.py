"""DCP reading of exactly the bytes the signed manifest vouches for, without arbitrary
unpickling.

DCP's ``FileSystemReader`` unpickles ``.metadata`` with plain ``pickle``, its default
planner ``torch.load``s non-tensor values with ``weights_only=False`` (either runs code
from a crafted file), and it opens each shard by name when it reads it. Here every file
DCP opens is opened once, without following a symlink, hashed through that same open file
against the manifest's sum, and only then handed to DCP: swapping a shard for another by
rename after the check changes nothing that is read. A write into the same file while it
is read changes its ctime, which is compared once DCP is done with it. ``.metadata`` is
unpickled by ``checkpoint.unpickler`` (DCP's metadata classes only); non-tensor values go
through ``torch.load(weights_only=True)``; tensor shards DCP itself reads with
``weights_only=True``.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future

from workbench.errors import CheckpointError
from workbench.parallel.checkpoint.trust import MANIFEST, stream_digest
from workbench.parallel.checkpoint.unpickler import load_metadata

__all__ = ["VerifiedReader", "WeightsOnlyPlanner", "describe_failure", "load_metadata"]


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


class _VerifiedFiles(FileSystem):
    """DCP's file system, where a stream is a file opened once and checked against its
    manifest sum before DCP reads a byte of it."""

    def __init__(self, root: Path, digests: dict[str, str]) -> None:
        super().__init__()
        self._root = root
        self._digests = digests

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[io.IOBase]:
        if mode != "rb":
            raise CheckpointError(f"a checkpoint is read only here, not opened with {mode!r}")
        name = Path(path).relative_to(self._root).as_posix()
        where = f"{name} of the checkpoint at {str(self._root)!r}"
        expected = self._digests.get(name)
        if expected is None:
            raise CheckpointError(f"{where} is not listed in {MANIFEST}; refusing to read it")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise CheckpointError(f"{where} cannot be opened: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as stream:
            before = os.fstat(stream.fileno())
            if not hmac.compare_digest(stream_digest(stream), expected):
                raise CheckpointError(
                    f"{where} does not match the SHA-256 sum in {MANIFEST} (changed or "
                    "replaced after the save); refusing to load it"
                )
            stream.seek(0)
            yield cast(io.IOBase, stream)
            if _changed(before, os.fstat(stream.fileno())):
                raise CheckpointError(f"{where} was written to while it was read; run again")


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    return (before.st_ctime_ns, before.st_size) != (after.st_ctime_ns, after.st_size)


class VerifiedReader(FileSystemReader):
    """``FileSystemReader`` that reads only what the signed manifest's sums vouch for."""

    def __init__(self, path: str, digests: dict[str, str]) -> None:
        super().__init__(path)
        self.fs = _VerifiedFiles(Path(path), digests)
        self._reading: str | None = None  # the file being read, for error messages

    def _slice_file(self, file: Any, sinfo: Any) -> Any:
        self._reading = sinfo.relative_path
        return super()._slice_file(file, sinfo)

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        try:
            return super().read_data(plan, planner)
        except CheckpointError:
            raise
        except Exception as exc:
            raise CheckpointError(
                f"{self._reading or 'a shard'} of the checkpoint at {str(self.path)!r} "
                f"cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0]}"
            ) from None

    # No **kwargs on purpose: DCP then does not fall back to per-rank ``__<rank>.metadata``
    # files (which the workbench never writes) when the global one is refused.
    def read_metadata(self, *args: Any) -> Metadata:
        with self.fs.create_stream(self._get_metadata_path(), "rb") as f:
            data = f.read()
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
