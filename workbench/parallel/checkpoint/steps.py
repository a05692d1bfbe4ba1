"""The rank-local steps of a collective checkpoint save or load, and the one error they end in.

A save or load alternates rank-local work with collectives (``agreement``). ``Steps``
runs each local part under ``local()``, which records a failure instead of raising, and
``agree()`` after it, where every rank raises the same ``CheckpointError`` naming the
failing rank(s), or none does: no rank is left waiting alone in the next collective.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch.distributed as dist

from workbench.errors import CheckpointError
from workbench.parallel.agreement import Failures, capture, exchange
from workbench.parallel.step import TrainStep

__all__ = ["Steps", "distributed", "rank_of", "tagged", "world_of"]


def distributed(train_step: TrainStep) -> bool:
    return train_step.strategy != "single" and dist.is_initialized()


def rank_of(train_step: TrainStep) -> int:
    return dist.get_rank() if distributed(train_step) else 0


def world_of(train_step: TrainStep) -> int:
    return dist.get_world_size() if distributed(train_step) else 1


class Steps:
    """The rank-local parts of one collective save / load. ``local()`` records a failure
    instead of raising; ``agree()`` then has every rank raise the same error (or none)."""

    def __init__(self, train_step: TrainStep, what: str) -> None:
        self.train_step = train_step
        self.rank = rank_of(train_step)
        self.what = what
        self.failures: Failures = {}

    def local(self) -> Any:
        return capture(self.failures, self.rank)

    def agree(self, consequence: str = "") -> None:
        if distributed(self.train_step):
            failures = exchange(self.failures, device=self.train_step.device)
        else:
            failures = dict(self.failures)
        self.failures = {}
        if not failures:
            return
        ranks = sorted(r for r in failures if r >= 0)
        distinct = sorted(set(failures.values()))
        if not distributed(self.train_step):
            detail = distinct[0]
            head = f"{self.what} failed"
        else:
            label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
            head = f"{self.what} failed on {label}"
            if len(distinct) == 1:
                detail = distinct[0]
            else:
                detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(failures.items()))
        raise CheckpointError(f"{head}: {detail}{consequence}", ranks=ranks)


@contextmanager
def tagged(train_step: TrainStep) -> Iterator[None]:
    """Tag the events of DCP's own collectives with the ``checkpoint`` phase; DCP warns
    that it assumes one process when there is no process group: expected for ``single``,
    so not shown."""
    recorder = train_step.recorder
    previous, recorder.phase = recorder.phase, "checkpoint"
    try:
        with warnings.catch_warnings():
            if not distributed(train_step):
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            yield
    finally:
        recorder.phase = previous
