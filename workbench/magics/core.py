"""The ``%wb`` line magic and ``%%wb`` cell magic: thin adapters over ``workbench.Cluster``.

Subcommands are small functions in the ``*_cmds`` modules, registered in
``registry.COMMANDS``; bad arguments raise ``UsageError``.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class

from workbench.cluster import Cluster
from workbench.cluster.state import CURRENT, ClusterState
from workbench.magics.args import (
    HelpShown,
    MagicParser,
    add_cell_options,
    parse_ranks,
    split_line,
)

# Importing a command module registers its subcommands; this order is `%wb --help`'s order.
from workbench.magics import cluster_cmds, step_cmds, ui_cmds  # noqa: F401  # isort: skip
from workbench.magics import export_cmds  # noqa: F401  # isort: skip
from workbench.magics import checkpoint_cmds  # noqa: F401  # isort: skip
from workbench.magics import script_cmds  # noqa: F401  # isort: skip
from workbench.magics import doctor_cmds  # noqa: F401  # isort: skip
from workbench.magics import keep_cmds  # noqa: F401  # isort: skip
from workbench.magics import debug_cmds  # isort: skip
from workbench.magics import autopsy_cmds  # noqa: F401  # isort: skip
from workbench.magics.live_view import live_view
from workbench.magics.registry import COMMANDS, usage
from workbench.magics.render import show_results

if TYPE_CHECKING:
    from workbench.session.traced_log import TraceLog

__all__ = ["COMMANDS", "WorkbenchMagics"]


@functools.cache
def _cell_parser() -> MagicParser:
    """Built once: %%wb parses its line on every cell, and building argparse is the cost."""
    p = MagicParser(prog="%%wb", description="Run this cell on every rank (or some ranks).")
    add_cell_options(
        p,
        "send the cell through the ipyparallel controller, not straight to the engines "
        "(for widgets created on the engines)",
    )
    return p


@magics_class
class WorkbenchMagics(Magics):
    """Holds the notebook's current cluster; everything else lives in the library."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        # What `%wb start` started, held so that it lives as long as the kernel: which
        # cluster is *current* is Cluster.latest()'s answer, the same for every caller.
        self.started: list[Cluster] = []
        self.trace_log: TraceLog | None = None  # once %wb trace is used
        self.load_import_s: float | None = None  # what `%load_ext workbench` spent importing

    @property
    def cluster(self) -> Cluster | None:
        """The current cluster (``Cluster.latest()``): started here or from Python."""
        return Cluster.latest()

    def remember(self, cluster: Cluster) -> None:
        """`%wb start` / `%wb attach` made ``cluster`` here: held as long as the kernel."""
        if cluster not in self.started:
            self.started.append(cluster)

    def stop_started(self) -> None:
        """Stop what `%wb start` started here (the extension is unloaded)."""
        for cluster in self.started:
            if cluster.state != ClusterState.STOPPED:
                cluster.stop_sync()
        self.started = []

    def running_started_here(self) -> Cluster | None:
        """A cluster `%wb start` started that still runs (or whose controller died)."""
        self.started = [c for c in self.started if c.state != ClusterState.STOPPED]
        return self.started[-1] if self.started else None

    def current_trace_log(self) -> TraceLog:
        """The notebook's ``TraceLog`` for the running cluster (made on first use, and anew
        for a new cluster); `%wb trace` and `%wb run --trace` share it."""
        from workbench.session.traced_log import TraceLog

        cluster = self.require_cluster()
        if self.trace_log is None or self.trace_log.cluster is not cluster:
            self.trace_log = TraceLog(cluster)
        return self.trace_log

    def require_cluster(self) -> Cluster:
        # A "broken" cluster (dead controller) is returned: its calls say what happened.
        if self.cluster is None or self.cluster.state not in CURRENT:
            raise UsageError("no cluster is running; start one first with `%wb start -n 2`")
        return self.cluster

    @line_magic
    def wb(self, line: str) -> Any:
        argv = split_line(line)
        if not argv or argv[0] in ("-h", "--help", "help"):
            print(usage())
            return None
        name, rest = argv[0], argv[1:]
        cmd = COMMANDS.get(name)
        if cmd is None:
            raise UsageError(
                f"unknown command {name!r}; valid commands: {', '.join(COMMANDS)} "
                "(see `%wb --help`)"
            )
        parser = MagicParser(prog=f"%wb {name}", description=cmd.help)
        cmd.parser(parser)
        try:
            args = parser.parse(rest)
        except HelpShown:
            return None
        return cmd.run(self, args)

    @cell_magic("wb")
    def wb_cell(self, line: str, cell: str) -> None:
        try:
            args = _cell_parser().parse(split_line(line))
        except HelpShown:
            return
        cluster = self.require_cluster()
        if cluster.group_closed:  # a failed run closed the process group on every rank
            cluster.recover_sync()  # (that failure was reported when it happened)
        ranks = parse_ranks(args.ranks, cluster.world_size)
        show = parse_ranks(args.show, cluster.world_size, "--show")
        view = live_view(cluster.ranks, show)  # each rank's output as it is printed
        run = functools.partial(
            cluster.execute,
            cell,
            ranks=ranks,
            timeout=args.timeout,
            direct=not args.via_controller,
            on_output=view,
            on_prompt=debug_cmds.NotebookPrompter(),  # breakpoint() asks in the notebook
        )
        log = getattr(self, "trace_log", None)  # %wb trace on: the cell is one traced span
        if log is not None and log.cells and log.cluster is cluster:
            log.begin_cell("cell")
            try:
                results = run()
            finally:
                log.end_cell()
        else:
            results = run()
        if view is not None:
            view.finish()
        show_results(results, label_single=not args.no_labels, show=show)
