"""``%wb start | stop | status | restart``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.cluster import Cluster
from workbench.cluster.keep import DEFAULT_LEASE_S, foreign_setting, keep_settings
from workbench.cluster.lifecycle.connection import find_connection_file
from workbench.cluster.loop import submit, wait
from workbench.cluster.state import LIVE, ClusterState
from workbench.config import (
    BACKENDS,
    LAUNCHERS,
    MAX_ENGINES,
    parse_hosts,
)
from workbench.errors import ConfigError
from workbench.magics.args import MagicParser, seconds_option, whole_number
from workbench.magics.launcher_args import add_launcher_args, launcher_options_from
from workbench.magics.progress import notebook_progress
from workbench.magics.registry import command
from workbench.magics.tables import start_banner, status_table
from workbench.session.current import current_session

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _start_args(p: MagicParser) -> None:
    p.add_argument(
        "-n",
        type=whole_number("-n", 1, "a number of engines", maximum=MAX_ENGINES),
        default=2,
        help="number of engines (ranks)",
    )
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="process-group backend")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local", help="engine launcher")
    p.add_argument(
        "--hosts", default="", help="comma-separated hosts for --launcher ssh / mpi / slurm"
    )
    p.add_argument(
        "--spare-hosts",
        default="",
        help="comma-separated hosts for a lost host's ranks (ssh, slurm; slurm: 'any')",
    )
    p.add_argument("--profile", default=None, help="connect to a running ipyparallel profile")
    p.add_argument("--cluster-id", default=None, help="connect to a running cluster id")
    p.add_argument(
        "--timeout",
        type=seconds_option("--timeout"),
        default=60.0,
        help="process-group init timeout (s)",
    )
    p.add_argument(
        "--threads",
        type=whole_number("--threads", 1, "a number of threads"),
        default=None,
        help="torch threads per engine (default: the host's cores shared by its engines)",
    )
    p.add_argument(
        "--profile-startup",
        action="store_true",
        help="after the start, print where its time went (kernel stages, each engine)",
    )
    p.add_argument(
        "--check-packages",
        default="",
        help="comma-separated packages whose versions must match on every host",
    )
    add_launcher_args(p)
    p.add_argument(
        "--keep",
        action="store_true",
        help="the cluster outlives this kernel (restart, exit, kill); `%%wb attach` takes it up",
    )
    p.add_argument(
        "--lease",
        type=seconds_option("--lease"),
        default=None,
        help=f"--keep: end it this many s after no kernel holds it ({DEFAULT_LEASE_S:.0f})",
    )
    p.add_argument("--name", default=None, help="--keep: its name for `%%wb attach NAME`")


@command("start", "start engines and join them into a process group", _start_args)
def start(magics: MagicsState, args: Any) -> None:
    mine = magics.running_started_here()
    if mine is not None and mine.state in LIVE:
        raise UsageError(
            f"a cluster is already running ({mine!r}); `%wb stop` or `%wb restart` first"
        )
    if mine is not None and mine.state == ClusterState.BROKEN:
        mine.stop_sync()  # its engines and schedulers outlived the controller
    cluster = make_cluster(args)
    if magics.load_import_s is not None:
        cluster.startup.notes["%load_ext workbench: imports"] = magics.load_import_s
    # The start begins at once on the workbench loop; the bar (its ipywidgets import is
    # 0.3-0.5 s) is built meanwhile and shows the stages from the next one on.
    pending = submit(cluster.start())
    close: Callable[[], None] | None = None
    try:
        made = time.perf_counter()
        callback, close = notebook_progress(args.n)
        cluster.startup.notes["progress bar (beside the start)"] = time.perf_counter() - made
        cluster.progress = callback
        wait(pending)
    finally:
        pending.cancel()  # an interrupt while the bar was built: the start stops too
        if close is not None:
            close()
        cluster.progress = None
    magics.remember(cluster)  # and it is now the current cluster (Cluster.latest)
    print(start_banner(cluster.ranks))
    if cluster.kept is not None:
        print(
            f"workbench: kept as {cluster.kept!r}: it outlives this kernel; "
            f"`%wb attach {cluster.kept}` from a new one, `%wb stop` ends it"
        )
    if args.profile_startup:
        print(cluster.startup.table())


def make_cluster(args: Any) -> Cluster:
    """The ``Cluster`` that ``%wb start`` asks for, or a ``UsageError``; nothing starts.

    The checks that need the options together come first, in the magic's own words
    (``--hosts``, not ``hosts=``); ``Cluster`` checks everything again for Python callers.
    """
    try:
        hosts = parse_hosts("--hosts", args.hosts)
        if args.launcher == "ssh" and not hosts:
            raise UsageError("--launcher ssh needs --hosts, e.g. --hosts node-a,node-b")
        if args.launcher == "local" and hosts:
            raise UsageError(
                f"--hosts {args.hosts!r} is not valid: --launcher local does not "
                "place engines on named hosts; use --launcher ssh, mpi or slurm with --hosts, "
                "or leave --hosts out"
            )
        if not args.keep and (args.lease is not None or args.name is not None):
            given = "--lease" if args.lease is not None else "--name"
            raise UsageError(f"{given} is for a kept cluster: add --keep, or leave {given} out")
        foreign = foreign_setting(args.profile, args.cluster_id, ("--profile", "--cluster-id"))
        lease = DEFAULT_LEASE_S if args.lease is None else args.lease
        names = ("--keep", "--lease", "--name")
        keep_settings(args.keep, lease, args.name, foreign=foreign, names=names)
        if args.profile is not None or args.cluster_id is not None:
            find_connection_file(args.profile, args.cluster_id, names=("--profile", "--cluster-id"))
        return Cluster(
            n=args.n,
            backend=args.backend,
            launcher=args.launcher,
            hosts=hosts,
            profile=args.profile,
            cluster_id=args.cluster_id,
            init_timeout=args.timeout,
            threads_per_engine=args.threads,
            launcher_options=launcher_options_from(args),
            check_packages=args.check_packages,
            spare_hosts=parse_hosts("--spare-hosts", args.spare_hosts),
            keep=args.keep,
            lease=lease,
            name=args.name,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


@command("stop", "stop the engines and the controller", lambda p: None)
def stop(magics: MagicsState, args: Any) -> None:
    cluster = magics.cluster
    if cluster is None:
        print("workbench: no cluster to stop")
        return
    cluster.stop_sync()  # the cluster started before it, if one still runs, is current again
    print("workbench: cluster stopped")


def _restart_args(p: MagicParser) -> None:
    p.add_argument(
        "--full", action="store_true", help="stop and start everything, even when degraded"
    )
    p.add_argument(
        "--shrink",
        action="store_true",
        help="go on without the dead engines: fewer ranks, the same global batch",
    )


@command(
    "restart",
    "after a dead or stuck engine: replace it and resume from the last checkpoint; "
    "otherwise stop and start again",
    _restart_args,
)
def restart(magics: MagicsState, args: Any) -> None:
    cluster = magics.cluster
    if cluster is None:
        raise UsageError("no cluster to restart; start one with `%wb start -n 2`")
    # A dead controller (state "broken") leaves nothing to recover: rebuild everything.
    if (
        args.full
        or cluster.state == ClusterState.BROKEN
        or (cluster.state != ClusterState.DEGRADED and not cluster.stuck_ranks)
    ):
        cluster.restart_sync()
        print(f"workbench: restarted, {cluster.world_size} ranks ready")
        return
    session = _session_on(cluster)
    if session is not None and session.built:
        print(f"workbench: {session.recover(shrink=True if args.shrink else None)}")
    else:
        print(f"workbench: {cluster.recover_sync(shrink=args.shrink)}")
    print(f"workbench: {cluster.world_size} ranks ready")


def _grow_args(p: MagicParser) -> None:
    p.add_argument("n", type=int, nargs="?", default=1, help="how many ranks to add (1)")
    p.add_argument("--hosts", default=None, help="start them on these hosts (a,b; ssh, slurm)")


@command(
    "grow",
    "add N ranks (after a shrink: back to the old size) at a checkpoint boundary",
    _grow_args,
)
def grow(magics: MagicsState, args: Any) -> None:
    cluster = magics.require_cluster()
    if args.hosts is not None:  # a bad --hosts is a usage error, said before anything starts
        from workbench.cluster.hosts.host_placement import check_hosts

        try:
            check_hosts("--hosts", args.hosts, cluster.config.launcher)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    session = _session_on(cluster)
    if session is not None and session.built:
        print(f"workbench: {session.grow(args.n, hosts=args.hosts)}")
    else:
        print(f"workbench: {cluster.grow_sync(args.n, hosts=args.hosts)}")
    print(f"workbench: {cluster.world_size} ranks ready")


def _session_on(cluster: Cluster) -> Any:
    """The current stepper's training session when it runs on ``cluster`` (the registry in
    ``session/current.py``: asking it imports neither the stepper nor torch, which took
    1.5-5 s on a 2-core machine, most of a `%wb restart` after the first fault in a fresh
    kernel: issue 31, benchmarks/first_fault_profile.py)."""
    session = current_session()
    return session if session is not None and session.cluster is cluster else None


def _status_args(p: MagicParser) -> None:
    p.add_argument("--json", action="store_true", help="return the rows instead of a table")


@command("status", "table of ranks: engine, host, pid, device, backend, state", _status_args)
def status(magics: MagicsState, args: Any) -> Any:
    rows = magics.require_cluster().status()
    if args.json:
        return rows
    print(status_table(rows))
    return None
