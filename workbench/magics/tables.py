"""The plain-text lines ``%wb start`` and ``%wb status`` print (one place, so the nbval
sanitizer's rules are tested on exactly what a notebook shows)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["STATUS_COLUMNS", "start_banner", "status_table"]

STATUS_COLUMNS = ("rank", "engine", "host", "pid", "device", "backend", "state")


def start_banner(ranks: Sequence[Any]) -> str:
    """``workbench: 2 ranks on 1 host(s), backend gloo, device cpu``."""
    r0 = ranks[0]
    hosts = len({r.host for r in ranks})
    device = "cuda" if r0.device.startswith("cuda") else "cpu"
    where = f"{len(ranks)} ranks on {hosts} host(s)"
    return f"workbench: {where}, backend {r0.backend}, device {device}"


def status_table(rows: Sequence[dict[str, Any]]) -> str:
    """One line per rank under a header, columns padded to their widest cell."""
    widths = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in STATUS_COLUMNS}
    lines = ["  ".join(c.ljust(widths[c]) for c in STATUS_COLUMNS)]
    lines += ["  ".join(str(row[c]).ljust(widths[c]) for c in STATUS_COLUMNS) for row in rows]
    return "\n".join(lines)
