"""Engine-side functions that build and drive a run of the user's own model.

``build_user_run`` resolves the shipped factories (``shipping.resolve``), wraps each so a
failure names the factory, rank and host, and installs the ``TrainStep`` in the run slot
(``run_slot.install``, as a built-in run is), where the stepper's other engine functions
(``train_run.run_phases`` / ``run_steps`` / ``pull_events``) find it: from there on a user
run is driven exactly like a built-in one.
"""

from __future__ import annotations

from typing import Any

from workbench.engine.fail_together import fail_together
from workbench.engine.run_slot import current_run, install
from workbench.engine.shipping import Shipped, guard, resolve
from workbench.engine.state import user_namespace

__all__ = ["build_user_run", "run_user_reference", "user_shard_indices"]


def _user_run(payload: dict[str, Any]) -> Any:
    from torch.utils.data import Dataset

    from workbench.parallel.parallelize import Layout
    from workbench.parallel.user_model import UserRun

    namespace = user_namespace()
    parts: dict[str, Any] = {}
    for role, shipped in payload["factories"].items():
        if shipped is None:
            parts[role] = None
            continue
        if not isinstance(shipped, Shipped):
            raise TypeError(f"factory {role!r} arrived as {type(shipped).__name__}")
        obj = resolve(shipped, namespace)
        if callable(obj) and not isinstance(obj, Dataset):
            obj = guard(role if role != "data" else "data source", shipped.label, obj)
        parts[role] = obj
    return UserRun(
        **parts,
        layout=Layout(**payload["layout"]),
        strategy=payload["strategy"],
        **payload["options"],
    )


def build_user_run(
    payload: dict[str, Any],
    autosave: dict[str, Any] | None = None,
    record: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """(Re)build this rank's run of the user's model; closes any previous run. A factory
    that raises on one rank ends the build on every rank at once (``fail_together``)."""
    # Resolving the factories touches no collective and fails alike on every rank (a name
    # not defined there): a plain error, the process group stays as it is.
    run = _user_run(payload)
    if run.strategy == "single":  # one rank: no peer waits for it
        return _build_user_run(run, autosave, record)
    return fail_together(_build_user_run, run, autosave, record)


def _build_user_run(
    run: Any, autosave: dict[str, Any] | None, record: dict[str, Any] | None
) -> dict[str, Any]:
    from workbench.parallel.user_model import build_user_train_step

    return install(
        lambda recorder: build_user_train_step(run, recorder=recorder),
        run.trace,
        autosave,
        record,  # the kernel's record= (RecordPolicy fields): dropped steps leave as rows
    )


def run_user_reference(payload: dict[str, Any], steps: int) -> list[float]:
    """Losses of the single-device run of the user's model on the same global batches."""
    from workbench.parallel.user_model import user_reference

    losses, _ = user_reference(_user_run(payload), steps)
    return losses


def user_shard_indices(epoch: int = 0) -> dict[str, Any]:
    """Which samples this rank's sampler deals it in ``epoch`` (the sharding check)."""
    from workbench.parallel.user_model import shard_indices

    return shard_indices(current_run(), epoch)
