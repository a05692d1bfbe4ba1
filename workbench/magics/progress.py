"""A start-up progress bar for notebooks (nothing in a terminal)."""

from __future__ import annotations

from collections.abc import Callable

from IPython import get_ipython

__all__ = ["notebook_progress", "startup_line"]


def startup_line(total: int) -> str:
    """What the bar's output says where no bar can be drawn (see ``notebook_progress``)."""
    return f"workbench: starting {total} engines and their process group"


def notebook_progress(
    total: int,
) -> tuple[Callable[[str, int, int], None] | None, Callable[[], None]]:
    """Return (callback, close). The bar is an ipywidgets IntProgress that closes itself
    when the cluster is ready.

    Its output's plain-text part is a line of text, not the widget's repr
    (``IntProgress(value=0, ...)``): that part is what a reader of a saved notebook sees
    (GitHub, nbviewer, JupyterLab without a kernel: the bar's model is gone once it closed),
    and what nbclient saves and strict nbval compares, the same every run."""
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None, lambda: None
    import ipywidgets as widgets
    from IPython.display import display

    bar = widgets.IntProgress(value=0, min=0, max=2 * total, description="starting")
    bundle = bar._repr_mimebundle_()
    bundle["text/plain"] = startup_line(total)
    display(bundle, raw=True)

    def update(stage: str, done: int, n: int) -> None:
        offset = 0 if stage == "engines" else n
        bar.value = offset + done
        bar.description = stage

    return update, bar.close
