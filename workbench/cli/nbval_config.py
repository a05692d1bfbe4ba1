"""``workbench nbval-config``: print the path of the nbval sanitizer the workbench ships.

``pytest --nbval --nbval-sanitize-with "$(python -m workbench nbval-config)" ...`` uses it
alone; ``pytest --nbval --nbval-workbench`` (the plugin) also merges a file of your own.
"""

from __future__ import annotations

import argparse
from typing import Any


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "nbval-config",
        help="print the path of the workbench's nbval sanitizer file",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from workbench.nbval import SANITIZER

    print(SANITIZER)
    return 0
