"""A start-up progress bar for notebooks (nothing in a terminal)."""

from __future__ import annotations

from collections.abc import Callable

from IPython import get_ipython

__all__ = ["notebook_progress"]


def notebook_progress(
    total: int,
) -> tuple[Callable[[str, int, int], None] | None, Callable[[], None]]:
    """Return (callback, close). The bar is an ipywidgets IntProgress that closes itself
    when the cluster is ready; its saved output is the same every run (strict nbval)."""
    shell = get_ipython()
    if shell is None or type(shell).__name__ != "ZMQInteractiveShell":
        return None, lambda: None
    import ipywidgets as widgets
    from IPython.display import display

    bar = widgets.IntProgress(value=0, min=0, max=2 * total, description="starting")
    display(bar)

    def update(stage: str, done: int, n: int) -> None:
        offset = 0 if stage == "engines" else n
        bar.value = offset + done
        bar.description = stage

    return update, bar.close
