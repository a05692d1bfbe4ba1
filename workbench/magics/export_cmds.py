"""``%wb export [options] DIR [script.py [args ...]]``: the current stepper's run, or a
script, as ``torchrun.sh`` + ``job.sbatch`` (and ``run.json`` for a run) in ``DIR``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.errors import ConfigError
from workbench.magics.args import MagicParser
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _export_args(p: MagicParser) -> None:
    p.add_argument("--steps", type=int, default=None, help="default: the stepper's steps so far")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--procs-per-node", type=int, default=None, help="default: the run's ranks")
    p.add_argument("--gpus", action="store_true", help="one GPU per process")
    p.add_argument("directory", help="the folder to write run.json, torchrun.sh, job.sbatch")
    # options come before DIR: everything after it is the script and its own arguments
    p.add_argument("script", nargs=argparse.REMAINDER, help="script.py and its arguments")


@command(
    "export",
    "write the torchrun command line and an sbatch script for the stepper's run or a script",
    _export_args,
)
def export_cmd(magics: MagicsState, args: Any) -> None:
    from workbench.export import export
    from workbench.ui.stepper import Stepper

    shape = {"nodes": args.nodes, "procs_per_node": args.procs_per_node, "gpus": args.gpus}
    if args.script and args.script[0].startswith("-"):
        raise UsageError(
            f"{args.script[0]} after DIR is not valid; options go before DIR "
            "(%wb export --nodes 2 DIR [script.py args ...])"
        )
    try:
        if not args.script:
            done = export(Stepper.current(), args.directory, steps=args.steps, **shape)
        else:
            if shape["procs_per_node"] is None and magics.cluster is not None:
                shape["procs_per_node"] = magics.cluster.world_size
            script, *rest = args.script
            done = export(script, args.directory, args=rest, **shape)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(done)
