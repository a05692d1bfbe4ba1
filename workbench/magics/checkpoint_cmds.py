"""``%wb checkpoint save | load | list`` — checkpoints of the current stepper's run."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

from workbench.errors import CheckpointError, ConfigError
from workbench.magics.args import MagicParser, whole_number
from workbench.magics.registry import command
from workbench.magics.step_cmds import current_stepper

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState

ACTIONS = ("save", "load", "list")


def _checkpoint_args(p: MagicParser) -> None:
    p.add_argument("action", choices=ACTIONS, help="save, load or list checkpoints")
    p.add_argument("--dir", default=None, help="checkpoint root (default: the session's)")
    p.add_argument(
        "--step",
        type=whole_number("--step", 0, "a step number"),
        default=None,
        help="load: which step",
    )
    p.add_argument(
        "--keep-last",
        type=whole_number("--keep-last", 1, "a number of checkpoints"),
        default=None,
        help="save: keep N newest",
    )


@command("checkpoint", "save, load or list checkpoints of the current stepper", _checkpoint_args)
def checkpoint(magics: MagicsState, args: Any) -> Any:
    stepper = current_stepper(running=True)
    try:
        if args.action == "save":
            path = stepper.save(args.dir, keep_last=args.keep_last)
            print(f"workbench: saved step {stepper.session.step_index} to {path}")
        elif args.action == "load":
            meta = stepper.load(args.step, path=args.dir)
            print(
                f"workbench: loaded the checkpoint of step {meta['step']} "
                f"(saved under {meta['strategy']} on {meta['world_size']} ranks)"
            )
        else:
            rows = stepper.checkpoints(args.dir)
            if not rows:
                print("workbench: no checkpoints yet")
            for row in rows:
                print(
                    f"step {row['step']:>5}  {row['strategy']:<8} {row['world_size']} ranks  "
                    + (f"loss {row['last_loss']:.6f}" if row.get("last_loss") is not None else "")
                )
    except (ConfigError, CheckpointError) as exc:
        raise UsageError(str(exc)) from None
    return None
