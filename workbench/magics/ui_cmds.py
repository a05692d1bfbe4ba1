"""``%wb dashboard`` — the cluster panel."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workbench.magics.args import MagicParser, seconds_option
from workbench.magics.registry import command
from workbench.validate import MIN_REFRESH_S

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _dashboard_args(p: MagicParser) -> None:
    p.add_argument(
        "--interval",
        type=seconds_option("--interval", minimum=MIN_REFRESH_S),
        default=None,
        help=f"auto-refresh every S seconds while idle (S >= {MIN_REFRESH_S})",
    )


@command("dashboard", "panel of ranks, hosts, devices, state and memory", _dashboard_args)
def dashboard(magics: MagicsState, args: Any) -> Any:
    from workbench.ui.dashboard import Dashboard

    return Dashboard(magics.require_cluster(), interval=args.interval)
