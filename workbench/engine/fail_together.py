"""Engine side: a failure on one rank ends the operation on every rank, at once.

When one rank's training step raises (its data ran out, a bug, an OOM), its peers carry on
into the next collective and would wait there for it until the process-group timeout.
So the failing rank first writes its error into the rendezvous store (key
``wb-failed/<rank>``), then drops its run and destroys its process group: a peer blocked
in a collective with it fails at once ("connection closed by peer"), reads the store, and
raises an error naming the rank that failed first (and does the same, freeing the next).
``TrainingSession`` then re-creates the group (``cluster.recover_sync()``) before the run
is rebuilt (``recover()`` / ``reset()``), or ``%wb restart`` restarts everything.

Measured (torch 2.13, gloo): destroying the group with no reference left to it frees a
blocked peer within milliseconds; ``ProcessGroup.shutdown()`` does not (the peer waited
until the process exited), and neither does a live reference (the exception's traceback
holds the run's frames, hence the teardown after the ``except`` block).
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable
from typing import Any, TypeVar

from workbench.engine.state import engine_state
from workbench.errors import CheckpointError, PeerFailed, RankFailed

__all__ = ["fail_together"]

T = TypeVar("T")
_KEY = "wb-failed"
_MESSAGE = 500


def _distributed() -> Any:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist
    return None


def _announced(dist: Any, store: Any, rank: int) -> dict[int, str]:
    """The failures other ranks wrote into the store (none when it is unreachable)."""
    found: dict[int, str] = {}
    for other in range(dist.get_world_size()):
        key = f"{_KEY}/{other}"
        if other == rank:
            continue
        try:
            if store.check([key]):
                found[other] = store.get(key).decode(errors="replace")
        except Exception:  # rank 0's store went with its engine: nothing to read
            break
    return found


def _drop_group(dist: Any, store: Any) -> None:
    """Close this rank's run and destroy its process groups. The store is kept (rank 0
    serves it) so that every peer can still read who failed; the next process group
    replaces it.

    The group's connections are cut at the socket as well (``teardown_rank(sever=True)``):
    destroying a group closes them only when nothing else holds it, and something did when
    a user's model factory raised on one rank before DDP was built (measured: its peer
    waited in DDP's parameter check until the group's 60 s timeout)."""
    from workbench.engine.process_group import teardown_rank

    engine_state().keep_failed_store(store)
    with contextlib.suppress(Exception):
        teardown_rank(sever=True)


def _describe(exc: BaseException) -> str:
    """The failure with where it happened (the exception itself is not kept: its
    frames hold the run, whose process group must be freed)."""
    where = "".join(traceback.format_exception(exc, limit=-12)).rstrip()
    return f"{type(exc).__name__}: {exc}\n\nOn this rank:\n{where}"


def fail_together(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(*args)``; on failure make sure no peer is left waiting for this rank.

    A ``CheckpointError`` that every rank already agreed on (``ranks`` set) leaves the
    group intact: every rank raised it at the same point.
    """
    try:
        return fn(*args)
    except Exception as exc:
        if (isinstance(exc, CheckpointError) and exc.ranks is not None) or _distributed() is None:
            raise
        failure, short = _describe(exc), f"{type(exc).__name__}: {exc}"
    # Outside the except block: the traceback (and the run it references) is released.
    dist = _distributed()
    rank = dist.get_rank()
    store = dist.distributed_c10d._get_default_store()
    first = _announced(dist, store, rank)
    if not first:
        # No store (rank 0's engine died): the peers still fail once the group is gone.
        with contextlib.suppress(Exception):
            store.set(f"{_KEY}/{rank}", short[:_MESSAGE])
    _drop_group(dist, store)
    if not first:
        raise RankFailed(
            f"rank {rank} failed: {failure}\n\nIts process group was closed on every rank "
            "so that none waits for it."
        )
    ranks = sorted(first)
    label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
    detail = "; ".join(f"rank {r}: {m}" for r, m in sorted(first.items()))
    raise PeerFailed(
        f"rank {rank} stopped because {label} failed ({detail}); the process group was "
        "closed on every rank so that none waits for it"
    )
