"""``workbench.export``: the notebook's run, or a script, as a torchrun command and an sbatch job.

    wb.export(stepper, "job/")                 # the stepper's run (its steps so far)
    wb.export(comparison, "jobs/")             # one folder per strategy of wb.compare
    wb.export("train.py", "job/", args=["--epochs", "2"], procs_per_node=2)

A run is rebuilt without a notebook by ``python -m workbench.parallel.job run.json``
(``session/job_files.py`` writes the files); a script runs as it is under ``torchrun``.
Everything is checked here, before anything is written: what cannot be exported (a factory
defined in the notebook, a lambda, a name defined only on the engines, an explicit
``checkpoint_key=``) fails with one message saying what to do instead.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from workbench import validate
from workbench.cluster.dispatch.scripts import script_args, script_path
from workbench.compare import StrategyComparison
from workbench.errors import ConfigError
from workbench.session.job_files import DEFAULT_PORT, Export, JobShape, job_for_run, write_export
from workbench.session.training import TrainingSession
from workbench.ui.stepper import Stepper

__all__ = ["Export", "export"]


def _procs(world: int, nodes: int, procs_per_node: int | None) -> int:
    if procs_per_node is not None:
        return procs_per_node
    if world % nodes:
        raise validate.invalid(
            "nodes", nodes, f"the run's {world} ranks do not split evenly over them",
            f"give procs_per_node= or a divisor of {world}",
        )  # fmt: skip
    return max(world // nodes, 1)


def _key_dir(session: TrainingSession) -> str | None:
    """The folder of the key that signs the session's checkpoints (created as a save
    would), or None when the run saves none."""
    if session.checkpoint_dir is None:
        return None
    if session.checkpoint_key is not None:
        raise ConfigError(
            "checkpoint_key=<bytes> cannot be exported: a job reads its key from a file, "
            "never from the job folder. Save the key as checkpoint.key (mode 0600) in a "
            "folder, set WORKBENCH_STATE_DIR to it and make the stepper without checkpoint_key="
        )
    from workbench.parallel.checkpoint.trust import checkpoint_key, state_dir

    checkpoint_key()
    return str(state_dir())


def _run_world(spec: Any, world: int) -> int:
    """The ranks the run spans on a cluster of ``world``: one for ``single``."""
    return 1 if getattr(spec, "strategy", None) == "single" else world


def _shape(run_world: int, shape_args: dict[str, Any]) -> JobShape:
    nodes = shape_args["nodes"]
    return JobShape(
        nodes=nodes,
        procs_per_node=_procs(run_world, nodes, shape_args["procs_per_node"]),
        gpus=shape_args["gpus"],
    )


def _export_session(
    session: TrainingSession, directory: Path, steps: int, shape_args: dict[str, Any]
) -> Export:
    shape = _shape(_run_world(session.spec, session.cluster.world_size), shape_args)
    job = job_for_run(session.spec, shape.world_size, steps)
    if session.checkpoint_dir is not None and session.checkpoint_every:
        job["checkpoint"] = {
            "dir": session.checkpoint_dir,
            "every": session.checkpoint_every,
            "keep_last": session.keep_last,
        }
    return write_export(
        directory, shape=shape, job=job, key_dir=_key_dir(session), port=shape_args["port"]
    )


def _stepper_steps(stepper: Stepper, steps: int | None) -> int:
    if steps is not None:
        return steps
    done = stepper.session.step_index
    if done < 1:
        raise validate.invalid(
            "steps", steps, "the stepper has run no step yet", "give steps=N (the job's length)"
        )
    return done


def export(
    target: Any,
    directory: str | os.PathLike[str],
    *,
    steps: int | None = None,
    nodes: int = 1,
    procs_per_node: int | None = None,
    gpus: bool = False,
    args: Sequence[str | int | float] = (),
    port: int = DEFAULT_PORT,
) -> Export | list[Export]:
    """Write ``torchrun.sh`` and ``job.sbatch`` (and ``run.json`` for a run) into
    ``directory`` that run ``target`` without a notebook: a ``Stepper``, the result of
    ``wb.compare`` (one sub-folder per strategy) or a script path (with ``args``).
    ``nodes`` x ``procs_per_node`` ranks (default: the run's ranks on one node), one GPU
    per rank with ``gpus=True``; ``steps`` defaults to the stepper's steps so far."""
    if not isinstance(directory, str | os.PathLike) or not os.fspath(directory):
        raise validate.invalid("directory", directory, "not a path", "give a folder, e.g. 'job'")
    validate.integer("port", port, minimum=1, maximum=65535, what="a TCP port")
    folder = Path(directory)
    shape_args = {"nodes": nodes, "procs_per_node": procs_per_node, "gpus": gpus, "port": port}
    JobShape(nodes=nodes, procs_per_node=procs_per_node or 1, gpus=gpus)  # checked first
    if isinstance(target, Stepper):
        return _export_session(target.session, folder, _stepper_steps(target, steps), shape_args)
    if isinstance(target, TrainingSession):
        return _export_session(target, folder, steps or max(target.step_index, 1), shape_args)
    if isinstance(target, StrategyComparison):
        return _export_comparison(target, folder, steps, shape_args)
    if isinstance(target, str | os.PathLike):
        path, argv = script_path(target, "target"), script_args(args)
        if procs_per_node is None:
            raise validate.invalid(
                "procs_per_node", None, "a script's ranks per node cannot be inferred",
                "give procs_per_node=N (the ranks the script ran on)",
            )  # fmt: skip
        shape = JobShape(nodes=nodes, procs_per_node=procs_per_node, gpus=gpus)
        return write_export(folder, shape=shape, script=(path, argv), port=port)
    raise validate.invalid(
        "target", type(target).__name__, "not a Stepper, a wb.compare result or a script path",
        "give one of those",
    )  # fmt: skip


def _export_comparison(
    comparison: StrategyComparison, folder: Path, steps: int | None, shape_args: dict[str, Any]
) -> list[Export]:
    """One folder per strategy (no checkpoints: compare saves none); a label that comes
    again (the same layout with other options) gets ``-2``, ``-3``, ..."""
    exports: list[Export] = []
    seen: dict[str, int] = {}
    for spec, world in comparison.specs:
        shape = _shape(_run_world(spec, world), shape_args)
        job = job_for_run(spec, shape.world_size, steps or comparison.steps)
        label = spec.label(world)
        seen[label] = seen.get(label, 0) + 1
        name = label if seen[label] == 1 else f"{label}-{seen[label]}"
        exports.append(write_export(folder / name, shape=shape, job=job, port=shape_args["port"]))
    return exports


def export_job(
    job_file: str | os.PathLike[str],
    directory: str | os.PathLike[str],
    *,
    steps: int | None = None,
    nodes: int = 1,
    procs_per_node: int,
    gpus: bool = False,
    port: int = DEFAULT_PORT,
) -> Export:
    """An exported ``run.json`` again, for another shape (``workbench export --job``)."""
    from workbench.parallel.job import read_job

    job = read_job(job_file)
    if steps is not None:
        validate.integer("steps", steps, minimum=1, maximum=10_000_000, what="a step count")
        job["steps"] = steps
    shape = JobShape(nodes=nodes, procs_per_node=procs_per_node, gpus=gpus)
    if job["kind"] == "user":
        _check_user_layout(job["layout"], shape.world_size)
    key_dir = None
    if job.get("checkpoint"):
        from workbench.parallel.checkpoint.trust import checkpoint_key, state_dir

        checkpoint_key()  # as a save would: the job refuses to start without it
        key_dir = str(state_dir())
    return write_export(directory, shape=shape, job=job, key_dir=key_dir, port=port)


def _check_user_layout(layout: dict[str, Any], world: int) -> None:
    """A user run's layout is written out by dimension: it fits only its own rank count."""
    from workbench.errors import ParallelError
    from workbench.parallel.parallelize import Layout

    kwargs = {**layout, "pp_split": tuple(layout["pp_split"]) if layout.get("pp_split") else None}
    try:
        Layout(**kwargs).dims(world)
    except ParallelError as exc:
        raise ConfigError(
            f"this run.json does not fit nodes x procs_per_node = {world} ranks: {exc}; "
            "export it again from the notebook with nodes= and procs_per_node="
        ) from None
