"""``workbench export [options] DIR (script.py [args ...] | --job run.json)``.

From a notebook, ``%wb export DIR`` (or ``workbench.export``) exports the stepper's run;
here there is no notebook, so the run comes as the ``run.json`` that export wrote
(``--job``, e.g. to target more nodes) or as a script with its arguments after ``DIR``.
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
    p.add_argument("--job", help="a run.json written by %%wb export / workbench.export")
    p.add_argument("--nodes", type=count(1, 4096), default=1)
    p.add_argument("--procs-per-node", type=count(1, 1024), default=2)
    p.add_argument("--gpus", action="store_true", help="one GPU per process")
    p.add_argument("--steps", type=count(1, 10_000_000), help="--job only: the run's length")
    p.add_argument("directory", help="the folder to write into")
    # options come before DIR: everything after it is the script and its own arguments
    p.add_argument("script", nargs=argparse.REMAINDER, help="script.py and its arguments")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from workbench.export import export, export_job

    shape = {"nodes": args.nodes, "procs_per_node": args.procs_per_node, "gpus": args.gpus}
    problem = None
    if (args.job is None) == (not args.script):
        problem = "give a script after DIR or --job run.json (one of them)"
    elif args.script and args.script[0].startswith("-"):
        problem = f"{args.script[0]} after DIR is not valid; options go before DIR"
    elif args.script and args.steps is not None:
        problem = "--steps is for --job; a script's length is its own"
    if problem is not None:
        print(f"workbench export: error: {problem}", file=sys.stderr)
        return 2
    if args.job is not None:
        done = export_job(args.job, args.directory, steps=args.steps, **shape)
    else:
        script, *rest = args.script
        done = export(script, args.directory, args=rest, **shape)
    print(done)
    return 0
