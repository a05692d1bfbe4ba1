"""``%wb run [--ranks R] [--timeout S] [--trace] script.py [args ...]``: a torchrun script
on the ranks; ``--trace`` (or ``%wb trace on``) records its collectives as ``wb.traced`` does."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.cluster.dispatch.scripts import script_path
from workbench.errors import ConfigError
from workbench.magics.args import MagicParser, add_cell_options, parse_ranks
from workbench.magics.debug_cmds import NotebookPrompter
from workbench.magics.live_view import live_view
from workbench.magics.registry import command
from workbench.magics.render import show_results
from workbench.magics.trace_cmds import trace_log

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState


def _run_args(p: MagicParser) -> None:
    add_cell_options(
        p, "send the run through the ipyparallel controller, not straight to the engines"
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="record its collectives for %%wb trace plot / export (as wb.traced)",
    )
    p.add_argument(
        "--record",
        default=None,
        help="with --trace: the steps kept in full detail: default, all, or key=value,... "
        "of wb.trace.schedule (wait=9,active=1,first=5,recent=50); summaries: every step",
    )
    p.add_argument("script", help="the Python script, as for `torchrun script.py`")
    # everything after the script is its own (argparse.REMAINDER keeps its --options)
    p.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")


@command(
    "run",
    "run a script file on the ranks as torchrun would (its init_process_group adopts "
    "the cluster's group)",
    _run_args,
)
def run(magics: MagicsState, args: Any) -> None:
    try:
        path = script_path(args.script, "script")
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    cluster = magics.require_cluster()
    if cluster.group_closed:  # a failed run closed the process group on every rank
        cluster.recover_sync()
    policy = None
    if args.record is not None:
        from workbench.trace.policy import parse_record

        try:
            policy = parse_record(args.record)
        except ConfigError as exc:
            raise UsageError(str(exc)) from None
    ranks = parse_ranks(args.ranks, cluster.world_size)
    show = parse_ranks(args.show, cluster.world_size, "--show")
    cells = getattr(magics, "trace_log", None)  # %wb trace on: a run is traced as a cell is
    traced = args.trace or bool(cells is not None and cells.cells and cells.cluster is cluster)
    if policy is not None and not traced:
        raise UsageError("--record chooses what a traced run keeps: add --trace")
    log = trace_log(magics) if traced else None
    if log is not None and policy is not None:
        log.set_policy(policy)
    view = live_view(cluster.ranks, show)  # each rank's output as it is printed
    try:
        results = cluster.run_script(
            path,
            args.args,
            ranks=ranks,
            timeout=args.timeout,
            direct=not args.via_controller,
            trace=traced,
            on_output=view,
            on_prompt=NotebookPrompter(),  # the script's breakpoint() asks in the notebook
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if view is not None:
        view.finish()
    show_results(results, label_single=not args.no_labels, show=show)
    if log is not None:
        new = log.pull()
        print(f"workbench: {len(new)} trace events; %wb trace plot comm draws them")
