"""A run exported from the notebook, rebuilt without one: the entry point of the batch job.

    torchrun --nproc-per-node 2 -m workbench.parallel.job run.json --steps 5

``run.json`` is what ``workbench.export`` writes (``JOB_FORMAT``): a built-in run's
``RunSpec`` fields, or a run of the user's own model with each factory named by import
path (``package.module:attr``) — code travels by name, never pickled, so the job imports
exactly what the user's environment has. The layout and options are the notebook's; the
run draws from the same seed, so rank 0 prints the notebook's losses. With a checkpoint
section the job saves every ``every`` steps into that directory, signed with the per-user
key of ``checkpoint.trust`` (``$WORKBENCH_STATE_DIR/checkpoint.key``), as the stepper does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from workbench.errors import ConfigError, WorkbenchError
from workbench.lazy import import_attr
from workbench.parallel.parallelize import Layout
from workbench.parallel.step import TrainStep

__all__ = ["JOB_FORMAT", "build_job_step", "import_by_name", "main", "read_job"]

JOB_FORMAT = "workbench-job/1"
_MAX_JOB_BYTES = 1024 * 1024  # a job file is a few hundred bytes


def read_job(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The job file at ``path``, checked: JSON only (nothing in it is executed or unpickled)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"job file {str(file)!r} does not exist; write one with %wb export DIR")
    if file.stat().st_size > _MAX_JOB_BYTES:
        raise ConfigError(f"job file {str(file)!r} is larger than {_MAX_JOB_BYTES} bytes")
    try:
        job = json.loads(file.read_text())
    except ValueError as exc:
        raise ConfigError(f"job file {str(file)!r} is not JSON: {exc}") from None
    if not isinstance(job, dict) or job.get("format") != JOB_FORMAT:
        found = job.get("format") if isinstance(job, dict) else type(job).__name__
        raise ConfigError(
            f"job file {str(file)!r} has format {found!r}; expected {JOB_FORMAT!r} "
            "(written by %wb export / workbench.export)"
        )
    if job.get("kind") not in ("preset", "user"):
        raise ConfigError(f"job kind={job.get('kind')!r} is not valid; choose 'preset' or 'user'")
    where = f"job file {str(file)!r}"
    _check_steps_and_checkpoint(job, where)
    if job["kind"] == "preset":
        _check_preset(job, where)
    else:
        _check_user(job, where)
    return job


# A job file may come from anywhere (``export --job``, a copy on a cluster): every field
# the job reads is checked here, so a malformed one is one line naming it, before any
# file is written or any process joins a group.
_ROLES = ("model", "data", "loss", "optimizer")


def _bad(where: str, field: str, value: Any, expected: str) -> ConfigError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return ConfigError(f"{where}: {field}={shown} is not valid; it must be {expected}")


def _whole(value: Any, least: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def _check_steps_and_checkpoint(job: dict[str, Any], where: str) -> None:
    if "steps" in job and not _whole(job["steps"], 1):
        raise _bad(where, "steps", job.get("steps"), "an integer >= 1")
    section = job.get("checkpoint")
    if section is None:
        return
    if not isinstance(section, dict):
        raise _bad(where, "checkpoint", section, "an object with dir, every, keep_last, or null")
    if not isinstance(section.get("dir"), str) or not section["dir"]:
        raise _bad(where, "checkpoint.dir", section.get("dir"), "a folder path")
    if not _whole(section.get("every"), 1):
        raise _bad(where, "checkpoint.every", section.get("every"), "an integer >= 1")
    keep = section.get("keep_last")
    if keep is not None and not _whole(keep, 1):
        raise _bad(where, "checkpoint.keep_last", keep, "an integer >= 1 or null")


def _check_preset(job: dict[str, Any], where: str) -> None:
    from dataclasses import fields

    from workbench.parallel.run_spec import RunSpec

    spec = job.get("spec")
    if not isinstance(spec, dict):
        raise _bad(where, "spec", spec, "an object of RunSpec fields")
    known = [f.name for f in fields(RunSpec)]
    unknown = sorted(set(spec) - set(known))
    if unknown:
        raise _bad(where, "spec field", unknown[0], f"one of {known}")
    try:
        RunSpec(**spec)
    except WorkbenchError as exc:
        raise ConfigError(f"{where}: spec: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: spec is not valid: {exc}") from None


def _check_user(job: dict[str, Any], where: str) -> None:
    from dataclasses import fields

    from workbench.parallel.user_model import UserRun

    factories = job.get("factories")
    if not isinstance(factories, dict):
        raise _bad(where, "factories", factories, f"an object of {list(_ROLES)} -> 'module:attr'")
    for role, name in factories.items():
        if role not in _ROLES:
            raise _bad(where, "factories role", role, f"one of {list(_ROLES)}")
        if name is None and role != "model":
            continue
        module, sep, attr = name.partition(":") if isinstance(name, str) else ("", "", "")
        if not (sep and module and attr):
            raise _bad(where, f"factories.{role}", name, "an import path 'package.module:attr'")
    if "model" not in factories:
        raise _bad(where, "factories.model", None, "an import path 'package.module:attr'")
    layout = job.get("layout")
    if not isinstance(layout, dict):
        raise _bad(where, "layout", layout, "an object of Layout fields (dp, tp, pp, ...)")
    known = [f.name for f in fields(Layout)]
    if set(layout) - set(known):
        raise _bad(where, "layout field", sorted(set(layout) - set(known))[0], f"one of {known}")
    try:
        Layout(**{**layout, "pp_split": layout.get("pp_split")})
    except WorkbenchError as exc:
        raise ConfigError(f"{where}: layout: {exc}") from None
    if not isinstance(job.get("strategy"), str):
        raise _bad(where, "strategy", job.get("strategy"), "a string")
    options = job.get("options")
    taken = {*_ROLES, "layout", "strategy"}
    allowed = sorted(f.name for f in fields(UserRun) if f.name not in taken)
    if not isinstance(options, dict):
        raise _bad(where, "options", options, f"an object of {allowed}")
    if set(options) - set(allowed):
        raise _bad(where, "option", sorted(set(options) - set(allowed))[0], f"one of {allowed}")


def import_by_name(role: str, name: str) -> Any:
    """``package.module:attr`` imported: how a job finds the user's factories."""
    module_name, sep, attr = name.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(
            f"{role}={name!r} is not valid in a job file; give an import path 'package.module:attr'"
        )
    try:
        return import_attr(module_name, attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(
            f"the {role} {name!r} could not be imported: {exc}; run the job where that "
            "module is importable (its folder on PYTHONPATH)"
        ) from None


def build_job_step(job: dict[str, Any]) -> TrainStep:
    """This rank's ``TrainStep`` for ``job``, untraced (a batch job records no events)."""
    if job["kind"] == "preset":
        from workbench.parallel.build import build_train_step
        from workbench.parallel.run_spec import RunSpec

        return build_train_step(RunSpec(**{**job["spec"], "trace": False}))
    from workbench.parallel.user_model import UserRun, build_user_train_step

    parts = {  # every role the file names (model, data, loss, optimizer)
        role: import_by_name(role, name) if name else None
        for role, name in job["factories"].items()
    }
    layout = dict(job["layout"])
    if layout.get("pp_split") is not None:
        layout["pp_split"] = tuple(layout["pp_split"])
    run = UserRun(
        **parts,
        layout=Layout(**layout),
        strategy=job["strategy"],
        **{**job["options"], "trace": False},
    )
    return build_user_train_step(run)


def _join_group() -> bool:
    """Join torchrun's group when there is one; True when this call started it."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl")
    else:
        dist.init_process_group("gloo")
    return True


def _checkpoint_every(job: dict[str, Any]) -> tuple[str | None, int, int | None]:
    section = job.get("checkpoint") or {}
    return section.get("dir"), int(section.get("every") or 0), section.get("keep_last")


def run_job(job: dict[str, Any], steps: int) -> list[float]:
    """``steps`` steps of ``job`` on this rank; checkpoints as the job file says."""
    from workbench.parallel.checkpoint import save_checkpoint

    strategy = job["spec"]["strategy"] if job["kind"] == "preset" else job["strategy"]
    if strategy == "single" and dist.is_initialized() and dist.get_rank() != 0:
        return []  # one device: rank 0's, as on the cluster
    root, every, keep_last = _checkpoint_every(job)
    step = build_job_step(job)
    losses: list[float] = []
    try:
        for _ in range(steps):
            losses.append(step.run_step())
            if root is not None and every and step.step % every == 0:
                save_checkpoint(step, root, keep_last=keep_last)
    finally:
        step.close()
    return losses


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench.parallel.job", description=__doc__)
    parser.add_argument("job", help="the run.json written by %%wb export")
    parser.add_argument("--steps", type=int, default=None, help="default: the job file's")
    parser.add_argument("--losses", default=None, help="rank 0 writes the losses here (JSON)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    started = False
    try:
        job = read_job(args.job)
        steps = args.steps if args.steps is not None else int(job.get("steps", 1))
        if steps < 1:
            raise ConfigError(f"--steps {steps} is not valid; it must be an integer >= 1")
        started = _join_group()
        losses = run_job(job, steps)
        if (dist.get_rank() if dist.is_initialized() else 0) == 0:
            for i, loss in enumerate(losses):
                print(f"step {i} loss {loss!r}", flush=True)
            if args.losses:
                Path(args.losses).write_text(json.dumps(losses))
        return 0
    except WorkbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if started:
            dist.destroy_process_group()


if __name__ == "__main__":
    from workbench.parallel.process_exit import exit_process

    exit_process(main())  # not sys.exit: a gloo group outlives destroy (process_exit.py)
