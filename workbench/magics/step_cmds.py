"""``%wb step | plot | trace`` — drive and show the current ``Stepper``."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError

from workbench.errors import ConfigError
from workbench.magics.args import MagicParser, whole_number
from workbench.magics.core import WorkbenchMagics, command

PLOTS = ("memory", "comm", "loss")


def _stepper() -> Any:
    from workbench.ui.stepper import Stepper

    try:
        return Stepper.current()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None


def _step_args(p: MagicParser) -> None:
    p.add_argument("--phase", action="store_true", help="advance by phases, not whole steps")
    p.add_argument(
        "-n", type=whole_number("-n", 1, 1), default=1, help="how many steps (or phases)"
    )


@command("step", "advance the current stepper by steps or phases", _step_args)
def step(magics: WorkbenchMagics, args: Any) -> None:
    stepper = _stepper()
    recovery = stepper.session.last_recovery
    if args.phase:
        stepper.phase(args.n)
    else:
        stepper.step(args.n)
    if stepper.session.last_recovery is not recovery:  # rebuilt after a cluster restart
        print(f"workbench: {stepper.session.last_recovery}")
    for s in stepper.status:
        loss = "-" if s.loss is None else f"{s.loss:.6f}"
        print(f"[rank {s.rank}] step {s.step}, next phase {s.next_phase}, loss {loss}")


def _plot_args(p: MagicParser) -> None:
    p.add_argument("what", choices=PLOTS, help="which figure")


@command("plot", "show the current stepper's memory, comm or loss figure", _plot_args)
def plot(magics: WorkbenchMagics, args: Any) -> Any:
    return _stepper().figures()[args.what]


def _trace_args(p: MagicParser) -> None:
    p.add_argument("action", choices=("export",), help="what to do with the trace")
    p.add_argument("path", help="output file (.json), opens in ui.perfetto.dev")


@command("trace", "export every rank's events as a Perfetto trace", _trace_args)
def trace(magics: WorkbenchMagics, args: Any) -> None:
    path = _stepper().export_trace(args.path)
    print(f"workbench: wrote {len(_stepper().events)} events to {path}")
