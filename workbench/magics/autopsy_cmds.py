"""``%wb stacks [--ranks R]``: every rank's Python stack now (cluster/dispatch/autopsy.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.magics.args import MagicParser, parse_ranks
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _stacks_args(p: MagicParser) -> None:
    p.add_argument("--ranks", default=None, help="ranks to show: 'all', '0,2' or '0-3'")


@command("stacks", "every rank's Python stack now, without stopping what it runs", _stacks_args)
def stacks(magics: MagicsState, args: Any) -> None:
    cluster = magics.require_cluster()
    ranks = parse_ranks(args.ranks, cluster.world_size)
    for rank, text in cluster.stacks(ranks).items():
        print(f"[rank {rank}]\n{text}")
