"""``%wb export DIR``: the current stepper's run (or ``--script``) as torchrun + sbatch files."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.errors import ConfigError
from workbench.magics.args import MagicParser
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.core import WorkbenchMagics


def _export_args(p: MagicParser) -> None:
    p.add_argument("directory", help="the folder to write run.json, torchrun.sh, job.sbatch")
    p.add_argument("--steps", type=int, default=None, help="default: the stepper's steps so far")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--procs-per-node", type=int, default=None, help="default: the run's ranks")
    p.add_argument("--gpus", action="store_true", help="one GPU per process")
    p.add_argument("--script", default=None, help="export this script instead of the stepper")
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


@command(
    "export",
    "write the torchrun command line and an sbatch script for the stepper's run or a script",
    _export_args,
)
def export_cmd(magics: WorkbenchMagics, args: Any) -> None:
    from workbench.export import export
    from workbench.ui.stepper import Stepper

    shape = {"nodes": args.nodes, "procs_per_node": args.procs_per_node, "gpus": args.gpus}
    try:
        if args.script is None:
            if args.args:
                raise ConfigError(f"{args.args} given without --script; a run takes none")
            done = export(Stepper.current(), args.directory, steps=args.steps, **shape)
        else:
            if shape["procs_per_node"] is None and magics.cluster is not None:
                shape["procs_per_node"] = magics.cluster.world_size
            done = export(args.script, args.directory, args=args.args, **shape)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    print(done)
