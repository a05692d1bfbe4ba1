"""Run a strategy from a plain script or under torchrun, no notebook needed.

    python -m workbench.parallel --strategy single --steps 5
    torchrun --nproc-per-node 2 -m workbench.parallel --strategy fsdp --steps 5 --check

``--check`` compares losses and gathered parameters with the single-device run on the same
global batches and exits 1 if they differ by more than ``--tol``.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields

import torch
import torch.distributed as dist

from workbench.errors import ConfigError
from workbench.parallel.build import build_train_step, full_state_dict, reference_losses_and_params
from workbench.parallel.run_spec import RunSpec

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workbench.parallel", description=__doc__)
    for f in fields(RunSpec):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            parser.add_argument(flag, choices=("on", "off"), default=None)
        elif f.name == "lr":
            parser.add_argument(flag, type=float, default=None)
        else:
            kind = int if f.type in ("int", int) else str
            parser.add_argument(flag, type=kind, default=None)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--check", action="store_true", help="compare with one device")
    parser.add_argument("--tol", type=float, default=1e-5)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    kwargs = {}
    for f in fields(RunSpec):
        value = getattr(args, f.name)
        if value is not None:
            kwargs[f.name] = value == "on" if f.type in ("bool", bool) else value
    kwargs.setdefault("trace", False)
    started = False
    try:
        spec = RunSpec(**kwargs)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
            dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
            started = True
        rank = dist.get_rank() if dist.is_initialized() else 0
        step = build_train_step(spec)
        losses = [step.run_step() for _ in range(args.steps)]
        params = full_state_dict(step)
        step.close()
        if rank != 0:
            return 0
        for i, loss in enumerate(losses):
            print(f"step {i} loss {loss:.6f}")
        if not args.check or params is None:
            return 0
        ref_losses, ref_params = reference_losses_and_params(spec, args.steps)
        loss_diff = max((abs(a - b) for a, b in zip(losses, ref_losses, strict=True)), default=0.0)
        param_diff = max(float((params[n] - ref_params[n]).abs().max()) for n in ref_params)
        ok = loss_diff <= args.tol and param_diff <= args.tol and params.keys() == ref_params.keys()
        print(f"max |loss diff| {loss_diff:.3e}  max |param diff| {param_diff:.3e}  ok={ok}")
        return 0 if ok else 1
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if started:
            dist.destroy_process_group()


if __name__ == "__main__":
    from workbench.parallel.process_exit import exit_process

    exit_process(main())  # not sys.exit: a gloo group outlives destroy (process_exit.py)
