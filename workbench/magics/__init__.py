"""IPython adapters: ``%wb`` and ``%%wb``. Imported only by ``load_ipython_extension``."""

from __future__ import annotations

from typing import Any

from workbench.magics.core import COMMANDS, WorkbenchMagics

__all__ = ["COMMANDS", "WorkbenchMagics", "load_ipython_extension", "unload_ipython_extension"]

_KEY = "_workbench_magics"


def load_ipython_extension(ipython: Any, import_s: float | None = None) -> None:
    magics = WorkbenchMagics(ipython)
    magics.load_import_s = import_s  # for `%wb start --profile-startup`
    ipython.register_magics(magics)
    # The one write to the shell IPython hands us (tests/test_ownership.py lists it): the
    # magics object lives on its shell, so unload and tests find the one this shell loaded.
    setattr(ipython, _KEY, magics)


def unload_ipython_extension(ipython: Any) -> None:
    magics: WorkbenchMagics | None = getattr(ipython, _KEY, None)
    if magics is not None:  # what %wb start started ends with the extension
        magics.stop_started()
