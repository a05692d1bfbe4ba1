"""A local cluster's controller, started ahead by the workbench kernel.

Run as ``python -P .../warm_controller.py``: imports ipyparallel's controller (~0.6 s of a
local start), then waits for its command line (``workbench.engine.warm_request``) and runs
it as ``python -m ipyparallel.controller ARGS`` would. See warm_start.py.
"""

from __future__ import annotations

import sys


def main() -> None:
    from ipyparallel.controller import app

    from workbench.engine.warm_request import await_request

    args = await_request()
    sys.argv = [sys.argv[0], *args]
    app.main()


if __name__ == "__main__":
    main()
