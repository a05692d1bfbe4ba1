"""``%wb doctor [env|net|all]``: the cluster doctor (workbench/cluster/doctor/cluster_doctor.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.cluster.doctor.cluster_doctor import CHECKS
from workbench.errors import ConfigError
from workbench.magics.args import MagicParser, whole_number
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _doctor_args(p: MagicParser) -> None:
    p.add_argument("check", nargs="?", choices=CHECKS, default="all", help="what to check")
    p.add_argument(
        "--iters",
        type=whole_number("--iters", 1, "a number of ping-pongs", maximum=100_000),
        default=None,
        help="ping-pongs per pair for the latency (default 200)",
    )
    p.add_argument(
        "--bandwidth-iters",
        type=whole_number("--bandwidth-iters", 1, "a number of messages", maximum=10_000),
        default=None,
        help="large messages per pair and direction, and all-reduces per size (default 5)",
    )
    p.add_argument(
        "--bytes",
        type=whole_number("--bytes", 4, "a message size in bytes", maximum=2**34),
        default=None,
        help="size of the bandwidth messages (default 8 MiB)",
    )
    p.add_argument(
        "--check-packages",
        default=None,
        help="comma-separated packages whose versions must match (default: the start's)",
    )
    p.add_argument("--no-heatmap", action="store_true", help="leave the pair heatmap out")


@command("doctor", "compare every host's environment and measure every link", _doctor_args)
def doctor(magics: MagicsState, args: Any) -> Any:
    cluster = magics.require_cluster()
    given = {
        "iters": args.iters,
        "bandwidth_iters": args.bandwidth_iters,
        "sweep_iters": args.bandwidth_iters,
        "bandwidth_bytes": args.bytes,
    }
    options = {name: value for name, value in given.items() if value is not None}
    if args.check == "env" and options:
        raise UsageError(
            "--iters, --bandwidth-iters and --bytes measure the network; "
            "use them with `%wb doctor net` or `%wb doctor`"
        )
    try:
        report = cluster.doctor(args.check, check_packages=args.check_packages, **options)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    network = getattr(report, "network", report if args.check == "net" else None)
    if network is not None and not args.no_heatmap:
        from IPython.display import display

        from workbench.plots.network import network_figure

        display(report)
        return network_figure(network)
    return report
