"""``%wb debug [--rank N]``: pdb on a rank after its cell failed; and the notebook's stdin
answering pdb's prompts on the ranks (``breakpoint()`` in a ``%%wb`` cell or a ``%wb run``
script), as IPython's ``%debug`` answers its own: each prompt is an ``input()`` on the
kernel's stdin, labelled with the rank (``[rank 1] (Pdb)``).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from IPython.core.error import StdinNotImplementedError, UsageError

from workbench.errors import ClusterError, ConfigError, RankError
from workbench.magics.args import MagicParser, whole_number
from workbench.magics.registry import command

if TYPE_CHECKING:  # the magics object is only a parameter here
    from workbench.magics.registry import MagicsState

__all__ = ["NotebookPrompter"]

_NO_STDIN = (
    "this notebook's kernel has no stdin for the cell (it runs under nbclient or nbval, "
    "or the front end does not answer input requests)"
)


class NotebookPrompter:
    """Answers a rank's pdb with the kernel's stdin (``debug_inbox.Prompter``)."""

    def why_not(self) -> str | None:
        from IPython import get_ipython

        kernel = getattr(get_ipython(), "kernel", None)
        if kernel is not None and not getattr(kernel, "_allow_stdin", False):
            return _NO_STDIN
        if kernel is None and not sys.stdin.isatty():  # plain IPython: a terminal types
            return _NO_STDIN
        return None

    def ask(self, rank: int, output: str, prompt: str) -> str | None:
        self.show(rank, output)
        try:
            return input(prompt)
        except (StdinNotImplementedError, EOFError):
            return None

    def show(self, rank: int, output: str) -> None:
        if output:
            print(output, end="" if output.endswith("\n") else "\n", flush=True)


def _debug_args(p: MagicParser) -> None:
    p.add_argument(
        "--rank",
        type=whole_number("--rank", 0, "a rank number"),
        default=None,
        help="the rank to debug (default: the rank whose cell failed first)",
    )


@command(
    "debug",
    "pdb on a rank at the frame where its last %%wb cell or %wb run script failed "
    "(type commands in the input box; q ends)",
    _debug_args,
)
def debug(magics: MagicsState, args: Any) -> None:
    cluster = magics.require_cluster()
    if args.rank is not None and args.rank >= cluster.world_size:
        raise UsageError(
            f"--rank {args.rank} is not valid: this cluster has ranks 0..{cluster.world_size - 1}"
        )
    prompter = NotebookPrompter()
    why = prompter.why_not()
    if why is not None:
        raise UsageError(
            f"%wb debug needs someone to type pdb commands, but {why}. Run it in "
            "JupyterLab or Jupyter Notebook; where there is no stdin, read the failed rank's "
            "traceback, or inspect its namespace with a %%wb --ranks N cell"
        )
    try:
        print(f"workbench: {cluster.debug(args.rank, on_prompt=prompter)}")
    except RankError:  # pdb itself failed on the rank: its traceback says how
        raise
    except (ClusterError, ConfigError) as exc:  # no failed frame there, say which ranks have
        raise UsageError(str(exc)) from None
