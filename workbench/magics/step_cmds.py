"""``%wb step | plot | trace`` — drive and show the current ``Stepper``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.cluster.state import LIVE
from workbench.errors import ConfigError
from workbench.magics.args import MagicParser, whole_number
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState

PLOTS = ("memory", "comm", "loss")


def current_stepper(*, running: bool = False) -> Any:
    """The current stepper, or a ``UsageError`` saying how to make one; with ``running``
    its cluster must be up (the engines hold the run), said in magic terms."""
    from workbench.ui.stepper import Stepper

    try:
        stepper = Stepper.current()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    state = stepper.cluster.state
    if running and state not in LIVE:
        raise UsageError(
            f"the current stepper's cluster is {state}; start a cluster with `%wb start -n 2`, "
            "then create a new stepper (`stepper = workbench.Stepper(...)`)"
        )
    return stepper


def _step_args(p: MagicParser) -> None:
    p.add_argument("--phase", action="store_true", help="advance by phases, not whole steps")
    p.add_argument(
        "-n",
        type=whole_number("-n", 1, "a number of steps"),
        default=1,
        help="how many steps (or phases)",
    )


@command("step", "advance the current stepper by steps or phases", _step_args)
def step(magics: MagicsState, args: Any) -> None:
    stepper = current_stepper(running=True)
    recovery = getattr(stepper.session, "last_recovery", None)
    if args.phase:
        stepper.phase(args.n)
    else:
        stepper.step(args.n)
    rebuilt = getattr(stepper.session, "last_recovery", None)
    if rebuilt is not recovery:  # rebuilt after a cluster restart
        print(f"workbench: {rebuilt}")
    for s in stepper.status:
        loss = "-" if s.loss is None else f"{s.loss:.6f}"
        print(f"[rank {s.rank}] step {s.step}, next phase {s.next_phase}, loss {loss}")


def _plot_args(p: MagicParser) -> None:
    p.add_argument("what", choices=PLOTS, help="which figure")


@command("plot", "show the current stepper's memory, comm or loss figure", _plot_args)
def plot(magics: MagicsState, args: Any) -> Any:
    return current_stepper().figures()[args.what]


def _trace_args(p: MagicParser) -> None:
    from workbench.magics.trace_cmds import TRACE_ACTIONS

    p.add_argument("action", choices=TRACE_ACTIONS, help="what to do with the trace")
    p.add_argument(
        "path", nargs="?", default=None, help="export: output file (.json); plot: which figure"
    )


@command("trace", "Perfetto export of the stepper; on|off|pull|plot for %%wb cells", _trace_args)
def trace(magics: MagicsState, args: Any) -> Any:
    from workbench.magics.trace_cmds import run_trace

    # Hand-written loops (wb.traced / %wb trace on) when there is no stepper to export.
    if args.action != "export" or getattr(magics, "trace_log", None) is not None:
        return run_trace(magics, args.action, args.path)
    if not args.path:
        raise UsageError("%wb trace export PATH: give the output file (.json)")
    path = current_stepper().export_trace(args.path)
    print(f"workbench: wrote {len(current_stepper().events)} events to {path}")
