"""A user's own ``--exclude`` among sbatch options, for a job that adds one of its own.

sbatch keeps only the last ``--exclude``; a spare job under ``spare_hosts="any"`` excludes
the cluster's own and lost nodes, so it must carry the user's too (``spare_hosts.start_args``).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["split_exclude"]


def split_exclude(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """sbatch options without their ``--exclude`` / ``-x``, and the entries those named
    (names or ranges such as ``n[1-3,7]``, split at the commas outside brackets). sbatch
    keeps only the last ``--exclude``, so a job that adds its own merges the user's in."""
    rest: list[str] = []
    lists: list[str] = []
    items = iter(args)
    for arg in items:
        if arg in ("--exclude", "-x"):
            lists.append(next(items, ""))
        elif arg.startswith("--exclude="):
            lists.append(arg.split("=", 1)[1])
        elif arg.startswith("-x"):
            lists.append(arg[2:].removeprefix("="))
        else:
            rest.append(arg)
    return rest, [entry for text in lists for entry in _hostlist_entries(text)]


def _hostlist_entries(text: str) -> list[str]:
    """``a,n[1-3,7],b`` -> ``['a', 'n[1-3,7]', 'b']``: Slurm's hostlist, split where a
    comma is outside brackets."""
    entries, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if char == "," and depth == 0:
            entries.append(text[start:i])
            start = i + 1
    entries.append(text[start:])
    return [e.strip() for e in entries if e.strip()]
