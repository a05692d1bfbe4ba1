"""``%wb dashboard`` — the cluster panel."""

from __future__ import annotations

from typing import Any

from workbench.magics.args import MagicParser
from workbench.magics.core import WorkbenchMagics, command


def _dashboard_args(p: MagicParser) -> None:
    p.add_argument(
        "--interval", type=float, default=None, help="auto-refresh every S seconds while idle"
    )


@command("dashboard", "panel of ranks, hosts, devices, state and memory", _dashboard_args)
def dashboard(magics: WorkbenchMagics, args: Any) -> Any:
    from IPython.core.error import UsageError

    from workbench.ui.dashboard import Dashboard

    if args.interval is not None and args.interval <= 0:
        raise UsageError(f"--interval {args.interval} must be a positive number of seconds")
    return Dashboard(magics.require_cluster(), interval=args.interval)
