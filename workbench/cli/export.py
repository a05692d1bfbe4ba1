"""``workbench export DIR``: a script, or a run exported before, as torchrun + sbatch files.

From a notebook, ``%wb export DIR`` (or ``workbench.export``) exports the stepper's run;
here there is no notebook, so the run comes as the ``run.json`` that export wrote
(``--job``, e.g. to target more nodes) or as a script (``--script``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.cli.numbers import count

__all__ = ["register", "run"]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "export",
        help="write the torchrun command and an sbatch script for a script or a run.json",
        description="Write torchrun.sh (one node) and job.sbatch (Slurm, MASTER_ADDR from "
        "the allocation's first node) into DIR, for a script or an exported run.json.",
    )
    p.add_argument("directory", help="the folder to write into")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--script", help="a torchrun script; its arguments follow `--`")
    what.add_argument("--job", help="a run.json written by %%wb export / workbench.export")
    p.add_argument("--nodes", type=count(1, 4096), default=1)
    p.add_argument("--procs-per-node", type=count(1, 1024), default=2)
    p.add_argument("--gpus", action="store_true", help="one GPU per process")
    p.add_argument("--steps", type=count(1, 10_000_000), help="--job only: the run's length")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="-- then the script's arguments")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from workbench.export import export, export_job

    shape = {"nodes": args.nodes, "procs_per_node": args.procs_per_node, "gpus": args.gpus}
    extra = list(args.script_args)
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if args.job is not None and extra:
        print(
            f"workbench export: error: --job takes no script arguments, got {extra}",
            file=sys.stderr,
        )
        return 2
    if args.script is not None and args.steps is not None:
        print(
            "workbench export: error: --steps is for --job; a script's length is its own",
            file=sys.stderr,
        )
        return 2
    if args.job is not None:
        done = export_job(args.job, args.directory, steps=args.steps, **shape)
    else:
        done = export(args.script, args.directory, args=extra, **shape)
    print(done)
    return 0
