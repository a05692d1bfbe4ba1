"""``%wb attach | list``: kept clusters (``%wb start --keep``), taken up from a new kernel."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.cluster.keep import KeptClusters
from workbench.cluster.state import LIVE, ClusterState
from workbench.errors import ConfigError
from workbench.magics.registry import command
from workbench.magics.tables import start_banner

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState

LIST_COLUMNS = ("name", "ranks", "hosts", "launcher", "age", "lease left", "attached")


def _attach_args(p: Any) -> None:
    p.add_argument("name", nargs="?", default=None, help="which kept cluster (`%%wb list`)")


@command(
    "attach",
    "take up a kept cluster (`%wb start --keep`) from this kernel: ranks, engines' variables",
    _attach_args,
)
def attach(magics: MagicsState, args: Any) -> None:
    mine = magics.running_started_here()
    if mine is not None and mine.state in LIVE and mine.kept != args.name:
        raise UsageError(
            f"a cluster is already running here ({mine!r}); `%wb stop` it first "
            "(a kept one: `wb.Cluster.current().detach_sync()` keeps it)"
        )
    started = time.perf_counter()
    try:
        cluster = Cluster.attach(args.name)
    except ConfigError as exc:  # an unknown or malformed name
        raise UsageError(str(exc)) from None
    seconds = time.perf_counter() - started
    magics.remember(cluster)  # now the current cluster, as after `%wb start`
    print(start_banner(cluster.ranks))
    lost = cluster.lost_ranks() if cluster.state == ClusterState.DEGRADED else []
    print(
        f"workbench: attached to kept cluster {cluster.kept!r} in {seconds:.2f} s"
        + (f"; ranks {lost} were lost meanwhile: `%wb restart`" if lost else "")
    )


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 2 * 3600:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def list_table(rows: list[dict[str, Any]]) -> str:
    """One line per kept cluster under a header."""
    cells = [
        [
            str(r["name"]),
            str(r["ranks"]),
            str(r["hosts"]),
            str(r["launcher"]),
            _duration(r["age_s"]),
            _duration(r["lease_left_s"]),
            str(r["attached"]),
        ]
        for r in rows
    ]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(LIST_COLUMNS)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(LIST_COLUMNS, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _list_args(p: Any) -> None:
    p.add_argument("--json", action="store_true", help="return the rows instead of a table")


@command("list", "the kept clusters: name, ranks, hosts, age, lease, attached", _list_args)
def list_kept(magics: MagicsState, args: Any) -> Any:
    scan = KeptClusters().scan()
    if scan.removed:
        print(scan.notice())
    rows = [k.row() for k in scan.live]
    if args.json:
        return rows
    print(list_table(rows) if rows else "workbench: no kept cluster runs (`%wb start --keep`)")
    return None
