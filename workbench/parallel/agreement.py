"""Every rank learns which ranks failed a rank-local part of a collective operation.

A collective save or load alternates rank-local work (reading, checking, writing files)
with collectives. If one rank fails its local part and simply raises, its peers enter
the next collective alone and wait there until the process-group timeout. Instead each
rank catches its local failure and all ranks exchange them in one ``all_gather`` of a
fixed-size byte buffer (JSON, never pickle); then every rank raises the same error, or
none does.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from workbench.parallel.checkpoint.reader import describe_failure

__all__ = ["Failures", "capture", "exchange"]

# rank that failed -> what went wrong
Failures = dict[int, str]

_BUFFER = 8192
_PER_MESSAGE = 1500


@contextmanager
def capture(failures: Failures, rank: int) -> Iterator[None]:
    """Record an exception raised in the block under ``rank`` instead of raising it.

    DCP's ``CheckpointException`` is a ``BaseException`` (not caught by ``except
    Exception``) and already names the ranks that failed inside DCP: those are kept.
    """
    try:
        yield
    except CheckpointException as exc:
        for failed, (inner, _trace) in exc.failures.items():
            failures[int(failed)] = describe_failure(inner)
    except Exception as exc:
        failures[rank] = describe_failure(exc)


def _encode(failures: Failures) -> bytes:
    items = {str(r): m[:_PER_MESSAGE] for r, m in sorted(failures.items())}
    data = json.dumps(items).encode()
    while len(data) > _BUFFER and items:  # many failing ranks: keep the first ones
        items.pop(max(items, key=int))
        data = json.dumps({**items, "-1": "(more ranks failed)"}).encode()
    return data


def _decode(data: bytes) -> Failures:
    try:
        items = json.loads(data.decode("utf-8", errors="replace"))
    except ValueError:
        return {-1: "(an unreadable failure report)"}
    return {int(r): str(m) for r, m in items.items()} if isinstance(items, dict) else {}


def exchange(failures: Failures, *, device: torch.device | None = None) -> Failures:
    """All ranks' ``failures`` merged, on every rank (a collective when distributed)."""
    if not (dist.is_available() and dist.is_initialized()):
        return dict(failures)
    if device is None or (dist.get_backend() == "nccl") != (device.type == "cuda"):
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend() == "nccl"
            else torch.device("cpu")
        )
    payload = _encode(failures) if failures else b""
    mine = torch.zeros(_BUFFER + 4, dtype=torch.uint8)
    mine[:4] = torch.tensor(list(len(payload).to_bytes(4, "little")), dtype=torch.uint8)
    if payload:
        mine[4 : 4 + len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    mine = mine.to(device)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    merged: Failures = {}
    for buf in gathered:
        raw = bytes(buf.cpu().tolist())
        size = int.from_bytes(raw[:4], "little")
        if size:
            for rank, message in _decode(raw[4 : 4 + min(size, _BUFFER)]).items():
                merged.setdefault(rank, message)
    return merged
